"""The example pipeline with its transactions in Kafka (``make demo-kafka``) gives the
same outputs as the pipeline reading them from Delta (``make demo``).

Both run ``python -m assets.demo`` in subprocesses with the session's seed and hour; the
Kafka run starts its own broker. Slow: the pipeline twice, a broker, a JVM each.
"""

import pytest

from tests.cluster import (
    DEMO_HOUR,
    DEMO_SEED,
    DEMO_TIMEOUT_S,
    assert_same_pipeline_outputs,
    local_reference,
    run_demo,
)

# Extended (CI's time): the Kafka main input runs end to end through Dagster in the
# default suite too (tests/dagster_layer/test_kafka_assets.py), with SIGKILLs at each step
# of a batch (tests/core/test_kafka_crash.py).
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.extended]


def test_demo_reading_kafka_gives_the_outputs_of_the_demo_reading_delta(tmp_path, tmp_path_factory):
    reference = local_reference(tmp_path_factory)
    run = run_demo(
        tmp_path,
        seed=DEMO_SEED,
        hour=DEMO_HOUR,
        timeout_seconds=DEMO_TIMEOUT_S,
        extra_args=["--kafka"],
    )
    log = run.log.read_text()
    assert "transactions (Kafka topic)" in log
    assert not (run.lake / "transactions").exists()
    assert_same_pipeline_outputs(reference.result().lake, run.lake, actual_has_inputs=False)
