"""Bad-input catalogue, issue 37 class 5: the main input's schema changes while records wait.

A record waits in the buffer (its key has no side row yet: ``missing="wait"``), the main
input's schema changes (rename, drop, add, type widening, reorder, nullability, a
declared type changed), new records arrive, then the side row. Every record must reach
the output once, with the values the main input itself reads for it now (under
delta-spark the oracle is Delta's own read of the main table), or the change is refused
with an error naming the main input and the column, whose fix keeps the records. Other
keys are never blocked by a change that can be carried over.

Column mapping (renames, drops) and type widening need delta-spark (the bridge refuses
such tables up front: tests/delta/test_feature_matrix.py), so those cases run under
delta-spark; the others change the main table with delta-rs (its schema merge) or land
files, and run under the engine users get.
"""

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.spark.predicates import sql_table
from tests.core.catalogue import PROFILES, accounted, nothing_committed, put, refused
from tests.core.conftest import Lake

DAY = dt.timedelta(days=1)
spark_only = pytest.mark.parametrize("delta_engine", ["spark"])


def released(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    """The main records' values (every main column, as strings: the output's own schema
    stays the same whatever the main input's types) with the profile's name."""
    return main.select(
        "tx_id",
        *[as_text(main, c) for c in main.columns if c not in SKIP],
        F.col("profile.name").alias("name"),
    )


def as_text(frame: DataFrame, column: str) -> Column:
    """A column's values as strings; structs, arrays and maps as JSON, nulls included
    (field names show, so a field carried under the wrong name cannot pass)."""
    value = F.col(f"`{column}`")
    if isinstance(frame.schema[column].dataType, T.StructType | T.ArrayType | T.MapType):
        return F.to_json(value, {"ignoreNullFields": "false"}).alias(column)
    return value.cast("string").alias(column)


SKIP = ("profile", "tx_id")


def waiting_op(lake: Lake, main: dsi.MainInput | None = None) -> dsi.SideInputOperator:
    """Key 11 has no profile at first: its records wait; key 10's are released."""
    return lake.operator(
        main=main or dsi.MainInput("transactions", key="customer_id"),
        side_inputs={
            "profile": dsi.SideInput.map(
                "profiles", key="customer_id", missing=dsi.Wait(DAY, then="null")
            )
        },
        fn=released,
        main_output="enriched",
        schema_mode="merge",
    )


def sql(lake: Lake, statement: str) -> None:
    lake.spark.sql(statement.format(t=sql_table(lake.storage.table_uri("transactions"))))


def spark_table(lake: Lake, rows: list[tuple], ddl: str, **properties: str) -> None:
    writer = lake.spark.createDataFrame(rows, ddl).coalesce(1).write.format("delta")
    for key, value in properties.items():
        writer = writer.option(key, value)
    writer.save(lake.storage.table_uri("transactions"))


def spark_append(lake: Lake, rows: list[tuple], ddl: str) -> None:
    frame = lake.spark.createDataFrame(rows, ddl).coalesce(1)
    frame.write.format("delta").mode("append").save(lake.storage.table_uri("transactions"))


def delta_reads(lake: Lake, *columns: str) -> list[tuple]:
    """The main table's rows as Delta itself reads them now (the oracle)."""
    frame = lake.spark.read.format("delta").load(lake.storage.table_uri("transactions"))
    values = [as_text(frame, c) for c in columns]
    return sorted(tuple(r) for r in frame.select("tx_id", *values).collect())


def wait_then_release(lake: Lake, op: dsi.SideInputOperator, change: Any) -> None:
    """Batch 1: record 1 released, record 2 waits. Then ``change()`` (the schema change,
    record 3 of key 10 and record 4 of key 12, in the new schema); batch 2 releases 3
    while 2 still waits and 4 joins it (the buffer written in the new schema); the
    profiles of keys 11 and 12 arrive; batch 3 releases 2 and 4."""
    put(lake, "profiles", [(10, "ann")], PROFILES)
    lake.run(op)
    assert lake.rows("enriched", "tx_id") == [(1,)]
    change()
    lake.run(op)
    assert lake.rows("enriched", "tx_id") == [(1,), (3,)], "key 10 blocked by key 11's wait"
    put(lake, "profiles", [(11, "bo"), (12, "cy")], PROFILES)
    lake.run(op)
    accounted(lake, op, [1, 2, 3, 4])


# --- column mapping: rename, drop (delta-spark) ---------------------------------------------


@spark_only
def test_a_column_renamed_under_column_mapping_follows_its_field_id(lake):
    """The issue's example: ``amount`` renamed ``amt`` while record 2 waits. Delta reads
    record 2 as ``amt=2.0``; so must the output (it was ``amount=None, amt=None``)."""
    mapped = {"delta.columnMapping.mode": "name"}
    spark_table(
        lake, [(1, 10, 1.0), (2, 11, 2.0)], "tx_id long, customer_id long, amount double", **mapped
    )
    op = waiting_op(lake)

    def rename() -> None:
        sql(lake, "ALTER TABLE {t} RENAME COLUMN amount TO amt")
        spark_append(lake, [(3, 10, 3.0), (4, 12, 4.0)], "tx_id long, customer_id long, amt double")

    wait_then_release(lake, op, rename)
    assert delta_reads(lake, "amt") == [(1, "1.0"), (2, "2.0"), (3, "3.0"), (4, "4.0")]
    out = {r[0]: r[1:] for r in lake.rows("enriched", "tx_id", "amt", "name")}
    assert out[2] == ("2.0", "bo")
    assert out[3] == ("3.0", "ann")


@spark_only
def test_a_column_dropped_and_added_again_under_column_mapping_is_another_column(lake):
    """``amount`` dropped, then a new ``amount`` added: a new field id. Delta reads record
    2's ``amount`` as null; the buffered 2.0 must not resurface in the new column."""
    mapped = {"delta.columnMapping.mode": "name"}
    spark_table(
        lake, [(1, 10, 1.0), (2, 11, 2.0)], "tx_id long, customer_id long, amount double", **mapped
    )
    op = waiting_op(lake)

    def drop_and_add() -> None:
        sql(lake, "ALTER TABLE {t} DROP COLUMN amount")
        sql(lake, "ALTER TABLE {t} ADD COLUMNS (amount double)")
        spark_append(
            lake, [(3, 10, 30.0), (4, 12, 40.0)], "tx_id long, customer_id long, amount double"
        )

    wait_then_release(lake, op, drop_and_add)
    assert delta_reads(lake, "amount") == [(1, None), (2, None), (3, "30.0"), (4, "40.0")]
    out = {r[0]: r[1:] for r in lake.rows("enriched", "tx_id", "amount", "name")}
    assert out[2] == (None, "bo")
    assert out[3] == ("30.0", "ann")


# --- type widening (delta-spark) --------------------------------------------------------------


@spark_only
def test_a_type_widened_while_a_record_waits_is_cast_and_blocks_no_key(lake):
    """The issue's second example: ``v`` int -> bigint. Every later run failed with
    "Cannot append to table ... buffer", other keys included."""
    widening = {"delta.enableTypeWidening": "true"}
    spark_table(lake, [(1, 10, 1), (2, 11, 2)], "tx_id long, customer_id long, v int", **widening)
    op = waiting_op(lake)

    def widen() -> None:
        sql(lake, "ALTER TABLE {t} ALTER COLUMN v TYPE BIGINT")
        spark_append(
            lake, [(3, 10, 2**40), (4, 12, -(2**40))], "tx_id long, customer_id long, v bigint"
        )

    wait_then_release(lake, op, widen)
    assert lake.rows("enriched", "tx_id", "v") == delta_reads(lake, "v")
    assert delta_reads(lake, "v") == [(1, "1"), (2, "2"), (3, str(2**40)), (4, str(-(2**40)))]


@spark_only
def test_float_to_double_and_date_to_timestamp_ntz_are_carried_over(lake):
    widening = {"delta.enableTypeWidening": "true", "delta.feature.timestampNtz": "supported"}
    ddl = "tx_id long, customer_id long, f float, d date"
    day = dt.date(2024, 5, 1)
    spark_table(lake, [(1, 10, 0.5, day), (2, 11, 1.25, day)], ddl, **widening)
    op = waiting_op(lake)

    def widen() -> None:
        sql(lake, "ALTER TABLE {t} ALTER COLUMN f TYPE DOUBLE")
        sql(lake, "ALTER TABLE {t} ALTER COLUMN d TYPE TIMESTAMP_NTZ")
        later = dt.datetime(2024, 5, 2, 12)
        spark_append(
            lake,
            [(3, 10, 0.1, later), (4, 12, 0.2, later)],
            "tx_id long, customer_id long, f double, d timestamp_ntz",
        )

    wait_then_release(lake, op, widen)
    # Record 1 was released before the change (a date then); 2 and 3 after, as Delta reads them.
    assert lake.rows("enriched", "tx_id", "f", "d")[1:] == delta_reads(lake, "f", "d")[1:]
    assert delta_reads(lake, "f", "d")[1] == (2, "1.25", "2024-05-01 00:00:00")


@spark_only
def test_reorder_and_nullability_change_carry_the_records_as_they_are(lake):
    """``amount`` NOT NULL made nullable and moved first while record 2 waits."""
    sql(
        lake,
        "CREATE TABLE {t} (tx_id long, customer_id long, amount double NOT NULL) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
    )
    sql(lake, "INSERT INTO {t} VALUES (1, 10, 1.0), (2, 11, 2.0)")
    op = waiting_op(lake)

    def reorder() -> None:
        sql(lake, "ALTER TABLE {t} ALTER COLUMN amount DROP NOT NULL")
        sql(lake, "ALTER TABLE {t} ALTER COLUMN amount FIRST")
        sql(lake, "INSERT INTO {t} (amount, tx_id, customer_id) VALUES (NULL, 3, 10), (4.0, 4, 12)")

    wait_then_release(lake, op, reorder)
    assert delta_reads(lake, "amount") == [(1, "1.0"), (2, "2.0"), (3, None), (4, "4.0")]
    assert lake.rows("enriched", "tx_id", "amount") == delta_reads(lake, "amount")


# --- the bridge: added columns, declared schemas ----------------------------------------------


def test_a_column_added_while_a_record_waits_is_null_for_it(lake):
    """delta-rs's schema merge adds ``channel``: record 2 is read as ``channel=None``."""
    put(
        lake,
        "transactions",
        [(1, 10, 1.0), (2, 11, 2.0)],
        "tx_id long, customer_id long, amount double",
    )
    op = waiting_op(lake)

    def add() -> None:
        import pyarrow as pa

        table = pa.table(
            {
                "tx_id": [3, 4],
                "customer_id": [10, 12],
                "amount": [3.0, 4.0],
                "channel": ["web", "app"],
            }
        )
        write_deltalake(
            lake.storage.table_uri("transactions"), table, mode="append", schema_mode="merge"
        )

    wait_then_release(lake, op, add)
    assert lake.rows("enriched", "tx_id", "amount", "channel") == [
        (1, "1.0", None),
        (2, "2.0", None),
        (3, "3.0", "web"),
        (4, "4.0", "app"),
    ]


def landed(folder: Path, schema: str) -> dsi.MainInput:
    return dsi.MainInput.files(str(folder), format="json", schema=schema, key="customer_id")


def land(folder: Path, name: str, lines: list[str]) -> None:
    (folder / name).write_text("\n".join(lines) + "\n")


def test_a_declared_type_that_cannot_hold_a_waiting_value_is_refused_naming_it(lake, tmp_path):
    """Landed files, ``amount`` declared double then bigint while record 2 (2.5) waits: the
    cast would lose 0.5. Refused, naming the main input and the column; declaring a type
    that holds the value (double again) releases every record with its value."""
    folder = tmp_path / "landed"
    folder.mkdir()
    land(
        folder,
        "a.json",
        [
            '{"tx_id": 1, "customer_id": 10, "amount": 1.0}',
            '{"tx_id": 2, "customer_id": 11, "amount": 2.5}',
        ],
    )
    put(lake, "profiles", [(10, "ann")], PROFILES)
    before = waiting_op(lake, landed(folder, "tx_id long, customer_id long, amount double"))
    lake.run(before)
    land(folder, "b.json", ['{"tx_id": 3, "customer_id": 10, "amount": 3}'])
    narrowed = waiting_op(lake, landed(folder, "tx_id long, customer_id long, amount bigint"))
    with (
        refused(
            dsi.errors.MainInputDataError,
            "'landed'",
            "'amount'",
            "double to bigint",
            "2.5",
            fix="double again",
        ),
        nothing_committed(lake, narrowed),
    ):
        lake.run(narrowed)
    put(lake, "profiles", [(11, "bo")], PROFILES)
    lake.run(before)
    accounted(lake, before, [1, 2, 3])
    assert lake.rows("enriched", "tx_id", "amount") == [(1, "1.0"), (2, "2.5"), (3, "3.0")]


def test_a_declared_type_change_that_keeps_every_waiting_value_is_carried_over(lake, tmp_path):
    """``amount`` declared double then string, columns reordered: 2.5 survives as "2.5"."""
    folder = tmp_path / "landed"
    folder.mkdir()
    land(
        folder,
        "a.json",
        [
            '{"tx_id": 1, "customer_id": 10, "amount": 1.0}',
            '{"tx_id": 2, "customer_id": 11, "amount": 2.5}',
        ],
    )
    put(lake, "profiles", [(10, "ann")], PROFILES)
    lake.run(waiting_op(lake, landed(folder, "tx_id long, customer_id long, amount double")))
    op = waiting_op(lake, landed(folder, "amount string, customer_id long, tx_id long"))
    land(
        folder,
        "b.json",
        [
            '{"tx_id": 3, "customer_id": 10, "amount": "three"}',
            '{"tx_id": 4, "customer_id": 12, "amount": "four"}',
        ],
    )
    lake.run(op)
    assert lake.rows("enriched", "tx_id") == [(1,), (3,)]
    put(lake, "profiles", [(11, "bo"), (12, "cy")], PROFILES)
    lake.run(op)
    accounted(lake, op, [1, 2, 3, 4])
    out = {r[0]: r[1] for r in lake.rows("enriched", "tx_id", "amount")}
    assert (out[2], out[3], out[4]) == ("2.5", "three", "four")


def test_a_type_mismatch_alone_does_not_suggest_merging_which_changes_no_type(spark):
    """The issue saw the suggested ``schema_mode="merge"`` fail the same way."""
    from dagster_sideinputs.delta.schema import plan_append

    table = T.StructType([T.StructField("v", T.IntegerType())])
    data = T.StructType([T.StructField("v", T.LongType())])
    with refused(
        dsi.errors.SchemaMismatchError, "'v' is bigint in the data but int", fix="cast"
    ) as err:
        plan_append(data, table, table="out", merge=True)
    assert "schema_mode" not in (err.value.fix or "")
    extra = T.StructType([*data.fields, T.StructField("w", T.StringType())])
    with refused(dsi.errors.SchemaMismatchError, "'w'", fix='schema_mode="merge"'):
        plan_append(extra, table, table="out", merge=False)


# --- nested changes: fields of structs, of structs in arrays and maps -----------------------
# Before, any of them refused every batch with a fix ("declare a type that holds them")
# that Delta cannot apply: the operator was stuck until the change was undone.

MAPPED = {"delta.columnMapping.mode": "name"}


@spark_only
def test_a_nested_field_renamed_under_column_mapping_follows_its_field_id(lake):
    """``detail.amount`` renamed ``amt`` and ``detail.channel`` added while record 2 waits:
    Delta reads record 2's ``detail`` as ``{amt: 2.0, channel: null}``; so must the output."""
    ddl = "tx_id long, customer_id long, detail struct<amount: double>"
    spark_table(lake, [(1, 10, (1.0,)), (2, 11, (2.0,))], ddl, **MAPPED)
    op = waiting_op(lake)

    def rename() -> None:
        sql(lake, "ALTER TABLE {t} RENAME COLUMN detail.amount TO amt")
        sql(lake, "ALTER TABLE {t} ADD COLUMNS (detail.channel string)")
        spark_append(
            lake,
            [(3, 10, (3.0, "web")), (4, 12, (4.0, "app"))],
            "tx_id long, customer_id long, detail struct<amt: double, channel: string>",
        )

    wait_then_release(lake, op, rename)
    oracle = delta_reads(lake, "detail")
    assert oracle[1] == (2, '{"amt":2.0,"channel":null}')
    # Record 1 was released before the change (``amount`` then); 2, 3, 4 as Delta reads them.
    assert lake.rows("enriched", "tx_id", "detail")[1:] == oracle[1:]


@spark_only
def test_nested_fields_dropped_under_column_mapping_are_gone_and_one_added_again_is_new(lake):
    """``detail.channel`` dropped, ``detail.note`` dropped and added again (a new field id):
    Delta reads record 2's ``detail`` as ``{amount: 2.0, note: null}``; the buffered "b"
    must not resurface in the new ``note``."""
    ddl = (
        "tx_id long, customer_id long, detail struct<amount: double, note: string, channel: string>"
    )
    spark_table(lake, [(1, 10, (1.0, "a", "web")), (2, 11, (2.0, "b", "app"))], ddl, **MAPPED)
    op = waiting_op(lake)

    def drop() -> None:
        sql(lake, "ALTER TABLE {t} DROP COLUMN detail.channel")
        sql(lake, "ALTER TABLE {t} DROP COLUMN detail.note")
        sql(lake, "ALTER TABLE {t} ADD COLUMNS (detail.note string)")
        spark_append(
            lake,
            [(3, 10, (3.0, "c")), (4, 12, (4.0, "d"))],
            "tx_id long, customer_id long, detail struct<amount: double, note: string>",
        )

    wait_then_release(lake, op, drop)
    oracle = delta_reads(lake, "detail")
    assert oracle[1] == (2, '{"amount":2.0,"note":null}')
    assert lake.rows("enriched", "tx_id", "detail")[1:] == oracle[1:]


@spark_only
def test_fields_added_and_widened_in_structs_of_an_array_and_a_map_are_carried(lake):
    """``items.element.qty`` and ``extras.value.note`` added, ``extras.value.n`` widened
    int -> bigint (Delta's type widening) while record 2 waits."""
    ddl = "tx_id long, customer_id long, items array<struct<sku: string>>, " + (
        "extras map<string, struct<n: int>>"
    )
    rows = [(1, 10, [("a",)], {"k": (1,)}), (2, 11, [("b",), ("c",)], {"k": (2,)})]
    spark_table(lake, rows, ddl, **{"delta.enableTypeWidening": "true"})
    op = waiting_op(lake)

    def change() -> None:
        sql(lake, "ALTER TABLE {t} ADD COLUMNS (items.element.qty int, extras.value.note string)")
        sql(lake, "ALTER TABLE {t} ALTER COLUMN extras.value.n TYPE BIGINT")
        spark_append(
            lake,
            [(3, 10, [("d", 1)], {"k": (2**40, "x")}), (4, 12, None, {})],
            "tx_id long, customer_id long, items array<struct<sku: string, qty: int>>, "
            "extras map<string, struct<n: bigint, note: string>>",
        )

    wait_then_release(lake, op, change)
    oracle = delta_reads(lake, "items", "extras")
    assert oracle[1] == (
        2,
        '[{"sku":"b","qty":null},{"sku":"c","qty":null}]',
        '{"k":{"n":2,"note":null}}',
    )
    assert lake.rows("enriched", "tx_id", "items", "extras")[1:] == oracle[1:]


def test_a_field_added_inside_a_struct_while_a_record_waits_is_null_for_it(lake):
    """delta-rs's schema merge adds ``detail.channel``: delta-rs reads record 2 as
    ``{amount: 2.0, channel: null}``."""
    import pyarrow as pa
    from deltalake import DeltaTable

    uri = lake.storage.table_uri("transactions")

    def table(ids: list[int], keys: list[int], details: list[dict], kind: pa.DataType) -> pa.Table:
        return pa.table({"tx_id": ids, "customer_id": keys, "detail": pa.array(details, type=kind)})

    narrow = pa.struct([("amount", pa.float64())])
    write_deltalake(uri, table([1, 2], [10, 11], [{"amount": 1.0}, {"amount": 2.0}], narrow))
    op = waiting_op(lake)

    def add() -> None:
        wide = pa.struct([("amount", pa.float64()), ("channel", pa.string())])
        details = [{"amount": 3.0, "channel": "web"}, {"amount": 4.0, "channel": "app"}]
        rows = table([3, 4], [10, 12], details, wide)
        write_deltalake(uri, rows, mode="append", schema_mode="merge")

    wait_then_release(lake, op, add)
    oracle = sorted(
        (r["tx_id"], json.dumps(r["detail"], separators=(",", ":")))
        for r in DeltaTable(uri).to_pyarrow_table().to_pylist()
    )
    assert oracle[1] == (2, '{"amount":2.0,"channel":null}')
    assert lake.rows("enriched", "tx_id", "detail")[1:] == oracle[1:]


def test_a_nested_declared_type_that_cannot_hold_a_waiting_value_is_refused_naming_it(
    lake, tmp_path
):
    """Landed files, ``detail.amount`` declared double then bigint (and ``detail.note``
    dropped) while record 2 (2.5) waits: refused naming the nested field; declaring the
    old type again releases every record with its value."""
    folder = tmp_path / "landed"
    folder.mkdir()
    land(
        folder,
        "a.json",
        [
            '{"tx_id": 1, "customer_id": 10, "detail": {"amount": 1.0, "note": "a"}}',
            '{"tx_id": 2, "customer_id": 11, "detail": {"amount": 2.5, "note": "b"}}',
        ],
    )
    put(lake, "profiles", [(10, "ann")], PROFILES)
    schema = "tx_id long, customer_id long, detail struct<amount: double, note: string>"
    before = waiting_op(lake, landed(folder, schema))
    lake.run(before)
    land(folder, "b.json", ['{"tx_id": 3, "customer_id": 10, "detail": {"amount": 3}}'])
    narrowed = waiting_op(
        lake, landed(folder, "tx_id long, customer_id long, detail struct<amount: bigint>")
    )
    with (
        refused(
            dsi.errors.MainInputDataError,
            "'landed'",
            "'detail.amount'",
            "double to bigint",
            "2.5",
            fix="'detail.amount' a type that holds its double values (declare it double again",
        ),
        nothing_committed(lake, narrowed),
    ):
        lake.run(narrowed)
    put(lake, "profiles", [(11, "bo")], PROFILES)
    lake.run(before)
    accounted(lake, before, [1, 2, 3])
    assert lake.rows("enriched", "tx_id", "detail") == [
        (1, '{"amount":1.0,"note":"a"}'),
        (2, '{"amount":2.5,"note":"b"}'),
        (3, '{"amount":3.0,"note":null}'),
    ]


@spark_only
def test_a_nested_field_missing_by_name_after_its_log_is_gone_is_refused_with_a_fix_that_works(
    lake,
):
    """``detail.amount`` renamed ``amt`` while record 2 waits, then the main input's log
    of the version the buffer was last written in is cleaned up: whether the field was
    renamed or dropped cannot be told. Refused naming the nested field; renaming it back
    (the fix) releases every record with its value."""
    ddl = "tx_id long, customer_id long, detail struct<amount: double>"
    every = {**MAPPED, "delta.checkpointInterval": "1"}
    spark_table(lake, [(1, 10, (1.0,)), (2, 11, (2.0,))], ddl, **every)
    op = waiting_op(lake)
    put(lake, "profiles", [(10, "ann")], PROFILES)
    lake.run(op)
    sql(lake, "ALTER TABLE {t} RENAME COLUMN detail.amount TO amt")
    spark_append(lake, [(3, 10, (3.0,)), (4, 12, (4.0,))], ddl.replace("amount", "amt"))
    log = Path(lake.storage.table_uri("transactions").removeprefix("file://")) / "_delta_log"
    for gone in log.glob(f"{0:020d}.*"):  # the version batch 1 read up to
        gone.unlink()
    with (
        refused(
            dsi.errors.MainInputDataError,
            "'transactions'",
            "nested field 'detail.amount'",
            fix="its name 'amount' back",
        ),
        nothing_committed(lake, op),
    ):
        lake.run(op)
    sql(lake, "ALTER TABLE {t} RENAME COLUMN detail.amt TO amount")  # the fix
    lake.run(op)
    put(lake, "profiles", [(11, "bo"), (12, "cy")], PROFILES)
    lake.run(op)
    accounted(lake, op, [1, 2, 3, 4])
    assert lake.rows("enriched", "tx_id", "detail") == delta_reads(lake, "detail")
    assert delta_reads(lake, "detail")[1] == (2, '{"amount":2.0}')
