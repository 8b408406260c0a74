"""A failed batch never pins the bad state (issue 10, class 1).

For every error that suggests a fix: trigger it, apply the fix the message suggests,
rerun, and check that every main record is in exactly one place. A batch that failed
before any table committed it is planned again from the current inputs (its plan is set
aside under ``plans/discarded/``), so fixes of side tables, main records, limits and
declarations take effect; a batch some table committed is replayed exactly.

Setting the plan aside is the same whatever the error: an error whose fix a bad-input
catalogue case (tests/core/test_bad_input_*.py) already applies and reruns is not
repeated here; those cases are named where they would be.
"""

import os
import shutil
import sys
import textwrap
from typing import Any

import pytest
from deltalake import DeltaTable, convert_to_deltalake
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.core.keyed import key_group
from dagster_sideinputs.core.state.lock import operator_lock
from dagster_sideinputs.delta.bridge import log_commit
from tests.core.accounting import assert_accounted
from tests.core.conftest import T0, Clock, Lake, hours
from tests.core.reliability import put, refused
from tests.core.test_keyed import no_broadcast

TX = "tx_id long, customer_id long, amount double"
TXT = "tx_id long, customer_id long, amount double, ts timestamp"
PROFILES = "customer_id long, name string"
INVALID = dsi.OutputTag("invalid")
OVERFLOW = dsi.OutputTag("overflow")
UNMATCHED = dsi.OutputTag("unmatched")


def enrich(main, sides):
    return main.select("tx_id", "customer_id", F.col("profile.name").alias("name"))


def keyed(lake: Lake, side: dsi.SideInput | None = None, **kwargs: Any) -> dsi.SideInputOperator:
    """transactions joined with the profiles map, written to ``enriched``."""
    return lake.operator(
        main=kwargs.pop("main", dsi.MainInput("transactions", key="customer_id")),
        side_inputs=kwargs.pop(
            "sides", {"profile": side or dsi.SideInput.map("profiles", key="customer_id")}
        ),
        fn=kwargs.pop("fn", enrich),
        main_output=kwargs.pop("main_output", "enriched"),
        **kwargs,
    )


def discarded(op: dsi.SideInputOperator) -> list[str]:
    folder = os.path.join(op.state_uri, "plans", "discarded")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def replanned(result: dsi.RunResult, op: dsi.SideInputOperator, *, set_aside: int = 1) -> None:
    """The rerun planned its first batch anew (the failed plan was set aside)."""
    assert result.batches, "the rerun did nothing"
    assert not result.batches[0].replayed
    assert len(discarded(op)) == set_aside


@pytest.fixture
def profiles(lake: Lake) -> Lake:
    put(lake, "profiles", [(10, "ann"), (11, "bob")], PROFILES)
    return lake


# --- side data the view cannot hold ------------------------------------------------------


def test_duplicate_map_keys_then_the_side_table_deduplicated(lake):
    put(lake, "profiles", [(10, "ann"), (10, "ann again"), (11, "bob")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 11, 2.0)], TX)
    op = keyed(lake)
    with refused(
        dsi.errors.DuplicateKeyError,
        "'profile'",
        "[10]",
        "version 0",
        fix=["deduplicate the side asset", "pick="],
    ):
        lake.run(op)
    assert op.last_plan() is not None  # the failed batch's plan, pinning version 0

    put(lake, "profiles", [(10, "ann"), (11, "bob")], PROFILES, mode="overwrite")
    result = lake.run(op)
    replanned(result, op)
    assert result.batches[0].side_versions == {"profile": 1}
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, "bob")]
    assert_accounted(lake.spark, op, [1, 2])


def test_duplicate_keys_in_row_mode_then_the_side_table_deduplicated(lake):
    schema = T.StructType(
        [T.StructField("tx_id", T.LongType()), T.StructField("name", T.StringType())]
    )

    def per_record(record, ctx):
        profile = ctx.side_input("profile")
        yield {"tx_id": record.tx_id, "name": profile.name if profile else None}

    put(lake, "profiles", [(10, "ann"), (10, "ann again")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 12, 1.0)], TX)
    op = keyed(lake, fn=per_record, mode="rows", main_output=dsi.OutputTag("enriched", schema))
    with refused(
        dsi.errors.DuplicateKeyError, "'profile'", "[10]", fix="deduplicate the side asset"
    ):
        lake.run(op)
    put(lake, "profiles", [(10, "ann")], PROFILES, mode="overwrite")
    replanned(lake.run(op), op)
    assert lake.rows("enriched") == [(1, "ann"), (2, None)]
    assert_accounted(lake.spark, op, [1, 2])


def rules_operator(lake: Lake, **side: Any) -> dsi.SideInputOperator:
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"rules": dsi.SideInput.singleton("rules", **side)},
        fn=lambda main, sides: main.withColumn("limit", F.lit(sides["rules"].limit)),
        main_output="checked",
    )


def test_singleton_with_two_rows_then_one(lake):
    put(lake, "rules", [(5.0,), (6.0,)], "limit double")
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    op = rules_operator(lake)
    with refused(
        dsi.errors.SingletonCardinalityError, "'rules'", "more than one row", fix="exactly one row"
    ):
        lake.run(op)
    put(lake, "rules", [(5.0,)], "limit double", mode="overwrite")
    replanned(lake.run(op), op)
    assert lake.rows("checked", "tx_id", "limit") == [(1, 5.0)]
    assert_accounted(lake.spark, op, [1])


def test_empty_singleton_then_a_row_materialized(lake):
    put(lake, "rules", [], "limit double")
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    op = rules_operator(lake, readiness="complete")
    with refused(dsi.errors.EmptySingletonError, "'rules'", "no row", fix="materialize a row"):
        lake.run(op)
    put(lake, "rules", [(7.0,)], "limit double")
    replanned(lake.run(op), op)
    assert lake.rows("checked", "tx_id", "limit") == [(1, 7.0)]
    assert_accounted(lake.spark, op, [1])


def test_side_table_without_its_key_column_then_key_declared(lake):
    put(lake, "profiles", [(10, "ann")], "id long, name string")
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    with refused(
        dsi.errors.SideInputDataError,
        "'profile'",
        "'customer_id'",
        fix=["fix key= in the declaration", "restore the side table's schema"],
    ):
        lake.run(keyed(lake))
    op = keyed(lake, dsi.SideInput.map("profiles", key="id", key_translator="customer_id"))
    replanned(lake.run(op), op)
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann")]
    assert_accounted(lake.spark, op, [1])


def test_side_key_of_another_type_then_key_translator(lake):
    put(lake, "profiles", [("10", "ann")], "customer_id string, name string")
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    with refused(
        dsi.DeclarationError, "'profile'", "bigint", "string", fix="key_translator=F.col(...)"
    ):
        lake.run(keyed(lake))
    side = dsi.SideInput.map(
        "profiles", key="customer_id", key_translator=F.col("customer_id").cast("string")
    )
    op = keyed(lake, side)
    replanned(lake.run(op), op)
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann")]
    assert_accounted(lake.spark, op, [1])


def test_key_translator_naming_a_missing_column_then_fixed(profiles):
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    side = dsi.SideInput.map("profiles", key="customer_id", key_translator="customer")
    with refused(dsi.DeclarationError, "'customer'", fix="name a column of the main input"):
        lake.run(keyed(lake, side))
    op = keyed(lake, dsi.SideInput.map("profiles", key="customer_id", key_translator="customer_id"))
    replanned(lake.run(op), op)
    assert_accounted(lake.spark, op, [1])


def test_side_input_named_like_a_main_column_then_renamed(profiles):
    lake = profiles
    put(lake, "transactions", [(1, 10, "x")], "tx_id long, customer_id long, profile string")
    with refused(dsi.DeclarationError, "'profile'", fix="rename the side input"):
        lake.run(keyed(lake))
    op = keyed(
        lake,
        sides={"person": dsi.SideInput.map("profiles", key="customer_id")},
        fn=lambda main, sides: main.select("tx_id", F.col("person.name").alias("name")),
    )
    replanned(lake.run(op), op)
    assert lake.rows("enriched") == [(1, "ann")]
    assert_accounted(lake.spark, op, [1])


# A side table deleted after use, then rematerialized: test_state_identity.py.


# The bridge's refusal (delta-spark reads column mapping): an engine contract case.
@pytest.mark.parametrize("delta_engine", ["rs"])
def test_side_table_with_an_unsupported_feature_then_rewritten(lake):
    import pyarrow as pa
    from deltalake import write_deltalake

    uri = lake.storage.table_uri("profiles")
    rows = pa.table({"customer_id": pa.array([10], pa.int64()), "name": ["ann"]})
    write_deltalake(uri, rows, configuration={"delta.columnMapping.mode": "name"})
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    with refused(dsi.errors.UnsupportedTableFeatureError, "profiles", "columnMapping"):
        lake.run(keyed(lake))
    shutil.rmtree(uri)  # "rewrite the table without this feature"
    put(lake, "profiles", [(10, "ann")], PROFILES)
    op = keyed(lake)
    lake.run(op)
    assert_accounted(lake.spark, op, [1])


# --- main records and the main input's schema ------------------------------------------


def test_main_key_column_misnamed_then_fixed(profiles):
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    with refused(
        dsi.DeclarationError, "'transactions'", "'customer'", fix="fix MainInput(key=...)"
    ):
        lake.run(keyed(lake, main=dsi.MainInput("transactions", key="customer")))
    op = keyed(lake)
    replanned(lake.run(op), op)
    assert_accounted(lake.spark, op, [1])


def test_event_time_column_missing_then_fixed(profiles):
    # A column of another type (the check's other branch, the same fix): test_bad_input_raw.py.
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0, T0)], TXT)

    def windowed(event_time: str) -> dsi.SideInputOperator:
        return keyed(
            lake,
            main=dsi.MainInput("transactions", key="customer_id", event_time=event_time),
            window=dsi.Window.tumbling(hours(1)),
        )

    clock = Clock(T0 + hours(3))
    with refused(dsi.DeclarationError, "'transactions'", "'tss'", fix="event_time="):
        lake.run(windowed("tss"), clock)
    op = windowed("ts")
    replanned(lake.run(op, clock), op, set_aside=0)  # refused while planning
    assert_accounted(lake.spark, op, [1])


@pytest.mark.parametrize(
    ("column", "window"),
    [("_dsi_note", None), ("window", dsi.Window.tumbling(hours(1)))],
    ids=["reserved-prefix", "window-column"],
)
def test_main_column_the_operator_reserves_then_renamed_upstream(profiles, column, window):
    lake = profiles
    main = dsi.MainInput("transactions", key="customer_id", event_time="ts")
    put(
        lake,
        "transactions",
        [(1, 10, T0, "x")],
        f"tx_id long, customer_id long, ts timestamp, {column} string",
    )
    op = keyed(lake, main=main, window=window)
    clock = Clock(T0 + hours(3))
    with refused(dsi.DeclarationError, "'transactions'", repr(column), fix="rename"):
        lake.run(op, clock)
    # Renamed upstream before the operator read anything: the table is written again.
    put(
        lake,
        "transactions",
        [(1, 10, T0, "x")],
        "tx_id long, customer_id long, ts timestamp, note string",
        mode="overwrite",
    )
    replanned(lake.run(op, clock), op)
    assert_accounted(lake.spark, op, [1])


def test_null_key_in_a_delta_main_input_then_an_invalid_tag(profiles):
    lake = profiles
    op = keyed(lake)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    lake.run(op)
    put(lake, "transactions", [(2, None, 1.0), (3, 11, 1.0)], TX)
    with refused(
        dsi.errors.MainInputDataError,
        "'transactions'",
        "null key 'customer_id'",
        fix=['invalid=dsi.OutputTag("...")', "append-only"],
    ) as caught:
        lake.run(op)
    # A Delta main input is append-only: correcting the record in place is not a fix.
    assert "fix the records at the source" not in (caught.value.fix or "")
    fixed = keyed(
        lake,
        routes=dsi.Routes(invalid=INVALID),
    )
    replanned(lake.run(fixed), fixed)
    assert lake.rows("invalid", "tx_id") == [(2,)]
    assert_accounted(lake.spark, fixed, [1, 2, 3])


def landing_operator(lake: Lake, folder, fmt: str = "json", **kwargs: Any) -> dsi.SideInputOperator:
    return keyed(
        lake,
        main=dsi.MainInput.files(str(folder), format=fmt, schema=TX, key="customer_id"),
        **kwargs,
    )


def test_null_key_in_a_landed_file_then_the_file_corrected(profiles, tmp_path):
    lake = profiles
    folder = tmp_path / "landing"
    folder.mkdir()
    (folder / "a.json").write_text('{"tx_id": 1, "customer_id": 10, "amount": 1}\n')
    op = landing_operator(lake, folder)
    lake.run(op)
    (folder / "b.json").write_text(
        '{"tx_id": 2, "amount": 1}\n{"tx_id": 3, "customer_id": 11, "amount": 1}\n'
    )
    with refused(
        dsi.errors.MainInputDataError, "null key 'customer_id'", fix="fix the records at the source"
    ):
        lake.run(op)
    corrected = [
        '{"tx_id": 2, "customer_id": 10, "amount": 1}',
        '{"tx_id": 3, "customer_id": 11, "amount": 1}',
    ]
    (folder / "b.json").write_text("\n".join(corrected) + "\n")
    replanned(lake.run(op), op)
    assert_accounted(lake.spark, op, [1, 2, 3])


def test_corrupt_landed_file_then_moved_away(profiles, tmp_path):
    lake = profiles
    folder = tmp_path / "landing"
    folder.mkdir()
    lake.spark.createDataFrame([(1, 10, 1.0)], TX).toPandas().to_parquet(folder / "good.parquet")
    (folder / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    op = landing_operator(lake, folder, "parquet")
    with refused(
        dsi.errors.CorruptDataFileError, "broken.parquet", "'landing'", fix="move the file out"
    ):
        lake.run(op)
    shutil.move(folder / "broken.parquet", tmp_path / "broken.parquet")
    replanned(lake.run(op), op)
    assert_accounted(lake.spark, op, [1])


def newest_file(lake: Lake, name: str) -> str:
    return max(DeltaTable(lake.storage.table_uri(name)).file_uris(), key=os.path.getmtime)


def test_truncated_main_data_file_then_restored_from_a_backup(profiles, tmp_path):
    lake = profiles
    op = keyed(lake)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    lake.run(op)
    put(lake, "transactions", [(2, 11, 1.0)], TX)
    damaged = newest_file(lake, "transactions")
    shutil.copy(damaged, tmp_path / "backup.parquet")
    with open(damaged, "r+b") as handle:
        handle.truncate(20)
    with refused(
        dsi.errors.CorruptDataFileError,
        "transactions",
        "20 bytes",
        fix="restore the file from a backup",
    ):
        lake.run(op)
    shutil.copy(tmp_path / "backup.parquet", damaged)
    replanned(lake.run(op), op)
    assert_accounted(lake.spark, op, [1, 2])


def test_main_version_that_deleted_rows_then_skipped_by_a_reset(profiles):
    lake = profiles
    op = keyed(lake)
    put(lake, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)  # version 0
    lake.run(op)
    put(lake, "transactions", [(3, 10, 1.0)], TX)  # version 1
    DeltaTable(lake.storage.table_uri("transactions")).delete("tx_id = 1")  # version 2
    put(lake, "transactions", [(4, 11, 1.0)], TX)  # version 3
    with refused(
        dsi.errors.NonAppendOnlyChangeError,
        "'transactions'",
        "version 2",
        "DELETE",
        fix="operator.reset(main_from=2)",
    ):
        lake.run(op)
    # The appends before the change were processed; nothing of version 2 or later.
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,)]

    op.reset(main_from=2)
    lake.run(op)
    assert lake.rows("enriched", "tx_id") == [(1,), (2,), (3,), (4,)]
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


def test_main_input_folder_that_is_not_delta_then_converted(profiles):
    lake = profiles
    uri = lake.storage.table_uri("transactions")
    lake.spark.createDataFrame([(1, 10, 1.0)], TX).write.parquet(uri)
    op = keyed(lake)
    with refused(dsi.errors.NotADeltaTableError, "transactions", fix="convert_to_deltalake"):
        lake.run(op)
    convert_to_deltalake(uri)
    lake.run(op)
    assert_accounted(lake.spark, op, [1])


def test_pre_keyed_promise_broken_then_pre_keyed_dropped(lake):
    # Each file holds one key group, but not its keys' own: only the row check can tell.
    # Before it was checked, the no-shuffle read joined the rows in the wrong buckets and
    # released them all without their profiles.
    put(lake, "profiles", [(k, f"n{k}") for k in range(8)], PROFILES)
    frame = lake.spark.createDataFrame([(i, i % 8, 1.0) for i in range(16)], TX)
    wrong = frame.withColumn("key_group", (key_group("customer_id", 4) + 1) % 4)
    dsi.tables.write_dataframe(
        wrong, lake.storage.table_uri("transactions"), partition_by=["key_group"]
    )
    side = dsi.SideInput.map("profiles", key="customer_id", distribution="keyed")
    pre_keyed = dsi.MainInput(
        "transactions", key="customer_id", pre_keyed=dsi.KeyGroups(4, "key_group")
    )
    with no_broadcast(lake.spark):  # a shuffle join, as for a large side input
        with refused(
            dsi.errors.PreKeyedViolationError, "'transactions'", "hashes to", fix="drop pre_keyed="
        ):
            lake.run(keyed(lake, side, main=pre_keyed))
        op = keyed(lake, side, fn=lambda main, sides: enrich(main, sides).drop("key_group"))
        replanned(lake.run(op), op)
    assert all(name is not None for _, name in lake.rows("enriched", "tx_id", "name"))
    assert_accounted(lake.spark, op, list(range(16)))


# --- the buffer's limits -----------------------------------------------------------------


def test_buffer_over_its_limit_then_the_side_input_made_ready(lake):
    # Its other fixes (a higher max_rows, on_exceed="overflow") are declaration changes like
    # the others here; test_bad_input_limits.py takes the overflow one.
    put(lake, "transactions", [(1, 10, 1.0), (2, 11, 1.0)], TX)  # no side table yet
    op = keyed(lake, buffer=dsi.BufferLimits(max_rows=1))
    with refused(
        dsi.errors.BufferLimitExceededError,
        "'enriched'",
        "2 rows (limit 1)",
        fix=["make the side inputs ready", "BufferLimits(max_rows=", "on_exceed='overflow'"],
    ):
        lake.run(op)
    put(lake, "profiles", [(10, "ann"), (11, "bob")], PROFILES)
    replanned(lake.run(op), op)  # the old plan said "not ready": it must not be replayed
    assert lake.rows("enriched", "tx_id", "name") == [(1, "ann"), (2, "bob")]
    assert_accounted(lake.spark, op, [1, 2])


# --- the function and its outputs --------------------------------------------------------
# A function that raises or returns no DataFrame, a row function yielding no dict:
# test_bad_input_raw.py; an output not of its declared schema: test_bad_input_halfway.py.


def test_undeclared_output_tag_then_declared(profiles):
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0)], TX)

    def split(main, sides):
        enriched = enrich(main, sides)
        return {dsi.MAIN: enriched, "named": enriched.select("tx_id")}

    with refused(dsi.errors.UndeclaredOutputTagError, "'named'", fix='dsi.OutputTag("named")'):
        lake.run(keyed(lake, fn=split))
    op = keyed(lake, fn=split, side_outputs=[dsi.OutputTag("named")])
    replanned(lake.run(op), op)
    assert lake.rows("named") == [(1,)]
    assert_accounted(lake.spark, op, [1])


def test_output_gaining_a_column_then_schema_merge(profiles):
    lake = profiles
    passthrough = lambda main, sides: main.drop("profile")  # noqa: E731
    op = keyed(lake, fn=passthrough)
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    lake.run(op)
    put(lake, "transactions", [(2, 10, 1.0, "web")], TX + ", channel string", schema_mode="merge")
    with refused(
        dsi.errors.SchemaMismatchError, "enriched", "'channel'", fix='schema_mode="merge"'
    ):
        lake.run(op)
    merging = keyed(lake, fn=passthrough, schema_mode="merge")
    replanned(lake.run(merging), merging)
    assert lake.rows("enriched", "tx_id", "channel") == [(1, None), (2, "web")]
    assert_accounted(lake.spark, merging, [1, 2])


def test_void_output_column_then_typed(profiles):
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    untyped = lambda main, sides: enrich(main, sides).withColumn("note", F.lit(None))  # noqa: E731
    with refused(
        dsi.errors.SchemaMismatchError, "'note'", "void", fix='F.lit(None).cast("string")'
    ):
        lake.run(keyed(lake, fn=untyped))
    op = keyed(
        lake,
        fn=lambda main, sides: enrich(main, sides).withColumn("note", F.lit(None).cast("string")),
    )
    replanned(lake.run(op), op)
    assert_accounted(lake.spark, op, [1])


def test_function_module_missing_on_executors_then_shipped(profiles, tmp_path):
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    module = tmp_path / "dsi_driver_only_module.py"
    module.write_text(
        textwrap.dedent(
            """
            def per_record(record, ctx):
                yield {"tx_id": record.tx_id}
            """
        )
    )
    sys.path.insert(0, str(tmp_path))  # the driver imports it; Spark's workers cannot
    try:
        import dsi_driver_only_module  # type: ignore[import-not-found]

        tag = dsi.OutputTag("enriched", T.StructType([T.StructField("tx_id", T.LongType())]))
        op = keyed(lake, fn=dsi_driver_only_module.per_record, mode="rows", main_output=tag)
        with refused(dsi.DeclarationError, "'dsi_driver_only_module'", fix="addPyFile"):
            lake.run(op)
        lake.spark.sparkContext.addPyFile(str(module))
        replanned(lake.run(op), op)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("dsi_driver_only_module", None)
    assert_accounted(lake.spark, op, [1])


# --- runs and commits --------------------------------------------------------------------


def test_operator_busy_then_rerun_when_the_other_run_is_done(profiles):
    lake = profiles
    put(lake, "transactions", [(1, 10, 1.0)], TX)
    op = keyed(lake)
    with (
        operator_lock(op.state_uri, operator_id=op.operator_id, wait_s=0.0),
        refused(dsi.OperatorBusyError, "'enriched'", fix="wait for the other run"),
    ):
        lake.run(op)
    lake.run(op)
    assert_accounted(lake.spark, op, [1])


@pytest.fixture
def race(monkeypatch):
    """Arm another writer: it changes a table's metadata right before our commit to that
    table (after we read the table's version), which conflicts with our commit."""

    def arm(target: str) -> None:
        original = DeltaTable.create_write_transaction
        link = log_commit.os.link
        done: list[str] = []

        def other_writer(table_uri: str) -> None:
            done.append(table_uri)
            other = DeltaTable(table_uri)
            other.alter.set_table_properties({"delta.logRetentionDuration": "interval 31 days"})

        def racing(table: DeltaTable, *args: Any, **kwargs: Any) -> Any:
            if not done and table.table_uri.rstrip("/").endswith(target):
                other_writer(table.table_uri)
            return original(table, *args, **kwargs)

        def racing_link(source: str, commit_file: str) -> None:
            # The bridge's own commits to local tables (delta/bridge/log_commit.py); os.link is
            # the module's, so other links (state files) pass through untouched.
            log_dir = os.path.dirname(commit_file)
            table_uri = os.path.dirname(log_dir)
            ours = os.path.basename(log_dir) == "_delta_log"
            if ours and not done and table_uri.rstrip("/").endswith(target):
                other_writer(table_uri)
            link(source, commit_file)

        monkeypatch.setattr(DeltaTable, "create_write_transaction", racing)
        monkeypatch.setattr(log_commit.os, "link", racing_link)

    return arm


# The race is armed in the bridge's commit paths (delta-rs, log_commit): an engine contract
# case; delta-spark's conflicts are tests/delta/test_delta_engines.py's.
@pytest.mark.parametrize("delta_engine", ["rs"])
@pytest.mark.parametrize("target", ["enriched", "buffer"])
def test_conflicting_concurrent_commit_then_rerun(lake, race, monkeypatch, target):
    waiting = dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(hours(1)))
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0), (2, 77, 1.0)], TX)
    op = keyed(
        lake,
        waiting,
        routes=dsi.Routes(unmatched=UNMATCHED),
    )
    clock = Clock()
    lake.run(op, clock)  # creates both tables
    put(lake, "transactions", [(3, 10, 1.0), (4, 78, 1.0)], TX)
    race(target)
    with refused(dsi.errors.ConcurrentWriteError, target, fix="rerun"):
        lake.run(op, clock)
    monkeypatch.undo()
    result = lake.run(op, clock)
    # The plan was claimed for commit before the conflict (state/folder.py, claims): whether or
    # not a table committed, the batch is replayed from it, never planned again.
    assert result.batches[0].replayed
    assert_accounted(lake.spark, op, [1, 2, 3, 4])


def test_pre_keyed_file_holding_several_key_groups_then_pre_keyed_dropped(profiles):
    lake = profiles
    frame = lake.spark.createDataFrame([(1, 10, 1.0, 0), (2, 11, 1.0, 3)], TX + ", key_group int")
    dsi.tables.write_dataframe(frame.coalesce(1), lake.storage.table_uri("transactions"))
    pre_keyed = dsi.MainInput(
        "transactions", key="customer_id", pre_keyed=dsi.KeyGroups(4, "key_group")
    )
    with refused(
        dsi.errors.PreKeyedViolationError,
        "transactions",
        "exactly one key group",
        fix="drop pre_keyed=",
    ):
        lake.run(keyed(lake, main=pre_keyed))
    op = keyed(lake, fn=lambda main, sides: enrich(main, sides))
    lake.run(op)
    assert_accounted(lake.spark, op, [1, 2])


# --- declarations refused when written (nothing planned yet: the fixed one runs) ----------

MAIN = dsi.MainInput("transactions", key="customer_id")
RULES = {"rules": dsi.SideInput.singleton("rules")}
ROW = T.StructType([T.StructField("tx_id", T.LongType())])
NO_ROW_UNMATCHED = dsi.SideInput.map("profiles", key="customer_id", missing="unmatched")


def declared(lake: Lake, **kwargs: Any) -> dsi.SideInputOperator:
    kwargs.setdefault("main", MAIN)
    kwargs.setdefault("side_inputs", RULES)
    kwargs.setdefault("fn", lambda main, sides: main.select("tx_id"))
    kwargs.setdefault("main_output", "checked")
    return lake.operator(**kwargs)


def per_row(record, ctx):
    yield {"tx_id": record.tx_id}


DECLARATIONS = {
    "slide-longer-than-size": (
        lambda lake: dsi.Window.sliding(hours(1), slide=hours(2)),
        "use a slide <= size",
        lambda lake: declared(
            lake,
            main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
            window=dsi.Window.sliding(hours(1), slide=hours(1)),
        ),
    ),
    "wait-without-timeout": (
        lambda lake: dsi.SideInput.map("profiles", key="customer_id", missing="wait"),
        "missing=dsi.Wait(timedelta(hours=1))",
        lambda lake: declared(
            lake,
            side_inputs={
                **RULES,
                "profile": dsi.SideInput.map(
                    "profiles", key="customer_id", missing=dsi.Wait(hours(1))
                ),
            },
            routes=dsi.Routes(unmatched=UNMATCHED),
        ),
    ),
    "unmatched-without-tag": (
        lambda lake: declared(
            lake,
            side_inputs={**RULES, "profile": NO_ROW_UNMATCHED},
        ),
        'pass routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched_...")',
        lambda lake: declared(
            lake,
            side_inputs={**RULES, "profile": NO_ROW_UNMATCHED},
            routes=dsi.Routes(unmatched=UNMATCHED),
        ),
    ),
    "fresh-without-max-age": (
        lambda lake: declared(
            lake, side_inputs={"rules": dsi.SideInput.singleton("rules", readiness="fresh")}
        ),
        "pass max_age=",
        lambda lake: declared(
            lake,
            side_inputs={"rules": dsi.SideInput.singleton("rules", max_age=hours(24))},
        ),
    ),
    "overflow-without-tag": (
        lambda lake: declared(lake, buffer=dsi.BufferLimits(max_rows=5, on_exceed="overflow")),
        "pass routes=dsi.Routes(overflow=",
        lambda lake: declared(
            lake,
            buffer=dsi.BufferLimits(max_rows=5, on_exceed="overflow"),
            routes=dsi.Routes(overflow=OVERFLOW),
        ),
    ),
    "rows-without-schema": (
        lambda lake: declared(lake, fn=per_row, mode="rows"),
        'OutputTag("name", schema=',
        lambda lake: declared(
            lake, fn=per_row, mode="rows", main_output=dsi.OutputTag("checked", ROW)
        ),
    ),
    "operator-id-with-a-slash": (
        lambda lake: declared(lake, operator_id="team/checked"),
        "pass operator_id='team_checked'",
        lambda lake: declared(lake, operator_id="team_checked"),
    ),
}


@pytest.mark.parametrize("case", sorted(DECLARATIONS))
def test_declaration_refused_when_written_then_the_fixed_one_runs(lake, case):
    bad, fix, good = DECLARATIONS[case]
    put(lake, "rules", [(1.0,)], "limit double")
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 11, 1.0, T0)], TXT)
    with refused(dsi.DeclarationError, fix=fix):
        bad(lake)
    op = good(lake)
    lake.run(op, Clock(T0 + hours(3)))
    assert_accounted(lake.spark, op, [1, 2])


# Refused declarations whose fix leaves the plain declaration (the bad option dropped, or set
# to what it defaults to): that one runs in the case operator-id-with-a-slash above (its fix
# only names it), so these check the refusal alone.
PLAIN_FIXES = {
    "option-of-another-view": (
        lambda lake: dsi.SideInput.singleton("rules", key="customer_id"),  # type: ignore[call-arg]
        "remove key=, or use SideInput.map(...)",
    ),
    "unknown-readiness": (  # the fix, readiness="present", is a singleton's default
        lambda lake: dsi.SideInput.singleton("rules", readiness="sometimes"),  # type: ignore[arg-type]
        "pass readiness= one of",
    ),
    "glob-in-an-asset-name": (
        lambda lake: declared(lake, side_inputs={"rules": dsi.SideInput.singleton("rules*")}),
        "use letters, digits",
    ),
    "reserved-side-input-name": (
        lambda lake: declared(lake, side_inputs={"_dsi_rules": dsi.SideInput.singleton("rules")}),
        "rename the side input",
    ),
    "pre-keyed-without-key": (
        lambda lake: dsi.MainInput("transactions", pre_keyed=dsi.KeyGroups(4)),
        "pass key=",
    ),
    "main-not-a-main-input": (
        lambda lake: declared(lake, main="transactions"),
        'main=dsi.MainInput("transactions"',
    ),
    "storage-not-a-delta-storage": (
        lambda lake: declared(lake, storage=lake.storage.root),
        "storage=dsi.DeltaStorage(",
    ),
}


@pytest.mark.parametrize("case", sorted(PLAIN_FIXES))
def test_declaration_refused_when_written_whose_fix_is_the_plain_one(lake, case):
    bad, fix = PLAIN_FIXES[case]
    with refused(dsi.DeclarationError, fix=fix):
        bad(lake)
