"""The project over Spark Connect: a Connect server (its own JVM, running ``local[2]``)
and clients in subprocesses that run no JVM at all.

What works: the operator in frames mode, rows mode and with a pre-keyed main input, the
``dsi_delta`` source (batch and streaming), the Delta IO manager, and the example
pipeline end to end through Dagster. What Connect lacks, the project names: there is no
SparkContext in a Connect client (``SparkResource.spark_context``), a Connect session
can change runtime SQL settings only, and an unreachable server fails fast instead of
being retried for minutes.
"""

import time
from collections.abc import Iterator

import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs.core.spark import connect as spark_connect
from dagster_sideinputs.core.spark.connect import connect_endpoint
from dagster_sideinputs.core.spark.session import REQUIRED_CONFIGS
from tests.cluster import (
    ConnectServer,
    assert_demo_matches_local_run,
    check,
    free_port,
    run_delta_client,
    run_operator_client,
    run_probe,
)

# --- without a server ------------------------------------------------------------------------


def test_connect_url_gives_host_and_default_port():
    assert connect_endpoint("sc://10.0.0.5:16000/;token=abc") == ("10.0.0.5", 16000)
    assert connect_endpoint("sc://spark.internal") == ("spark.internal", 15002)


def test_unreachable_connect_server_fails_within_seconds_naming_the_url():
    url = f"sc://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(
        dsi.errors.SparkStartupError, match="No Spark Connect server answers"
    ) as info:
        dsi.build_spark_session(remote=url)
    assert time.monotonic() - started < 15
    assert url in info.value.message
    assert "SparkConnectServer" in str(info.value.fix)


def test_missing_connect_client_says_what_to_install(monkeypatch):
    def no_client(name: str) -> None:
        raise ImportError(f"No module named 'grpc' (importing {name})")

    monkeypatch.setattr(spark_connect.importlib, "import_module", no_client)
    with pytest.raises(
        dsi.errors.SparkStartupError, match="needs the Spark Connect client"
    ) as info:
        dsi.build_spark_session(remote="sc://127.0.0.1:15002")
    assert 'pip install "pyspark[connect]==4.1.*"' in str(info.value.fix)


def test_spark_context_of_a_connect_resource_says_connect_has_none():
    resource = dsi.SparkResource(remote="sc://127.0.0.1:15002")
    with pytest.raises(dsi.DeclarationError, match="Spark Connect has no SparkContext") as info:
        _ = resource.spark_context
    assert "use spark_session" in str(info.value.fix)


# --- against a Connect server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ConnectServer]:
    with ConnectServer(tmp_path_factory.mktemp("connect-server"), master="local[2]") as running:
        yield running


@pytest.fixture(scope="module")
def client_report(server, tmp_path_factory) -> dict:
    """What ``tests/operator_client.py`` found, run once against the server."""
    return run_operator_client(tmp_path_factory.mktemp("connect-client"), remote=server.url)


def needs_server(test):
    """Marks a test that starts the Connect server (slow: a JVM, then the checks). Tier 3
    keeps one Connect server in the default suite, the one users start (``make dev``, with
    Delta: tests/delta/test_delta_connect.py); this bridge-only server's tests are
    ``make test-extended``'s."""
    return pytest.mark.extended(pytest.mark.connect(pytest.mark.slow(test)))


@needs_server
def test_connect_client_runs_no_jvm_and_its_tasks_run_in_the_server(server, tmp_path):
    report = run_probe(tmp_path, remote=server.url)
    assert report["session"].startswith("pyspark.sql.connect")
    assert not [child for child in report["driver_children"] if "java" in child]
    assert server.process is not None
    for task in report["tasks"]:
        ancestors = {pid for pid, _ in task["ancestors"]}
        assert server.process.pid in ancestors
        assert report["driver_pid"] not in ancestors


@needs_server
def test_connect_session_has_the_bridge_settings_and_the_asked_shuffle_partitions(client_report):
    assert client_report["session"] == "pyspark.sql.connect.session"
    assert client_report["shuffle_partitions"] == "3"
    assert client_report["required"] == dict(REQUIRED_CONFIGS)


@needs_server
def test_frames_mode_operator_works_over_connect(client_report):
    expected = check(client_report, "inputs")
    value = check(client_report, "frames_mode")
    assert client_report["engine"] == "delta-rs bridge"  # this server has no Delta
    assert value == {
        "engine": client_report["engine"],
        "enriched": 200,
        "big": expected["big"],
        "named": expected["named"],
        "plan_recorded": True,
        "second_run_batches": 0,
    }


@needs_server
def test_rows_mode_operator_works_over_connect(client_report):
    expected = check(client_report, "inputs")
    # Two outputs of the same fields: under the bridge (tables on the filesystem every
    # process shares) the executors write both in one pass and the driver renames the
    # files; delta-spark writes each from the cached records.
    bridge = client_report["engine"] == "delta-rs bridge"
    wanted = {"rows": 200, "named": expected["named"], "big": expected["big"]}
    assert check(client_report, "rows_mode") == {**wanted, "one_pass": bridge}
    assert check(client_report, "rows_mode_bridge") == {**wanted, "one_pass": True}


@needs_server
def test_pre_keyed_main_input_is_read_as_buckets_over_connect(client_report):
    value = check(client_report, "pre_keyed")
    assert value["rows"] == 200
    assert "pre-keyed: main files read as buckets (no shuffle)" in value["notes"]
    assert value["both_rows"] == 200
    assert "side input 'profile': read as key-group buckets (no shuffle)" in value["both_notes"]


@needs_server
def test_delta_source_reads_batch_and_stream_over_connect(client_report):
    assert check(client_report, "delta_source") == {"batch": 200, "stream": 200}


@needs_server
def test_spark_context_over_connect_is_a_declaration_error_naming_connect(client_report):
    outcome = client_report["resource_spark_context"]
    assert outcome["error"] == "DeclarationError"
    assert "Spark Connect has no SparkContext" in outcome["message"]


@needs_server
def test_static_setting_refused_by_the_connect_server_is_a_startup_error(client_report):
    outcome = client_report["static_setting"]
    assert outcome["error"] == "SparkStartupError"
    assert "spark.executor.memory='3g'" in outcome["message"]
    assert "only runtime SQL settings" in outcome["message"]
    assert "--conf spark.executor.memory=3g" in outcome["message"]


@needs_server
def test_delta_true_against_a_server_without_delta_says_how_to_start_it(server, tmp_path):
    report = run_delta_client(server.url, tmp_path / "t", delta=True)
    assert report.get("error") == "SparkStartupError", report
    assert "runs without Delta Lake" in report["message"]
    assert "--packages io.delta:delta-spark_4.1_2.13:4.4.0" in report["message"]


@needs_server
def test_delta_auto_against_a_server_without_delta_connects_without_it(server, tmp_path):
    report = run_delta_client(server.url, tmp_path / "t", delta="auto")
    assert report.get("session") == "pyspark.sql.connect.session", report
    assert report["delta"] is False


@needs_server
@pytest.mark.extended  # the operator over Connect: tests/delta/test_delta_connect.py
def test_payments_pipeline_over_connect_writes_what_a_local_run_writes(
    server, tmp_path, tmp_path_factory
):
    assert_demo_matches_local_run(tmp_path / "connect-run", tmp_path_factory, remote=server.url)
