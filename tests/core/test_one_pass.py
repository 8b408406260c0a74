"""Outputs written in one pass: one Spark job splits the rows by tag into every output
table's staging folder (local tables, either engine; object stores write each table with
its own job). Row mode does it for outputs
that share their fields; frames mode for outputs that are one DataFrame or filters of it.
Either way the tables hold the same rows, exactly once."""

import contextlib
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch import write as write_stage
from dagster_sideinputs.core.batch.frame_split import one_pass as split_frames
from dagster_sideinputs.errors import DuplicateKeyError
from tests.conftest import stage_names, table_files
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
    assert one_pass(first)
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert lake.rows("big") == [(2, "bob"), (3, None)]
    fill(lake, [(4, 10, 700.0), (5, 11, 1.0)])
    second = lake.run(operator(lake))  # both tables exist now: appended as they are
    assert one_pass(second)
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None), (4, "ann"), (5, "bob")]
    assert lake.rows("big") == [(2, "bob"), (3, None), (4, "ann")]
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
    strays = stray_files(lake, "enriched", "big")  # delta-spark's writer may leave 0-row files

    def fails_on_five(record, ctx):
        if record.tx_id == 5:
            raise ValueError("bad record")
        yield from enrich(record, ctx)

    with pytest.raises(dsi.errors.FunctionError, match="bad record") as raised:
        lake.run(operator(lake, fn=fails_on_five))
    assert "nothing" in str(raised.value).lower()
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,)]
    assert lake.rows("big", "tx_id") == [(2,), (3,)]
    assert stray_files(lake, "enriched", "big") == strays
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


# --- frames mode: outputs that are filters of one DataFrame ------------------------------

LARGE = dsi.OutputTag("big")  # frames mode: no declared schema
FLAGGED = dsi.OutputTag("flagged")
SMALL = dsi.OutputTag("small")


def frames_operator(lake, fn, side_outputs=(LARGE, FLAGGED, SMALL), storage=None):
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=fn,
        main_output="enriched",
        side_outputs=list(side_outputs),
        **({"storage": storage} if storage is not None else {}),
    )


def enriched_frame(main):
    return main.select("tx_id", "amount", F.col("profile.name").alias("name"))


def split_by_filters(main, sides):
    enriched = enriched_frame(main)
    return {
        dsi.MAIN: enriched,
        LARGE: enriched.filter(F.col("amount") > 100),  # both: tx 2 and 3 are in enriched too
        FLAGGED: enriched.filter(F.col("amount") > 100).filter(F.col("name").isNotNull()),
        SMALL: enriched.filter(F.col("name") != "bob"),  # tx 3's null name: not small
    }


def frames_rows(lake):
    return {
        name: lake.rows(name, "tx_id", "amount", "name")
        for name in ("enriched", "big", "flagged", "small")
    }


FRAMES_ROWS = {
    "enriched": [(1, 50.0, "ann"), (2, 500.0, "bob"), (3, 900.0, None)],
    "big": [(2, 500.0, "bob"), (3, 900.0, None)],
    "flagged": [(2, 500.0, "bob")],
    "small": [(1, 50.0, "ann")],
}


def test_frames_outputs_filtering_one_dataframe_are_written_by_one_job(lake):
    fill(lake)
    result = lake.run(frames_operator(lake, split_by_filters))
    assert one_pass(result)
    assert frames_rows(lake) == FRAMES_ROWS
    assert {t: result.emitted(t) for t in FRAMES_ROWS} == {
        t: len(r) for t, r in FRAMES_ROWS.items()
    }
    fill(lake, [(4, 10, 700.0), (5, 11, 1.0)])
    second = lake.run(frames_operator(lake, split_by_filters))  # appended to existing tables
    assert one_pass(second)
    assert frames_rows(lake)["big"] == [(2, 500.0, "bob"), (3, 900.0, None), (4, 700.0, "ann")]
    assert frames_rows(lake)["small"] == [(1, 50.0, "ann"), (4, 700.0, "ann")]
    names = ("enriched", "big", "flagged", "small")
    assert stray_files(lake, *names) == {name: set() for name in names}
    for name in names:  # no marker of a table being created is left
        assert not (Path(lake.storage.table_uri(name)) / "_dsi_staging" / "_creating").exists()


def test_frames_outputs_in_one_pass_hold_what_one_job_per_output_writes(
    spark, tmp_path, monkeypatch
):
    """The same batches with the one-pass split turned off: identical tables."""
    lakes = {}
    for mode in ("one_pass", "one_by_one"):
        lake = Lake(spark, dsi.DeltaStorage(str(tmp_path / mode), engine="delta-rs"))
        with monkeypatch.context() as patched:
            if mode == "one_by_one":
                patched.setattr(write_stage, "one_pass", lambda frames, tag_column: None)
            for rows in ([(1, 10, 50.0), (2, 11, 500.0), (3, 12, 900.0)], [(4, 11, 150.0)]):
                fill(lake, rows)
                result = lake.run(frames_operator(lake, split_by_filters))
                assert one_pass(result) == (mode == "one_pass")
        lakes[mode] = frames_rows(lake)
    assert lakes["one_pass"] == lakes["one_by_one"]
    assert lakes["one_pass"]["big"] == [(2, 500.0, "bob"), (3, 900.0, None), (4, 150.0, "bob")]


def test_frames_outputs_of_other_shapes_are_written_one_by_one(lake):
    fill(lake)

    def shapes_differ(main, sides):
        enriched = enriched_frame(main)
        return {dsi.MAIN: enriched, LARGE: enriched.filter(F.col("amount") > 100).drop("name")}

    result = lake.run(frames_operator(lake, shapes_differ, side_outputs=[LARGE]))
    assert not one_pass(result)
    assert lake.rows("big", "tx_id", "amount") == [(2, 500.0), (3, 900.0)]
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,)]


def test_a_failing_filter_in_the_frames_split_job_commits_and_leaves_nothing(lake):
    fill(lake)
    lake.run(frames_operator(lake, split_by_filters))
    fill(lake, [(4, 10, 700.0), (5, 11, 1.0)])
    names = ("enriched", "big", "flagged", "small")
    strays = stray_files(lake, *names)

    def fails_on_five(main, sides):
        outputs = split_by_filters(main, sides)
        boom = F.when(F.col("tx_id") == 5, F.raise_error(F.lit("bad record five")))
        outputs[LARGE] = enriched_frame(main).filter(
            F.coalesce(boom.cast("boolean"), F.col("amount") > 100)
        )
        return outputs

    with pytest.raises(dsi.SideInputError, match="bad record five") as raised:
        lake.run(frames_operator(lake, fails_on_five))
    assert "nothing" in str(raised.value).lower()
    assert frames_rows(lake) == FRAMES_ROWS
    if lake.engine_id == "rs":  # (delta-spark writes this other plan on its own, and a
        # failed job of Delta's writer leaves its finished tasks' files unreferenced)
        assert stray_files(lake, *names) == strays
    lake.run(frames_operator(lake, split_by_filters))  # fixed: the batch goes through, once
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,), (4,), (5,)]
    assert lake.rows("big", "tx_id") == [(2,), (3,), (4,)]


@pytest.mark.parametrize("tables", ["new", "existing"])
def test_a_crash_between_frames_commits_is_replayed_exactly_once(lake, tables):
    expected = FRAMES_ROWS
    if tables == "existing":  # delta-spark splits only into tables that exist
        fill(lake, [(0, 10, 1.0)])
        lake.run(frames_operator(lake, split_by_filters))
        expected = {
            name: sorted([(0, 1.0, "ann")] * (name in ("enriched", "small")) + rows, key=repr)
            for name, rows in FRAMES_ROWS.items()
        }
    fill(lake)
    crashing = CrashingEngine(lake.engine, crash_after=2)
    with pytest.raises(InjectedCrash):
        lake.run(frames_operator(lake, split_by_filters, storage=lake.with_engine(crashing)))
    assert len(crashing.log) == 2
    result = lake.run(frames_operator(lake, split_by_filters))
    assert result.batches[0].replayed
    assert frames_rows(lake) == expected


def test_one_pass_tags_each_row_once_per_output_it_meets(spark):
    base = spark.createDataFrame([(1, 5), (2, None), (3, 20)], "id long, v long")
    big = base.filter(F.col("v") > 10)
    split = split_frames([base, big, big.filter(F.col("id") > 2), base], "_t")
    assert split is not None
    assert sorted((r.id, r._t) for r in split.collect()) == [
        (1, 0),
        (1, 3),
        (2, 0),
        (2, 3),
        (3, 0),
        (3, 1),
        (3, 2),
        (3, 3),
    ]  # a null v meets no filter on v
    over_ten = F.udf(lambda v: v is not None and v > 10, T.BooleanType())  # Python, too
    by_udf = split_frames([base, base.filter(over_ten(F.col("v")))], "_t")
    assert by_udf is not None
    assert sorted((r.id, r._t) for r in by_udf.collect()) == [(1, 0), (2, 0), (3, 0), (3, 1)]
    assert split_frames([base, base.select("id", "v")], "_t") is None  # another plan
    assert split_frames([base, base.filter("v > 1").select("id")], "_t") is None
    assert split_frames([base], "_t") is None  # nothing to share


def test_a_split_write_keeps_one_file_per_table_open_only_while_it_writes(
    spark, tmp_path, monkeypatch
):
    """Spark sorts a partitioned write's rows unless tasks may keep a file per table open:
    the split write allows one per table for its own job, then the session's setting is as
    before (a larger one of the user's is kept and not lowered)."""
    from dagster_sideinputs.delta import staging as split_writer

    key = split_writer.CONCURRENT_WRITERS
    during = []
    setting = split_writer.session_setting

    @contextlib.contextmanager
    def watched(session, name, value):
        with setting(session, name, value):
            during.append((value, session.conf.get(key, None)))
            yield

    monkeypatch.setattr(split_writer, "session_setting", watched)

    def run_split(folder):
        lake = Lake(spark, dsi.DeltaStorage(str(tmp_path / folder), engine="delta-rs"))
        fill(lake)
        assert one_pass(lake.run(frames_operator(lake, split_by_filters)))

    assert spark.conf.get(key, None) is None
    try:
        run_split("default")
        assert during == [("4", "4")]  # four tables: four files open per task
        assert spark.conf.get(key, None) is None
        spark.conf.set(key, "32")
        run_split("users")
        assert during[1:] == [(None, "32")]
        assert spark.conf.get(key) == "32"
    finally:
        spark.conf.unset(key)


def test_a_frames_batch_reads_its_small_side_tables_without_a_job_of_their_own(lake):
    """The map's one-row-per-key check and the singleton's row are read on the driver by
    the bridge's delta-rs (no Spark job); delta-spark reads them with Spark. The outputs
    are the same either way."""
    fill(lake)
    lake.append("limits", [(100.0, "v1")], "threshold double, label string")

    def by_threshold(main, sides):
        limit = sides["limits"]
        enriched = enriched_frame(main).withColumn("label", F.lit(limit.label))
        return {dsi.MAIN: enriched, LARGE: enriched.filter(F.col("amount") > limit.threshold)}

    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map("profiles", key="customer_id", distribution="broadcast"),
            "limits": dsi.SideInput.singleton("limits"),
        },
        fn=by_threshold,
        main_output="enriched",
        side_outputs=[LARGE],
    )
    result, stages = stage_names(lake.spark, lambda: lake.run(op))
    assert one_pass(result)
    assert lake.rows("big", "tx_id", "amount", "name", "label") == [
        (2, 500.0, "bob", "v1"),
        (3, 900.0, None, "v1"),
    ]
    assert any("checked on the driver" in n for b in result.batches for n in b.notes)
    small_reads = [n for n in stages if n.startswith(("collect", "toArrow"))]
    if lake.engine_id == "rs":
        assert small_reads == [], stages
    else:
        assert len(small_reads) == 2, stages
    # A duplicated key is still refused before anything is written, with the keys named.
    lake.append("profiles", [(10, "ann again")], "customer_id long, name string")
    fill(lake, [(4, 10, 700.0)])
    with pytest.raises(DuplicateKeyError, match="10"):
        lake.run(op)
    assert lake.rows("big", "tx_id", "amount", "name", "label")[-1][0] == 3


def test_a_batch_its_statistics_show_all_released_takes_the_route_without_a_rule(lake):
    """No null key in the new files' statistics, one ready namespace, no rule that could
    hold a record back: every record's route is the literal ``released`` (no expression
    of rules to build and evaluate), and the function's input is not filtered on it. A
    batch whose statistics show a null key evaluates the rules, and routes that record."""
    fill(lake)
    op = frames_operator(lake, split_by_filters)
    batch = op.run(lake.spark, explain=True).batches[0]
    assert "every record released: routes counted from file statistics" in batch.notes
    assert "released AS _dsi_route" in batch.physical_plan
    assert "THEN invalid" not in batch.physical_plan
    assert frames_rows(lake) == FRAMES_ROWS
    fill(lake, [(4, None, 700.0), (5, 11, 1.0)])
    with_invalid = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=split_by_filters,
        main_output="enriched",
        side_outputs=[LARGE, FLAGGED, SMALL],
        routes=dsi.Routes(invalid=dsi.OutputTag("invalid")),
    )
    batch = with_invalid.run(lake.spark, explain=True).batches[0]
    assert "THEN invalid" in batch.physical_plan
    assert lake.rows("invalid", "tx_id") == [(4,)]
    assert frames_rows(lake)["enriched"] == [*FRAMES_ROWS["enriched"], (5, 1.0, "bob")]
