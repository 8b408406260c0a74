"""The tests' lake helper (tests/core/conftest.py): which library writes a test's input
rows, and that the operator reads them whichever wrote them."""

import deltalake
import pytest
from pyspark.sql.types import VariantVal

from tests.core.conftest import Lake

TX = "tx_id long, customer_id long, amount double"


def writer(lake: Lake, name: str) -> str:
    """Who wrote a table's latest commit: ``delta-rs`` or ``delta-spark``."""
    [commit] = deltalake.DeltaTable(lake.storage.table_uri(name)).history(1)
    return "delta-rs" if "delta-rs" in str(commit.get("clientVersion", "")) else "delta-spark"


def test_a_plain_append_under_delta_spark_is_written_by_delta_rs_and_read_by_spark(lake):
    rows = [(1, 10, 5.0), (2, None, 6.5)]
    lake.append("transactions", rows, TX)
    nested = "id long, attrs map<string,double>, tags array<string>, at timestamp, day date"
    lake.append("nested", [(1, {"a": 1.5}, ["x"], None, None)], nested)
    if lake.engine_id == "spark":  # (the bridge commits with delta-rs anyway)
        assert (writer(lake, "transactions"), writer(lake, "nested")) == ("delta-rs",) * 2
    assert lake.rows("transactions") == sorted(rows, key=repr)
    assert lake.rows("nested", "id", "tags") == [(1, ["x"])]


def test_an_append_with_options_or_a_type_delta_rs_stores_otherwise_goes_through_the_engine(
    lake,
):
    lake.append("transactions", [(1, 10, 5.0)], TX)
    lake.overwrite("transactions", [(2, 11, 6.0)], TX)  # options: the engine decides
    assert lake.rows("transactions") == [(2, 11, 6.0)]
    if lake.engine_id == "spark":
        assert writer(lake, "transactions") == "delta-spark"
        # Arrow would make a variant a struct of binaries: Spark writes it.
        lake.append("docs", [(1, VariantVal.parseJson('{"a": 1}'))], "id long, doc variant")
        assert writer(lake, "docs") == "delta-spark"
        assert [str(r.doc) for r in lake.frame("docs").collect()] == ['{"a":1}']


def test_a_mismatched_append_is_refused_as_the_engine_refuses_it(lake):
    lake.append("transactions", [(1, 10, 5.0)], TX)
    # delta-rs refuses it without a commit, then the engine refuses it with its own error
    # (the bridge's append_rows would have merged the new column in).
    with pytest.raises(Exception, match=r"(?i)schema|column"):
        lake.append("transactions", [(2, 11, 6.0, "x")], TX + ", note string")
    assert lake.rows("transactions") == [(1, 10, 5.0)]
