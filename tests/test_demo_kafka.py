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

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


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
