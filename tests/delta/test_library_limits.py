"""What the Delta libraries still lack, which is why we keep code of our own.

Each test checks that a library still does not do what one of our modules does instead
(docs/DECISIONS.md says why each is kept). It fails the day the library catches up,
saying which module of ours can then go and how: a reminder to delete our code, not a
bug in it. Upgrading deltalake or delta-spark runs them again.
"""

import inspect
import json
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import delta.connect.tables
import delta.tables
import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, PostCommitHookProperties

from tests.delta.test_spark_direct import jobs_of

APP = "library-limits"
ROWS = pa.table({"k": pa.array([1], pa.int64())})
HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
"""The bridge's commits run delta-rs's post-commit hooks off (delta/bridge/commit.py)."""

SHALLOW, DEEP = 10, 10_000
"""Log lengths compared: a new table's, and one after 10,000 batches (log retention keeps
30 days of commit files: a batch every few minutes for a month)."""
GROWTH = 3.0
"""How much slower at DEEP than at SHALLOW still counts as growing. Measured with
deltalake 1.6.6 on 2 cores (the fastest of 15 calls each): 8-9x for the lookup (about 1.1
against 9.5 ms), 15-19x for the commit (about 1.0 against 18 ms); a library whose cost no
longer depends on the log's length would stay near 1x."""
ROUNDS = 15


def table_of_depth(path: Path, versions: int) -> DeltaTable:
    """A table of ``versions`` versions, opened: one row written by delta-rs with our
    application transaction, then empty commits (a ``commitInfo`` only, as
    bench/batches.py ``deepen_logs`` writes them), and a checkpoint at the newest version
    (the bridge writes one every 10 versions): only the log folder's length differs
    between two such tables. The checkpoint is version 0's, copied: empty commits leave
    the state unchanged, and delta-rs would take seconds to write it at 10,000 versions."""
    write_deltalake(
        str(path),
        ROWS,
        commit_properties=CommitProperties(app_transactions=[Transaction(APP, 0)]),
    )
    DeltaTable(str(path)).create_checkpoint()
    log = path / "_delta_log"
    line = json.dumps({"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}})
    for version in range(1, versions):
        (log / f"{version:020d}.json").write_text(line + "\n")
    newest = versions - 1
    shutil.copy(log / f"{0:020d}.checkpoint.parquet", log / f"{newest:020d}.checkpoint.parquet")
    last = json.loads((log / "_last_checkpoint").read_text())
    (log / "_last_checkpoint").write_text(json.dumps({**last, "version": newest}))
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version(APP)) == (newest, 0)
    return table


def assert_still_grows(seconds: dict[str, float], doing: str, then: str) -> None:
    """Fail, saying what can then go (``then``), once delta-rs ``doing`` on a kept handle
    no longer costs more than GROWTH times as much deep in the log as near its start."""
    growth = seconds["deep"] / seconds["shallow"]
    assert growth > GROWTH, (
        f"deltalake {deltalake.__version__} now {doing} on a kept handle in "
        f"{1000 * seconds['deep']:.1f} ms at {DEEP:,} versions against "
        f"{1000 * seconds['shallow']:.1f} ms at {SHALLOW} ({growth:.1f}x): its cost no "
        f"longer grows with the log. {then}"
    )


def fastest_seconds(
    tables: dict[str, tuple[Path, DeltaTable]],
    prepare: Callable[[Path, DeltaTable, int], object],
    step: Callable[[DeltaTable, int, object], None],
) -> dict[str, float]:
    """The fastest of ``ROUNDS`` calls of ``step`` on each table, the tables taking turns
    in each round; ``prepare`` (untimed) runs before each step and gives it what it
    returns. The fastest, not the median: a loaded machine only adds time, and what it
    adds to the few milliseconds at SHALLOW moved the medians' ratio from 9x to 4x."""
    times: dict[str, list[float]] = {name: [] for name in tables}
    for round_ in range(1, ROUNDS + 1):
        for name, (root, table) in tables.items():
            prepared = prepare(root, table, round_)
            started = time.perf_counter()
            step(table, round_, prepared)
            times[name].append(time.perf_counter() - started)
    return {name: min(values) for name, values in times.items()}


@pytest.fixture
def shallow_and_deep(tmp_path) -> dict[str, tuple[Path, DeltaTable]]:
    roots = {"shallow": (tmp_path / "shallow", SHALLOW), "deep": (tmp_path / "deep", DEEP)}
    return {name: (root, table_of_depth(root, n)) for name, (root, n) in roots.items()}


def test_delta_rs_still_looks_a_transaction_up_in_time_that_grows_with_the_log(
    shallow_and_deep,
):
    """What a bridge batch asks of each table before it writes (is this batch's
    transaction there?), on a kept handle: ``update_incremental`` (one new commit since
    the last round, as after a batch) and ``transaction_version``."""

    def one_more_commit(root: Path, table: DeltaTable, round_: int) -> None:
        log = root / "_delta_log"
        newest = max(int(p.name[:20]) for p in log.glob("*.json"))
        line = json.dumps({"commitInfo": {"timestamp": int(time.time() * 1000)}})
        (log / f"{newest + 1:020d}.json").write_text(line + "\n")

    def look_up(table: DeltaTable, round_: int, _: object) -> None:
        table.update_incremental()
        assert table.transaction_version(APP) == 0

    seconds = fastest_seconds(shallow_and_deep, one_more_commit, look_up)
    assert_still_grows(
        seconds,
        "looks a transaction up",
        "The bridge can then read local tables' metadata "
        "through kept delta-rs handles instead of our log reader's probes "
        "(dagster_sideinputs/delta/log/reader.py, reached through "
        "delta/bridge/table.py `local_log`; delta-spark still needs delta/log/). Confirm "
        "with bench/library_flatness.py, then update docs/DECISIONS.md, 'A batch's Delta "
        "bookkeeping at any history depth'.",
    )


def test_delta_rs_still_commits_in_time_that_grows_with_the_log(shallow_and_deep):
    """The bridge's commit through delta-rs (``create_write_transaction`` of a staged
    file with the batch's application transaction, hooks off) on a kept handle."""
    schema = shallow_and_deep["shallow"][1].schema()

    def stage_file(root: Path, table: DeltaTable, round_: int) -> AddAction:
        table.update_incremental()  # the handle at the commit it made the round before
        path = f"part-{round_:05d}.parquet"
        pq.write_table(ROWS, root / path)
        stats = {
            "numRecords": 1,
            "minValues": {"k": 1},
            "maxValues": {"k": 1},
            "nullCount": {"k": 0},
        }
        size = (root / path).stat().st_size
        return AddAction(path, size, {}, int(time.time() * 1000), True, json.dumps(stats))

    def commit(table: DeltaTable, round_: int, add: object) -> None:
        assert isinstance(add, AddAction)
        table.create_write_transaction(
            [add],
            "append",
            schema,
            commit_properties=CommitProperties(app_transactions=[Transaction(APP, round_)]),
            post_commithook_properties=HOOKS,
        )

    seconds = fastest_seconds(shallow_and_deep, stage_file, commit)
    for _, table in shallow_and_deep.values():
        table.update_incremental()
        assert table.transaction_version(APP) == ROUNDS
    assert_still_grows(
        seconds,
        "commits",
        "Our own commit files "
        "(dagster_sideinputs/delta/bridge/log_commit.py) can then go: commit every write "
        "through `create_write_transaction` on a kept handle. Confirm with "
        "bench/library_flatness.py, then update docs/DECISIONS.md, 'Plain commits to "
        "local tables are ours'.",
    )


def test_delta_rs_history_still_misnumbers_versions_around_a_commit_without_commit_info(
    tmp_path,
):
    """``commitInfo`` is optional in a commit (the Delta protocol dates such a commit by
    its file's modification time). ``DeltaTable.history()`` numbers the commit infos it
    finds down from the latest version, so a commit without one shifts every older
    version by one and is itself left out: bridge/table.py ``commit_timestamps`` reads
    the commit files itself."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, ROWS)  # version 0, with commitInfo
    log = tmp_path / "t" / "_delta_log"
    (log / f"{1:020d}.json").write_text(json.dumps({"txn": {"appId": APP, "version": 1}}) + "\n")
    write_deltalake(uri, ROWS, mode="append")  # version 2, with commitInfo
    history = DeltaTable(uri).history()
    numbered = {entry["version"]: entry["operationParameters"]["mode"] for entry in history}
    # Version 0's commit (the create) numbered 1, version 1 left out.
    assert numbered == {2: "Append", 1: "ErrorIfExists"}, (
        f"deltalake {deltalake.__version__}'s DeltaTable.history() changed: {history}. "
        "If it now numbers every commit right, dates one without commitInfo (its file's "
        "modification time) and gives inCommitTimestamp where there is one, "
        "dagster_sideinputs/delta/bridge/table.py `commit_timestamps` can ask it instead "
        "of listing _delta_log (keep its per-process cache if history() still reads "
        "every commit file on each call); update docs/DECISIONS.md."
    )


CONDITIONAL = frozenset(
    {"put", "absent", "if", "match", "etag", "conditional", "precondition", "swap", "cas"}
    | {"exclusive", "new", "atomic", "lease", "lock"}
)
"""Words in the name of a conditional write: put_if_absent, if_match, compare_and_swap,
create_new and the like (a condition as a parameter of a write: ``_extra_parameters``)."""


def _conditional(name: str) -> bool:
    words = {word.lower() for word in re.split(r"_|(?<=[a-z])(?=[A-Z])", name)}
    return bool(words & CONDITIONAL)


def _extra_parameters(cls: type, name: str) -> bool:
    """Whether a write takes anything but its paths and metadata (a condition)."""
    parameters = set(inspect.signature(getattr(cls, name)).parameters)
    return bool(parameters - {"self", "path", "src", "dest", "dst", "metadata"})


def test_deltalake_still_offers_no_conditional_object_writes(tmp_path):
    """The operator's lock lease and plan claims on an object store are create-only and
    compare-and-swap writes (delta/store/object_store.py, through obstore). deltalake's
    Python API reaches its object store only as a pyarrow filesystem, whose writes
    replace whatever is there."""
    handlers = {
        "deltalake.fs.DeltaStorageHandler": DeltaStorageHandler,
        "deltalake._internal.DeltaFileSystemHandler": deltalake._internal.DeltaFileSystemHandler,
    }
    offered = {
        f"{label}.{name}": str(inspect.signature(getattr(cls, name)))
        for label, cls in handlers.items()
        for name in dir(cls)
        if not name.startswith("_")
        and (
            _conditional(name)
            or (name.startswith(("open_output", "copy", "move")) and _extra_parameters(cls, name))
        )
    }
    exported = sorted(n for n in dir(deltalake) if _conditional(n))
    fix = (
        "If it is a create-only or compare-and-swap write on S3, GCS and Azure, "
        "dagster_sideinputs/delta/store/object_store.py can use it instead of obstore (one "
        "object-store binding less); update docs/DECISIONS.md."
    )
    news = f"deltalake {deltalake.__version__} may now offer a conditional object write"
    assert offered == {}, f"{news}: {offered}. {fix}"
    assert exported == [], f"{news}: {exported}. {fix}"
    # What it does offer: each write onto an existing object replaces it. (Through the
    # Rust handler DeltaStorageHandler wraps: in deltalake 1.6.6 the wrapper's copy_file
    # passes a keyword the handler does not take, and pyarrow's streams hand its
    # open_output_stream buffers it refuses.)
    handler = deltalake._internal.DeltaFileSystemHandler(str(tmp_path))

    def write(path: str, data: bytes) -> None:
        stream = handler.open_output_stream(path)
        stream.write(data)
        stream.close()  # type: ignore[attr-defined]  # (missing from deltalake's stub)

    operations: dict[str, Callable[[str, str], None]] = {
        "open_output_stream": lambda new, held: write(held, b"new"),
        "copy_file": handler.copy_file,
        "move_file": handler.move_file,
    }
    for name, operation in operations.items():
        new, held = f"{name}.new", f"{name}.lease"  # apart: a copy may hard-link the two
        (tmp_path / new).write_bytes(b"new")
        (tmp_path / held).write_bytes(b"held")
        operation(new, held)
        assert (tmp_path / held).read_bytes() == b"new", (
            f"{news}: its {name} no longer replaces an existing object. {fix}"
        )


def test_delta_spark_python_api_still_gives_no_transactions_or_live_files():
    """delta-spark keeps a table's live files and application transactions in its JVM;
    its Python ``DeltaTable`` (classic and Spark Connect) reads neither, so the delta-spark
    engine reads ``_delta_log`` itself (delta/log/)."""
    wanted = re.compile(r"transaction|txn|appid|files|snapshot|actions|state", re.IGNORECASE)
    offered = sorted(
        f"{cls.__module__}.DeltaTable.{name}"
        for cls in (delta.tables.DeltaTable, delta.connect.tables.DeltaTable)
        for name in dir(cls)
        if not name.startswith("_") and wanted.search(name)
    )
    assert offered == [], (
        f"delta-spark's Python DeltaTable now has {offered}. If they give a version's live "
        "files with their statistics and its application transactions, over Spark Connect "
        "too and without reconstructing the state in Spark jobs, the delta-spark engine "
        "(dagster_sideinputs/delta/spark/engine.py) can ask them instead of our log reader "
        "(dagster_sideinputs/delta/log/); update docs/DECISIONS.md."
    )


def test_delta_spark_looks_an_appends_transaction_up_with_spark_jobs(spark, tmp_path):
    """A path-based append with ``txnAppId``/``txnVersion`` runs Spark jobs to find the
    table's transactions (delta-spark reconstructs the table's state), which a plain
    append does not: delta/spark/direct.py commits through Delta's transaction with the
    transactions our log reader found."""
    uri = str(tmp_path / "t")
    rows = spark.createDataFrame([(1,)], "k long")
    # Created by delta-spark, as the engine's tables are: its checksum file (.crc) spares
    # a plain append the state reconstruction (on a table delta-rs created, without one,
    # a plain append ran 6 jobs).
    rows.write.format("delta").save(uri)

    def append(transaction: int | None) -> Callable[[], None]:
        writer = rows.write.format("delta").mode("append")
        if transaction is not None:
            writer = writer.option("txnAppId", APP).option("txnVersion", transaction)
        return lambda: writer.save(uri)

    # Both orders, each on a new version: a state reconstructed by one append's lookup
    # serves only the version it was reconstructed for.
    group = f"library-limits-{uuid.uuid4().hex}"
    _, plain_first = jobs_of(spark, f"{group}-plain-1", append(None))
    _, with_txn_first = jobs_of(spark, f"{group}-txn-1", append(1))
    _, with_txn_second = jobs_of(spark, f"{group}-txn-2", append(2))
    _, plain_second = jobs_of(spark, f"{group}-plain-2", append(None))
    plain = max(plain_first, plain_second)
    with_txn = min(with_txn_first, with_txn_second)
    assert with_txn > plain, (
        f"delta-spark now appends with txnAppId in {with_txn} Spark job(s), a plain append "
        f"in {plain}: it no longer looks the transaction up with jobs of its own. "
        "dagster_sideinputs/delta/spark/direct.py's commit through Delta's transaction "
        "(py4j) can then go for appends: commit with the writer's txnAppId/txnVersion, as "
        "over Spark Connect; confirm with bench/delta_commit.py and update "
        "docs/DECISIONS.md, '*commit of a plain append*'."
    )
    table = DeltaTable(uri)  # the four appends committed (no Spark job to ask)
    assert (table.version(), table.transaction_version(APP)) == (4, 2)
