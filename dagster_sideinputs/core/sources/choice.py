"""Which source a declaration's main input reads."""

from dagster_sideinputs.core.sources.delta_table import DeltaTableSource
from dagster_sideinputs.core.sources.kafka.source import KafkaSource
from dagster_sideinputs.core.sources.landing import LandingFolder
from dagster_sideinputs.core.sources.main_source import MainSource
from dagster_sideinputs.core.spec import OperatorSpec


def source_for(spec: OperatorSpec) -> MainSource:
    """The main input's source: a Kafka topic, a landing folder or a Delta table."""
    if spec.main.kind == "kafka":
        return KafkaSource(spec)
    return LandingFolder(spec) if spec.main.kind == "files" else DeltaTableSource(spec)
