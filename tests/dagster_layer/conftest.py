"""One real webserver on the example code location, shared by the GraphQL and browser tests.

Its story is built by fixtures, run once and in order: the side inputs and two batches of
transactions, one of this hour (some by customers without a profile yet) and one of the
previous hour (whose FX partition is not there yet); a first run of the operator, which
buffers what waits; the missing profiles and FX partition, and the run releasing what
waited; a run with nothing to do; a replay; and the checks executed on their own.
"""

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from assets.payments import FX_START, hourly
from dagster_sideinputs.core.spark.connect_server import LocalConnectServer
from tests.dagster_layer.webserver import ASSET_JOB, Webserver, serve

OPERATOR_JOB = "payments_enrichment_job"
MAIN_OUTPUT = "enriched_transactions"
# The FX partitions materialized, and the hour of the transactions: fixed when the module
# is imported, so that a session crossing the hour boundary stays consistent.
PREVIOUS_HOUR, THIS_HOUR = hourly.get_partition_keys()[-2:]
UNKNOWN_SHARE = 0.05  # transactions by customers whose profile arrives later


def transactions_config(count: int, hours_back: int = 0, unknown: float = UNKNOWN_SHARE) -> dict:
    hour = dt.datetime.strptime(THIS_HOUR, hourly.fmt).replace(tzinfo=dt.timezone.utc)
    config = {
        "count": count,
        "hour": hour.isoformat(),
        "hours_back": hours_back,
        "unknown_customer_share": unknown,
    }
    return {"ops": {"transactions": {"config": config}}}


@dataclass(frozen=True)
class Story:
    """The webserver and the run ids of the story so far."""

    server: Webserver
    runs: dict[str, str]


@pytest.fixture(scope="session")
def webserver(tmp_path_factory, connect_server: LocalConnectServer) -> Iterator[Webserver]:
    """``dagster-webserver -w workspace.yaml`` on a fresh instance, lake and port, its runs
    attached to a Spark Connect server with Delta, as ``make dev`` serves the example: a
    run opens a session in seconds instead of starting a JVM."""
    root = tmp_path_factory.mktemp("webserver")
    # The same FX partitions as this process sees, even across midnight.
    env = {"DSI_FX_START": FX_START, "DSI_SPARK_REMOTE": connect_server.url}
    with serve(root, env) as server:
        yield server


@pytest.fixture(scope="session")
def sources(webserver: Webserver) -> Webserver:
    """Profiles, fraud rules, this hour's FX rates; 500 transactions of this hour (5% by
    unknown customers), then 200 of the previous hour (no unknown customers). The
    unpartitioned assets and an hourly partition of ``fx_rates`` go in one run (each run is
    a process: fewer runs, a shorter story)."""
    webserver.run(
        ASSET_JOB,
        ["fraud_rules", "customer_profiles", "transactions", "fx_rates"],
        run_config=transactions_config(500),  # the code location's executor is in-process
        tags={"dagster/partition": THIS_HOUR},
    )
    webserver.run(
        ASSET_JOB, ["transactions"], run_config=transactions_config(200, hours_back=1, unknown=0)
    )
    return webserver


@pytest.fixture(scope="session")
def story(sources: Webserver) -> Story:
    """Every run of the story, in order (see the module docstring)."""
    server = sources
    runs = {"first": server.run(OPERATOR_JOB)}
    server.run(
        ASSET_JOB,
        ["customer_profiles", "fx_rates"],
        run_config={"ops": {"customer_profiles": {"config": {"extra_customers": 60}}}},
        tags={"dagster/partition": PREVIOUS_HOUR},
    )
    runs["release"] = server.run(OPERATOR_JOB)
    runs["idle"] = server.run(OPERATOR_JOB)
    runs["replay"] = server.run("replay_unmatched_transactions_job")
    runs["checks"] = server.run(
        ASSET_JOB,
        checks=[(MAIN_OUTPUT, "buffer_within_limits"), (MAIN_OUTPUT, "side_inputs_ready")],
    )
    return Story(server, runs)
