"""dagster-sideinputs: side inputs, side outputs and pre-keyed streams for PySpark.

Orchestrated by Dagster, stored in Delta Lake. The core (declarations, the operator,
the Delta bridge) imports no Dagster; the Dagster layer builds on it and is loaded
on first use of one of its names, so plain PySpark programs never import Dagster.

Examples:
    >>> import dagster_sideinputs as dsi
    >>> dsi.SideInput.map("customer_profiles", key="customer_id")
    SideInput.map('customer_profiles', key='customer_id')
"""

import importlib
from typing import Any

from dagster_sideinputs.core.declarations import BufferLimits, KeyGroups, MainInput
from dagster_sideinputs.core.metrics import BatchMetrics, RunResult
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.options import OperatorOptions
from dagster_sideinputs.core.outputs import MAIN, Outputs, OutputTag, SideInputs
from dagster_sideinputs.core.records import Record
from dagster_sideinputs.core.rows import RowContext
from dagster_sideinputs.core.sideinputs.as_of import AsOf
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.readiness import Decision, DeltaReadiness, ReadinessProvider
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.core.sources.kafka.declaration import SPARK_KAFKA_PACKAGE, KafkaInput
from dagster_sideinputs.core.spark.packages import S3A_PACKAGES
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.engine import AppTransaction, DeltaEngine, WriteResult
from dagster_sideinputs.delta.reader import read_changes, read_table
from dagster_sideinputs.delta.s3 import S3Store
from dagster_sideinputs.delta.source import register_delta_source
from dagster_sideinputs.delta.storage import DeltaRsEngine, DeltaStorage
from dagster_sideinputs.delta.writer import write_dataframe
from dagster_sideinputs.errors import (
    BufferLimitExceededError,
    ConcurrentWriteError,
    CorruptDataFileError,
    DeclarationError,
    DeltaTableError,
    DuplicateKeyError,
    EmptySingletonError,
    FunctionError,
    KafkaOffsetsLostError,
    KafkaSourceError,
    MainInputDataError,
    MissingSideColumnError,
    NonAppendOnlyChangeError,
    NotADeltaTableError,
    OperatorBusyError,
    OperatorStateError,
    PreKeyedViolationError,
    SchemaMismatchError,
    SideInputDataError,
    SideInputError,
    SingletonCardinalityError,
    SparkJobError,
    SparkStartupError,
    StorageError,
    TableNotFoundError,
    UndeclaredOutputTagError,
    UnsupportedTableFeatureError,
)

# The Dagster layer, imported lazily (PEP 562) so that the core stays Dagster-free.
_DAGSTER_LAYER = {
    "DagsterReadiness": "dagster_sideinputs.dagster_layer.readiness",
    "DeltaIOManager": "dagster_sideinputs.dagster_layer.io_manager",
    "SideInputPipeline": "dagster_sideinputs.dagster_layer.component",
    "SparkResource": "dagster_sideinputs.dagster_layer.resources",
    "build_replay_job": "dagster_sideinputs.dagster_layer.job",
    "build_side_input_checks": "dagster_sideinputs.dagster_layer.checks",
    "build_side_input_job": "dagster_sideinputs.dagster_layer.job",
    "build_side_input_sensor": "dagster_sideinputs.dagster_layer.sensor",
    "kafka_topic_asset": "dagster_sideinputs.dagster_layer.kafka",
    "side_input_assets": "dagster_sideinputs.dagster_layer.assets",
}


def __getattr__(name: str) -> Any:
    module = _DAGSTER_LAYER.get(name)
    if module is None:
        raise AttributeError(f"module 'dagster_sideinputs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The Dagster layer's names too: `dg list components` finds SideInputPipeline
    # through dir() (the entry point `dagster_dg_cli.registry_modules` names this package).
    return sorted({*globals(), *_DAGSTER_LAYER})


__version__ = "0.1.0"

__all__ = [
    "MAIN",
    "S3A_PACKAGES",
    "SPARK_KAFKA_PACKAGE",
    "AppTransaction",
    "AsOf",
    "BatchMetrics",
    "BufferLimitExceededError",
    "BufferLimits",
    "ConcurrentWriteError",
    "CorruptDataFileError",
    "DagsterReadiness",
    "Decision",
    "DeclarationError",
    "DeltaEngine",
    "DeltaIOManager",
    "DeltaReadiness",
    "DeltaRsEngine",
    "DeltaStorage",
    "DeltaTableError",
    "DuplicateKeyError",
    "EmptySingletonError",
    "FunctionError",
    "KafkaInput",
    "KafkaOffsetsLostError",
    "KafkaSourceError",
    "KeyGroups",
    "MainInput",
    "MainInputDataError",
    "MissingSideColumnError",
    "NonAppendOnlyChangeError",
    "NotADeltaTableError",
    "OperatorBusyError",
    "OperatorOptions",
    "OperatorStateError",
    "OutputTag",
    "Outputs",
    "PreKeyedViolationError",
    "ReadinessProvider",
    "Record",
    "RowContext",
    "RunResult",
    "S3Store",
    "SchemaMismatchError",
    "SideInput",
    "SideInputDataError",
    "SideInputError",
    "SideInputOperator",
    "SideInputPipeline",
    "SideInputs",
    "SingletonCardinalityError",
    "SparkJobError",
    "SparkResource",
    "SparkStartupError",
    "StorageError",
    "TableNotFoundError",
    "UndeclaredOutputTagError",
    "UnsupportedTableFeatureError",
    "Window",
    "WriteResult",
    "build_replay_job",
    "build_side_input_checks",
    "build_side_input_job",
    "build_side_input_sensor",
    "build_spark_session",
    "kafka_topic_asset",
    "read_changes",
    "read_table",
    "register_delta_source",
    "side_input_assets",
    "write_dataframe",
]
