"""Row mode writes outputs that share their fields in one pass: one Spark job splits the
function's records by tag into every output table's staging folder (the bridge on a local
filesystem; delta-spark and object stores persist the tagged result and write each table
from it). Either way the tables hold the same rows, exactly once."""

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.conftest import table_files
from tests.core.conftest import Lake
from tests.core.test_crash_safety import CrashingEngine, InjectedCrash

DELTA_ENGINES = ("rs", "spark")

TX = "tx_id long, customer_id long, amount double"
FIELDS = T.StructType([T.StructField("tx_id", T.LongType()), T.StructField("name", T.StringType())])
ENRICHED = dsi.OutputTag("enriched", schema=FIELDS)
BIG = dsi.OutputTag("big", schema=FIELDS)
ONE_PASS = "written in one pass"


def enrich(record, ctx):
    profile = ctx.side_input("profile")
    out = {"tx_id": record.tx_id, "name": profile.name if profile else None}
    if record.amount > 100:
        ctx.output(BIG, out)
    yield out


def operator(lake, fn=enrich, storage=None):
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=fn,
        mode="rows",
        main_output=ENRICHED,
        side_outputs=[BIG],
        **({"storage": storage} if storage is not None else {}),
    )


def fill(lake, rows=((1, 10, 50.0), (2, 11, 500.0), (3, 12, 900.0))):
    if not lake.exists("profiles"):
        lake.append("profiles", [(10, "ann"), (11, "bob")], "customer_id long, name string")
    lake.append("transactions", list(rows), TX)


def one_pass(result: dsi.RunResult) -> bool:
    return any(ONE_PASS in note for batch in result.batches for note in batch.notes)


def stray_files(lake, *names: str) -> dict[str, set[str]]:
    """Files of each table that no commit references (staged, moved and left behind)."""
    found = {}
    for name in names:
        uri = lake.storage.table_uri(name)
        live = {f.path for f in lake.engine.snapshot(uri).files}
        found[name] = {p for p in table_files(uri) if p not in live and not p.endswith(".crc")}
    return found


def test_outputs_sharing_their_fields_are_split_by_one_job_into_their_tables(lake):
    fill(lake)
    first = lake.run(operator(lake))
    assert one_pass(first) == (lake.engine_id == "rs")
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert lake.rows("big") == [(2, "bob"), (3, None)]
    fill(lake, [(4, 10, 700.0), (5, 11, 1.0)])
    second = lake.run(operator(lake))  # both tables exist now: appended as they are
    assert one_pass(second) == (lake.engine_id == "rs")
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None), (4, "ann"), (5, "bob")]
    assert lake.rows("big") == [(2, "bob"), (3, None), (4, "ann")]
    if lake.engine_id == "rs":  # (delta-spark leaves an empty task's 0-row file unreferenced)
        assert stray_files(lake, "enriched", "big") == {"enriched": set(), "big": set()}
    for name in ("enriched", "big"):  # each table's files at its root, no split folders
        paths = {f.path for f in lake.engine.snapshot(lake.storage.table_uri(name)).files}
        assert paths
        assert all("/" not in path for path in paths), paths


def test_an_output_the_function_leaves_empty_is_still_created_empty(lake):
    fill(lake, [(1, 10, 5.0)])
    lake.run(operator(lake))
    assert lake.rows("enriched") == [(1, "ann")]
    assert lake.exists("big")
    assert lake.rows("big") == []


def test_a_table_taking_the_fields_in_another_order_is_written_on_its_own(lake):
    fill(lake)
    lake.append("big", [("old", 0)], "name string, tx_id long")
    result = lake.run(operator(lake))
    assert not one_pass(result)
    assert lake.rows("big", "tx_id", "name") == [(0, "old"), (2, "bob"), (3, None)]
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]


def test_a_failing_function_in_the_split_job_commits_and_leaves_nothing(lake):
    fill(lake)
    lake.run(operator(lake))
    fill(lake, [(4, 10, 700.0), (5, 11, 1.0)])

    def fails_on_five(record, ctx):
        if record.tx_id == 5:
            raise ValueError("bad record")
        yield from enrich(record, ctx)

    with pytest.raises(dsi.FunctionError, match="bad record") as raised:
        lake.run(operator(lake, fn=fails_on_five))
    assert "nothing" in str(raised.value).lower()
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,)]
    assert lake.rows("big", "tx_id") == [(2,), (3,)]
    if lake.engine_id == "rs":
        assert stray_files(lake, "enriched", "big") == {"enriched": set(), "big": set()}
    lake.run(operator(lake))  # fixed: the batch goes through, once
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,), (4,), (5,)]
    assert lake.rows("big", "tx_id") == [(2,), (3,), (4,)]


def test_a_not_null_column_of_one_table_refuses_the_batch_for_every_table(spark, tmp_path):
    lake = Lake(spark, dsi.DeltaStorage(str(tmp_path), engine="delta-rs"))  # it splits
    fill(lake)
    not_null = pa.schema([pa.field("tx_id", pa.int64()), pa.field("name", pa.string(), False)])
    write_deltalake(lake.storage.table_uri("big"), not_null.empty_table(), mode="append")
    with pytest.raises(dsi.SideInputError, match="NOT NULL"):
        lake.run(operator(lake))  # tx 3 has no profile (a null name) and is big
    assert lake.rows("enriched") == []
    assert lake.rows("big") == []
    assert stray_files(lake, "big") == {"big": set()}
    assert table_files(lake.storage.table_uri("enriched")) == set()


def test_a_crash_between_the_two_commits_is_replayed_exactly_once(lake):
    fill(lake)
    crashing = CrashingEngine(lake.engine, crash_after=1)
    with pytest.raises(InjectedCrash):
        lake.run(operator(lake, storage=lake.with_engine(crashing)))
    assert crashing.log == [lake.storage.table_uri("enriched")]
    result = lake.run(operator(lake))
    assert result.batches[0].replayed
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert lake.rows("big") == [(2, "bob"), (3, None)]
