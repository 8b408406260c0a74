"""Landing-folder main inputs, buffer limits, and declaration checks."""

import datetime as dt
import json
import pickle

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from tests.core.conftest import Clock, hours, passthrough

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"


# --- landing folders ---------------------------------------------------------------------------


def land(folder, name: str, records: list[dict] | str) -> None:
    folder.mkdir(exist_ok=True)
    text = records if isinstance(records, str) else "\n".join(json.dumps(r) for r in records)
    (folder / name).write_text(text)


def landing_operator(lake, folder, *, format="json", options=None, **kwargs):
    return lake.operator(
        main=dsi.MainInput.files(
            str(folder), format=format, schema=TX, key="customer_id", options=options
        ),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=lambda main, sides: main.select("tx_id", F.col("profile.name").alias("name")),
        main_output="enriched",
        **kwargs,
    )


def test_landed_empty_files_are_counted_without_a_job(lake, tmp_path):
    """New landed files that are all empty hold no record, whatever their format: the
    batch moves past them with no Spark job counting records."""
    folder = tmp_path / "landing"
    folder.mkdir()
    lake.append("profiles", [(10, "ann")], PROFILES)
    (folder / "a.json").write_bytes(b"")
    [batch] = lake.run(landing_operator(lake, folder)).batches
    assert any("routes counted from file statistics" in note for note in batch.notes)
    assert (batch.rows_in, batch.accounted) == (0, True)


def test_landed_files_are_each_read_once(lake, tmp_path):
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land(folder, "a.json", [{"tx_id": 1, "customer_id": 10, "amount": 1.0}])
    op = landing_operator(lake, folder)
    assert lake.run(op).batches[0].rows_in == 1
    land(folder, "b.json", [{"tx_id": 2, "customer_id": 10, "amount": 2.0}])
    land(folder, "_ignored.json", [{"tx_id": 99, "customer_id": 10, "amount": 2.0}])
    assert lake.run(op).batches[0].rows_in == 1
    assert lake.run(op).batches == []
    assert lake.rows("enriched") == [(1, "ann"), (2, "ann")]


def test_corrupt_lines_and_empty_files_go_to_the_invalid_tag(lake, tmp_path):
    """A line that is not JSON is corrupt; one missing the key field has a null key; an
    empty file holds no record."""
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land(
        folder,
        "a.json",
        '{"tx_id": 1, "customer_id": 10, "amount": 1.0}\n{not json\n{"tx_id": 3, "amount": 1}\n',
    )
    land(folder, "empty.json", "")
    invalid = dsi.OutputTag("invalid_transactions")
    lake.run(
        landing_operator(
            lake,
            folder,
            routes=dsi.Routes(invalid=invalid),
        )
    )
    assert lake.rows("enriched") == [(1, "ann")]
    rows = lake.rows("invalid_transactions", "tx_id", "reason")
    assert rows == [(3, "null key 'customer_id'"), (None, "corrupt record: {not json")]


def test_corrupt_lines_without_an_invalid_tag_stop_the_batch_and_name_the_fix(lake, tmp_path):
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land(folder, "a.json", '{"tx_id": 1, "customer_id": 10, "amount": 1.0}\n{not json\n')
    with pytest.raises(
        dsi.errors.MainInputDataError, match=r"(?s)corrupt record.*invalid=dsi.OutputTag"
    ):
        lake.run(landing_operator(lake, folder))
    assert not lake.exists("enriched")


# --- buffer limits -------------------------------------------------------------------------------


def limited_operator(lake, limits, **kwargs):
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=passthrough,
        main_output="out",
        buffer=limits,
        **kwargs,
    )


def test_buffer_over_its_row_limit_fails_before_writing(lake):
    lake.append("transactions", [(i, 10, 1.0) for i in range(5)], TX)
    op = limited_operator(lake, dsi.BufferLimits(max_rows=3))
    with pytest.raises(
        dsi.errors.BufferLimitExceededError,
        match=r"(?s)5 rows \(limit 3\).*Nothing was written.*BufferLimits\(max_rows=",
    ):
        lake.run(op)
    assert op.buffer().rows() == 0
    assert not lake.exists("out")


def test_buffer_over_its_row_limit_routes_the_oldest_to_overflow(lake):
    clock = Clock()
    overflow = dsi.OutputTag("overflow")
    op = limited_operator(
        lake,
        dsi.BufferLimits(max_rows=3, on_exceed="overflow"),
        routes=dsi.Routes(overflow=overflow),
    )
    lake.append("transactions", [(1, 10, 1.0), (2, 10, 1.0)], TX)
    lake.run(op, clock)
    clock.advance(dt.timedelta(minutes=5))
    lake.append("transactions", [(3, 10, 1.0), (4, 10, 1.0), (5, 10, 1.0)], TX)
    batch = lake.run(op, clock).batches[0]
    assert batch.routes["overflow"] == 2
    assert batch.buffer_rows == 3
    assert lake.rows("overflow", "tx_id") == [(1,), (2,)]
    assert op.buffer().rows() == 3


def test_buffer_older_than_its_age_limit_fails(lake):
    clock = Clock()
    op = limited_operator(lake, dsi.BufferLimits(max_age=hours(1)))
    lake.append("transactions", [(1, 10, 1.0)], TX)
    lake.run(op, clock)
    clock.advance(hours(2))
    lake.append("transactions", [(2, 10, 1.0)], TX)
    with pytest.raises(dsi.errors.BufferLimitExceededError, match="max age 1 hour"):
        lake.run(op, clock)
    assert op.buffer().rows() == 1


def test_buffer_size_and_oldest_age_are_reported(lake):
    clock = Clock()
    op = limited_operator(lake, dsi.BufferLimits())
    lake.append("transactions", [(1, 10, 1.0)], TX)
    lake.run(op, clock)
    clock.advance(dt.timedelta(minutes=30))
    lake.append("transactions", [(2, 10, 1.0)], TX)
    batch = lake.run(op, clock).batches[0]
    assert batch.buffer_rows == 2
    assert batch.buffer_oldest_age_s == pytest.approx(1800)


# --- declarations --------------------------------------------------------------------------------


def test_declarations_are_frozen_picklable_and_readable():
    side = dsi.SideInput.map("customer_profiles", key="customer_id", missing=dsi.Wait(hours(1)))
    assert pickle.loads(pickle.dumps(side)) == side
    assert repr(side) == (
        "SideInput.map('customer_profiles', key='customer_id', "
        "missing=Wait(timeout=datetime.timedelta(seconds=3600), then='unmatched'))"
    )
    with pytest.raises(AttributeError):
        side.key = "other"  # type: ignore[misc]
    assert repr(dsi.MainInput("transactions", key="customer_id")) == (
        "MainInput('transactions', key='customer_id')"
    )
    assert repr(dsi.Window.tumbling(hours(1), time_column="ts")).startswith("Window.tumbling(")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: dsi.SideInput.map("p", key=""), "needs key="),
        (lambda: dsi.SideInput.list("p", missing="wait"), "only applies to keyed"),
        (lambda: dsi.SideInput.map("p", key="k", missing="wait"), "needs a timeout"),
        (lambda: dsi.SideInput.map("p", key="k", readiness="ready"), "readiness='ready'"),
        (lambda: dsi.SideInput.list("p", distribution="forwarded"), "forward_column"),
        (
            lambda: dsi.SideInput.map("p", key="k", window=dsi.Window.tumbling(hours(1))),
            "time column",
        ),
        (lambda: dsi.Window.sliding(hours(1), slide=hours(2)), "longer than its size"),
        (lambda: dsi.Window.sliding(hours(1), slide=dt.timedelta(minutes=25)), "not a multiple"),
        (lambda: dsi.MainInput("t", pre_keyed=dsi.KeyGroups(8)), "no key"),
        (lambda: dsi.MainInput.files("/x", schema=None), "StructType or a DDL"),  # type: ignore[arg-type]
        (lambda: dsi.OutputTag(""), "not a valid asset name"),
    ],
)
def test_bad_declarations_fail_where_they_are_written(build, message):
    with pytest.raises(dsi.DeclarationError, match=message):
        build()


def test_fresh_readiness_without_max_age_is_refused_without_dagster(lake):
    with pytest.raises(dsi.DeclarationError, match="max_age"):
        lake.operator(
            main=dsi.MainInput("t"),
            side_inputs={"r": dsi.SideInput.singleton("r", readiness="fresh")},
            fn=passthrough,
            main_output="o",
        )


def test_duplicate_output_names_are_refused(lake):
    with pytest.raises(dsi.DeclarationError, match="unique"):
        lake.operator(
            main=dsi.MainInput("t"),
            side_inputs={},
            fn=passthrough,
            main_output="o",
            side_outputs=[dsi.OutputTag("o")],
        )


@pytest.mark.each_storage(engines=False)
def test_a_second_run_of_the_same_operator_is_refused_while_one_holds_it(lake):
    from dagster_sideinputs.core.state.lock import operator_lock

    op = limited_operator(lake, dsi.BufferLimits())
    lake.append("transactions", [(1, 10, 1.0)], TX)
    with (
        operator_lock(
            op.state_uri, operator_id=op.operator_id, storage_options=lake.storage.storage_options
        ),
        pytest.raises(dsi.OperatorBusyError, match="already running"),
    ):
        lake.run(op)


# --- parquet landing folders: routes counted from footers -----------------------------------------

FOOTERS = "routes counted from file statistics"


def land_parquet(folder, name: str, table) -> None:
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(folder / f".{name}"))
    (folder / f".{name}").rename(folder / name)


def parquet_landing(lake, folder, **kwargs):
    return landing_operator(lake, folder, format="parquet", **kwargs)


def tx_table(ids, customers, **columns):
    import pyarrow as pa

    fields = {
        "tx_id": pa.array(ids, pa.int64()),
        "customer_id": pa.array(customers, pa.int64()),
        "amount": pa.array([1.0] * len(ids), pa.float64()),
    }
    fields.update(columns)
    return pa.table(fields)


def key_in_another_case():
    import pyarrow as pa

    table = tx_table([4, 5], [10, 10]).drop(["customer_id"])
    return table.append_column("Customer_Id", pa.array([10, None], pa.int64()))


def test_landed_parquet_files_releasing_every_record_are_counted_from_their_footers(lake, tmp_path):
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land_parquet(folder, "a.parquet", tx_table([1, 2], [10, 11]))
    land_parquet(folder, "b.parquet", tx_table([3], [10]))
    land_parquet(folder, "empty.parquet", tx_table([], []))
    (folder / "zero.parquet").write_bytes(b"")
    [batch] = lake.run(parquet_landing(lake, folder)).batches
    assert any(FOOTERS in note for note in batch.notes)
    assert (batch.rows_in, batch.routes["released"], batch.accounted) == (3, 3, True)
    assert lake.rows("enriched") == [(1, "ann"), (2, None), (3, "ann")]


@pytest.mark.parametrize(
    "landed",
    [
        pytest.param(lambda: tx_table([4, 5], [10, None]), id="null-key"),
        pytest.param(key_in_another_case, id="key-column-named-in-another-case"),
        pytest.param(lambda: tx_table([4, 5], [10, 10]).drop(["customer_id"]), id="no-key-column"),
    ],
)
def test_landed_parquet_footers_that_do_not_settle_the_counts_leave_them_to_a_job(
    lake, tmp_path, landed
):
    """Null keys, or a key column the footer does not name as declared (Spark reads it
    case-insensitively, or as nulls when absent): a job counts, and every record lands."""
    folder = tmp_path / "landing"
    invalid = dsi.OutputTag("invalid_transactions")
    lake.append("profiles", [(10, "ann")], PROFILES)
    land_parquet(folder, "a.parquet", landed())
    [batch] = lake.run(
        parquet_landing(
            lake,
            folder,
            routes=dsi.Routes(invalid=invalid),
        )
    ).batches
    assert not any(FOOTERS in note for note in batch.notes)
    assert batch.accounted
    assert batch.rows_in == 2
    written = lake.rows("enriched", "tx_id") + (
        lake.rows("invalid_transactions", "tx_id") if lake.exists("invalid_transactions") else []
    )
    assert sorted(written) == [(4,), (5,)]


def test_a_landed_file_that_is_not_parquet_is_still_named_when_footers_are_read(lake, tmp_path):
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land_parquet(folder, "a.parquet", tx_table([1], [10]))
    (folder / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(
        dsi.errors.CorruptDataFileError,
        match=r"(?s)broken\.parquet.*Nothing was written.*landing folder",
    ):
        lake.run(parquet_landing(lake, folder))
    assert not lake.exists("enriched")
    (folder / "broken.parquet").unlink()
    [batch] = lake.run(parquet_landing(lake, folder)).batches
    assert any(FOOTERS in note for note in batch.notes)
    assert lake.rows("enriched") == [(1, "ann")]


def test_landed_parquet_read_with_options_not_known_to_keep_rows_is_counted_by_a_job(
    lake, tmp_path
):
    """A read option not known to keep every row the footers count
    (``recursiveFileLookup`` here) leaves the counting to a job."""
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land_parquet(folder, "a.parquet", tx_table([1, 2], [10, 10]))
    options = {"recursiveFileLookup": "true", "datetimeRebaseMode": "CORRECTED"}
    op = parquet_landing(lake, folder, options=options)
    [batch] = lake.run(op).batches
    assert not any(FOOTERS in note for note in batch.notes)
    assert lake.rows("enriched") == [(1, "ann"), (2, "ann")]


@pytest.mark.parametrize(
    "option",
    [
        "pathGlobFilter",
        "PATHGLOBFILTER",
        "modifiedAfter",
        "ignoreCorruptFiles",
        "ignoreMissingFiles",
    ],
)
def test_reader_options_that_skip_landed_files_are_refused(option):
    with pytest.raises(dsi.DeclarationError, match=f"(?s){option}.*recorded as read") as info:
        dsi.MainInput.files("/data/in", format="json", schema=TX, options={option: "x"})
    assert "read exactly once" in (info.value.fix or "")


def test_a_session_that_ignores_corrupt_files_still_names_a_corrupt_landed_file(lake, tmp_path):
    """``spark.sql.files.ignoreCorruptFiles`` would drop the file's records while the ledger
    recorded it as read: landed files are read with it off."""
    folder = tmp_path / "landing"
    lake.append("profiles", [(10, "ann")], PROFILES)
    land_parquet(folder, "a.parquet", tx_table([1], [10]))
    (folder / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    key = "spark.sql.files.ignoreCorruptFiles"
    lake.spark.conf.set(key, "true")
    try:
        with pytest.raises(dsi.errors.CorruptDataFileError, match=r"broken\.parquet"):
            lake.run(parquet_landing(lake, folder))
    finally:
        lake.spark.conf.unset(key)
    assert not lake.exists("enriched")
