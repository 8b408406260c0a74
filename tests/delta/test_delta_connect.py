"""Delta Lake over Spark Connect: a Connect server started with Delta's jar, extension and
catalog, and clients (subprocesses, no JVM) that see it through ``spark.conf``.

Delta's Connect server plugin (``delta-connect-server``, for ``DeltaTable`` over
Connect) is not served by the Maven repository this project can reach, so the server has
delta-spark only: DataFrame reads and writes in ``format("delta")`` and Delta SQL (MERGE,
DESCRIBE HISTORY) work; the ``DeltaTable`` Python API over Connect does not.
"""

from collections.abc import Iterator

import pytest

from dagster_sideinputs.delta.spark_setup import (
    CATALOG_KEY,
    DELTA_CATALOG,
    DELTA_SQL_EXTENSION,
    EXTENSIONS_KEY,
    delta_package,
)
from tests.cluster import ConnectServer, run_delta_client

pytestmark = [pytest.mark.connect, pytest.mark.slow]


@pytest.fixture(scope="module")
def delta_server(tmp_path_factory) -> Iterator[ConnectServer]:
    server = ConnectServer(
        tmp_path_factory.mktemp("delta-connect-server"),
        master="local[1]",
        packages=[delta_package()],
        confs={EXTENSIONS_KEY: DELTA_SQL_EXTENSION, CATALOG_KEY: DELTA_CATALOG},
    )
    with server as running:
        yield running


def test_connect_client_sees_delta_and_writes_merges_and_reads_a_delta_table(
    delta_server, tmp_path
):
    report = run_delta_client(delta_server.url, tmp_path / "t", delta=True)
    assert report.get("session") == "pyspark.sql.connect.session", report
    assert report["delta"] is True
    assert report["rows"] == [0, 1, 2, 7]
    assert report["history"] == [[1, "MERGE"], [0, "WRITE"]]
