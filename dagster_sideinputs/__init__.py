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

from dagster_sideinputs import errors as errors
from dagster_sideinputs import tables as tables
from dagster_sideinputs.core.declarations import BufferLimits, KeyGroups, MainInput
from dagster_sideinputs.core.functions import RowContext
from dagster_sideinputs.core.metrics import BatchMetrics, RunResult
from dagster_sideinputs.core.operator import SideInputOperator
from dagster_sideinputs.core.outputs import MAIN, Outputs, OutputTag, Routes, SideInputs
from dagster_sideinputs.core.records import Record
from dagster_sideinputs.core.sideinputs.as_of import AsOf
from dagster_sideinputs.core.sideinputs.declaration import SideInput, Wait
from dagster_sideinputs.core.sideinputs.readiness import Decision, DeltaReadiness, ReadinessProvider
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.delta.store.s3 import S3Store
from dagster_sideinputs.deprecations import warn_moved
from dagster_sideinputs.errors import (
    DeclarationError,
    OperatorBusyError,
    SideInputError,
    StorageError,
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

_MOVED_ERRORS = (
    "BufferLimitExceededError", "ConcurrentWriteError", "CorruptDataFileError",
    "DeltaTableError", "DuplicateKeyError", "EmptySingletonError", "FunctionError",
    "KafkaOffsetsLostError", "KafkaSourceError", "MainInputDataError",
    "MissingSideColumnError", "NonAppendOnlyChangeError", "NotADeltaTableError",
    "OperatorStateError", "PreKeyedViolationError", "SchemaMismatchError",
    "SideInputDataError", "SingletonCardinalityError", "SparkJobError", "SparkStartupError",
    "TableNotFoundError", "UndeclaredOutputTagError", "UnsupportedTableFeatureError",
)  # fmt: skip
# Names this package's top level held before 0.2: (where the value is, the new spelling).
# They still work for one release and warn once each (DeprecationWarning).
_MOVED: dict[str, tuple[str, str]] = {
    **{n: ("dagster_sideinputs.errors", f"dagster_sideinputs.errors.{n}") for n in _MOVED_ERRORS},
    **{
        n: ("dagster_sideinputs.tables", f"dagster_sideinputs.tables.{n}")
        for n in (
            "AppTransaction",
            "WriteResult",
            "read_changes",
            "read_table",
            "register_delta_source",
            "write_dataframe",
        )
    },
    "DeltaEngine": (
        "dagster_sideinputs.delta.engine",
        "dagster_sideinputs.delta.engine.DeltaEngine",
    ),
    "DeltaRsEngine": (
        "dagster_sideinputs.delta.bridge.engine",
        'DeltaStorage(..., engine="delta-rs")',
    ),
    "OperatorOptions": ("dagster_sideinputs.core.options", "SideInputOperator(...)'s keywords"),
    "KafkaInput": ("dagster_sideinputs.core.sources.kafka.declaration", "MainInput.kafka(...)"),
    "S3A_PACKAGES": ("dagster_sideinputs.core.spark.packages", 'packages=["s3"]'),
    "SPARK_KAFKA_PACKAGE": (
        "dagster_sideinputs.core.sources.kafka.declaration",
        'packages=["kafka"]',
    ),
}


def __getattr__(name: str) -> Any:
    module = _DAGSTER_LAYER.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'dagster_sideinputs' has no attribute {name!r}")
    module, spelling = moved
    warn_moved(f"dagster_sideinputs.{name}", spelling, stacklevel=2)
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    # The Dagster layer's names too: `dg list components` finds SideInputPipeline
    # through dir() (the entry point `dagster_dg_cli.registry_modules` names this package).
    return sorted({*globals(), *_DAGSTER_LAYER})


__version__ = "0.1.0"

# Grouped by concern, in the order of docs/api.md's sections (tests/test_api.py).
__all__ = [  # noqa: RUF022 (grouped by concern, not sorted)
    # Declarations
    "MAIN",
    "AsOf",
    "BufferLimits",
    "KeyGroups",
    "MainInput",
    "OutputTag",
    "Routes",
    "SideInput",
    "Wait",
    "Window",
    # What the function gets and returns
    "Outputs",
    "Record",
    "RowContext",
    "SideInputs",
    # The operator
    "BatchMetrics",
    "RunResult",
    "SideInputOperator",
    # Readiness
    "Decision",
    "DeltaReadiness",
    "ReadinessProvider",
    # Storage and Spark
    "DeltaStorage",
    "S3Store",
    "build_spark_session",
    # Dagster
    "DagsterReadiness",
    "DeltaIOManager",
    "SideInputPipeline",
    "SparkResource",
    "build_replay_job",
    "build_side_input_checks",
    "build_side_input_job",
    "build_side_input_sensor",
    "kafka_topic_asset",
    "side_input_assets",
    # Errors (all of them: dagster_sideinputs.errors)
    "DeclarationError",
    "OperatorBusyError",
    "SideInputError",
    "StorageError",
]
