"""Delta Lake over Spark Connect: a Connect server started with Delta's jar, extension and
catalog, and clients (subprocesses, no JVM) that see it through ``spark.conf``.

Delta's Connect server plugin (``io.delta:delta-connect-server_4.1_2.13``, for the
``DeltaTable`` Python API over Connect) is not served by the Maven repository this
project can reach (404 for 4.4.0, no maven-metadata.xml), so the server has delta-spark
only: DataFrame reads and writes in ``format("delta")`` and Delta SQL (MERGE, DESCRIBE
HISTORY, VACUUM) work; ``DeltaTable`` over Connect does not. The native engine needs
nothing more: over Connect it uses only those (no ``DeltaTable``; its one py4j fast path,
delta/spark/direct.py, is for classic sessions), so the operator runs over Connect with it.
"""

import pytest

from tests.cluster import check, run_delta_client, run_operator_client

pytestmark = [pytest.mark.connect, pytest.mark.slow]

# ``connect_server`` (tests/conftest.py): the server ``make dev`` starts, warmed up as
# ``make dev`` does it; the session's, shared with the other modules that attach to one.


def test_connect_client_sees_delta_and_writes_merges_and_reads_a_delta_table(
    connect_server, tmp_path
):
    report = run_delta_client(connect_server.url, tmp_path / "t", delta=True)
    assert report.get("session") == "pyspark.sql.connect.session", report
    assert report["delta"] is True
    assert report["rows"] == [0, 1, 2, 7]
    assert report["history"] == [[1, "MERGE"], [0, "WRITE"]]


@pytest.fixture(scope="module")
def client_report(connect_server, tmp_path_factory) -> dict:
    """``tests/operator_client.py`` against the Delta server (engine ``auto``)."""
    return run_operator_client(tmp_path_factory.mktemp("delta-client"), remote=connect_server.url)


def test_operator_over_connect_uses_delta_spark_and_its_commits_carry_transactions(
    client_report,
):
    assert client_report["session"] == "pyspark.sql.connect.session"
    assert client_report["engine"] == "delta-spark"
    expected = check(client_report, "inputs")
    frames = check(client_report, "frames_mode")
    assert frames["engine"] == "delta-spark"
    assert (frames["enriched"], frames["big"], frames["named"]) == (
        200,
        expected["big"],
        expected["named"],
    )
    assert frames["second_run_batches"] == 0
    commits = check(client_report, "native_commits")
    assert commits["operations"] == ["WRITE"]
    assert "Delta-Lake/" in commits["engine_info"]
    assert commits["rows"] == 200
    assert commits["transaction"] == 0


def test_rows_mode_and_pre_keyed_inputs_work_over_connect_with_delta_spark(client_report):
    expected = check(client_report, "inputs")
    assert check(client_report, "rows_mode") == {
        "rows": 200,
        "named": expected["named"],
        "big": expected["big"],
        "one_pass": False,  # delta-spark writes each output from the cached records
    }
    assert check(client_report, "pre_keyed")["rows"] == 200
