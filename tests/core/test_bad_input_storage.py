"""Bad-input catalogue, storage faults outside Spark: the lake's object store refuses the
credentials or goes away, at the lease, reading the state, committing, releasing.

Against the S3 test server made to check credentials (moto's IAM authentication: 403
``InvalidAccessKeyId`` / ``SignatureDoesNotMatch``, and a secret it can rotate mid-run),
reached through a TCP proxy the tests stop and start (the store down and back, its data
kept). Every case: a :class:`StorageError` naming the store, the operation and a fix that
works (never obstore's or delta-rs's own exception, never the lock's release hiding the
first error), nothing committed by the failed batch (or the tables that hold it named),
and after the fix and a rerun every main record exactly once. The delta-rs bridge: the
faults are met by obstore and delta-rs, the same under both engines.
"""

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.engine import DeltaEngine
from dagster_sideinputs.delta.store.lease import ObjectStoreLease
from tests.core.catalogue import PROFILES, TX, arrow_schema, nothing_committed, refused
from tests.core.catalogue import operator as catalogue_operator
from tests.core.conftest import Lake
from tests.servers.proxy import TcpProxy
from tests.servers.s3 import SECRET_KEY, S3Server

pytestmark = pytest.mark.s3

BIG = dsi.OutputTag("big")
BUCKET = "guarded"  # its own bucket: Hadoop caches one s3a filesystem per bucket and JVM
IDS = [1, 2, 3]


@dataclasses.dataclass
class Store:
    """The credential-checking S3 server, and the proxy every client reaches it through."""

    server: S3Server
    proxy: TcpProxy

    def options(self, **override: str) -> dict[str, str]:
        # One retry: a store that is down fails in a second, not after object_store's
        # default 10 retries (delta-rs and, through the same key, obstore).
        return {
            **self.server.storage_options,
            "AWS_ENDPOINT_URL": self.proxy.url,
            "max_retries": "1",
            **override,
        }

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        self.proxy.stop()
        try:
            yield
        finally:
            self.proxy.start()


@pytest.fixture(scope="module")
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The module's own server and proxy, on the module's ``BUCKET``: a module reusing this
    fixture names another bucket, or the JVM's cached s3a filesystem of the bucket would
    still reach the earlier module's proxy (stopped by then)."""
    with (
        S3Server(getattr(request.module, "BUCKET", BUCKET), check_credentials=True) as server,
        TcpProxy(server.host, server.port) as proxy,
    ):
        yield Store(server, proxy)


@pytest.fixture
def lake(spark, store: Store) -> Lake:
    """A fresh prefix on the guarded store, under the bridge, with two profiles and three
    transactions (customer 12 has no profile)."""
    made = Lake(
        spark,
        dsi.DeltaStorage(store.server.fresh_prefix("lake"), store.options(), engine="delta-rs"),
    )
    write(made, "profiles", [(10, "ann"), (11, "bob")], PROFILES)
    write(made, "transactions", [(1, 10, 50.0), (2, 11, 500.0), (3, 12, 900.0)], TX)
    return made


def write(lake: Lake, name: str, rows: list[tuple], ddl: str) -> None:
    schema = arrow_schema(ddl)
    columns = [pa.array([row[i] for row in rows], f.type) for i, f in enumerate(schema)]
    write_deltalake(
        lake.storage.table_uri(name),
        pa.table(columns, schema=schema),
        mode="append",
        storage_options=dict(lake.storage.storage_options),
    )


def operator(lake: Lake, storage: dsi.DeltaStorage | None = None) -> dsi.SideInputOperator:
    """enriched (every record, with its profile's name) and big (amount > 100)."""

    return catalogue_operator(lake, fn=enrich, side_outputs=[BIG], storage=storage or lake.storage)


def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    enriched = main.select("tx_id", F.col("profile.name").alias("name"))
    return {dsi.MAIN: enriched, BIG: enriched.where(main.amount > 100)}


def with_options(lake: Lake, **override: str) -> dsi.DeltaStorage:
    return dsi.DeltaStorage(
        lake.storage.root, {**lake.storage.storage_options, **override}, engine="delta-rs"
    )


def exact(lake: Lake) -> None:
    """Every main record exactly once (the main output, no route declared, the buffer
    empty: tests/core/accounting.py's count, read with the lake's own credentials), and
    the side output exact too."""
    op = operator(lake)
    assert op.buffer().snapshot is None or not lake.frame(op.spec.buffer_uri).count()
    placed = Counter(tx_id for (tx_id,) in lake.rows("enriched", "tx_id"))
    assert placed == Counter(IDS), placed
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert lake.rows("big") == [(2, "bob"), (3, None)]


@dataclasses.dataclass
class Hooked:
    """The real engine, with ``before[n]`` run just before its n-th commit and
    ``after[n]`` just after it (the store made to fail there, for real)."""

    inner: DeltaEngine
    before: dict[int, Callable[[], None]] = dataclasses.field(default_factory=dict)
    after: dict[int, Callable[[], None]] = dataclasses.field(default_factory=dict)
    commits: int = 0

    def commit(self, staged: Any, **kwargs: Any) -> Any:
        self.commits += 1
        self.before.get(self.commits, lambda: None)()
        result = self.inner.commit(staged, **kwargs)
        self.after.get(self.commits, lambda: None)()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# --- credentials refused -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrong", "code"),
    [
        ({"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "SignatureDoesNotMatch"),
        ({"AWS_ACCESS_KEY_ID": "AKIADSIUNKNOWNKEY000"}, "InvalidAccessKeyId"),
    ],
    ids=["wrong-secret", "unknown-key"],
)
def test_credentials_the_store_refuses_at_the_lease(lake, wrong, code):
    op = operator(lake, with_options(lake, **wrong))
    with (
        nothing_committed(lake, operator(lake)),
        refused(
            dsi.StorageError,
            BUCKET,
            "refused the credentials",
            "taking the operator's lock",
            code,
            fix=["AWS_SECRET_ACCESS_KEY", "then rerun"],
        ) as failure,
    ):
        lake.run(op)
    assert "not-the-secret" not in str(failure.value)
    lake.run(operator(lake))  # the right credentials
    exact(lake)


def test_credentials_the_store_refuses_reading_the_state(lake):
    lake.run(operator(lake))
    op = operator(lake, with_options(lake, AWS_SECRET_ACCESS_KEY="not-the-secret"))
    for look, doing in (
        (op.last_committed_batch, "reading the commit records"),
        (op.last_plan, "reading the batch plans"),
        (op.buffer, "reading the buffer's state"),
        (op.peek, "planning the next batch"),
    ):
        with refused(dsi.StorageError, BUCKET, "refused the credentials", doing, fix="rerun"):
            look()
    assert operator(lake).last_committed_batch() == 0
    exact(lake)


def test_a_secret_rotated_mid_run_refuses_the_commit_and_the_release_hides_nothing(
    lake, store, monkeypatch
):
    """The key is refused from the first commit on: the commit's error goes up (the
    lease's release, refused too, is only a note on it), and nothing is committed."""
    monkeypatch.setenv("DSI_LOCK_LEASE_SECONDS", "3")  # the unreleased lease runs out
    hooked = Hooked(lake.engine, before={1: lambda: store.server.set_secret("rotated")})
    with nothing_committed(lake, operator(lake)):
        try:
            with refused(
                dsi.StorageError,
                BUCKET,
                "refused the credentials while committing 'enriched'",
                fix="AWS_SECRET_ACCESS_KEY",
            ) as failure:
                lake.run(operator(lake, lake.with_engine(hooked)))  # type: ignore[arg-type]
        finally:
            store.server.set_secret(SECRET_KEY)  # the fix: the credentials work again
    # What failed after it (discarding the other table's staged files, releasing the
    # lease: the store refuses them too) is noted on it, never raised in its place.
    notes = failure.value.__notes__
    assert any("discarding the files staged for big" in note for note in notes), notes
    assert any("releasing the operator's lock" in note for note in notes), notes
    lake.run(operator(lake), wait_for_lock=30)
    exact(lake)


# --- the store down, then back --------------------------------------------------------------


def test_the_store_down_before_the_lease(lake, store):
    with (
        nothing_committed(lake, operator(lake)),
        store.down(),
        refused(
            dsi.StorageError,
            BUCKET,
            "could not be reached",
            "taking the operator's lock",
            fix="make the store reachable",
        ),
    ):
        lake.run(operator(lake))
    lake.run(operator(lake))
    exact(lake)


def test_the_store_down_after_a_commit_names_the_tables_that_hold_the_batch(
    lake, store, monkeypatch
):
    """Down right after the first table's commit: the second commit fails, and so does
    the lease's release; the error is the commit's, saying which table holds the batch.
    The rerun replays the batch for the other table only."""
    monkeypatch.setenv("DSI_LOCK_LEASE_SECONDS", "3")
    hooked = Hooked(lake.engine, after={1: store.proxy.stop})
    try:
        with refused(
            dsi.StorageError, BUCKET, "could not be reached", "committed to ['enriched']",
            fix="make the store reachable",
        ) as failure:  # fmt: skip
            lake.run(operator(lake, lake.with_engine(hooked)))  # type: ignore[arg-type]
    finally:
        store.proxy.start()
    assert "releasing" not in failure.value.message
    assert lake.rows("enriched") == [(1, "ann"), (2, "bob"), (3, None)]
    assert not lake.exists("big")
    result = lake.run(operator(lake), wait_for_lock=30)
    assert result.batches[0].replayed
    exact(lake)


def test_the_store_down_before_the_release_says_the_batches_are_committed(lake, store, monkeypatch):
    monkeypatch.setenv("DSI_LOCK_LEASE_SECONDS", "3")
    release = ObjectStoreLease.release

    def store_gone_first(lease: ObjectStoreLease) -> None:
        store.proxy.stop()
        release(lease)

    monkeypatch.setattr(ObjectStoreLease, "release", store_gone_first)
    try:
        with refused(
            dsi.StorageError,
            BUCKET,
            "could not be reached",
            "releasing the operator's lock",
            "batches are committed",
            fix="make the store reachable",
        ):
            lake.run(operator(lake))
    finally:
        store.proxy.start()
        monkeypatch.setattr(ObjectStoreLease, "release", release)
    exact(lake)  # everything was committed before the release
    assert lake.run(operator(lake), wait_for_lock=30).batches == []  # nothing twice
    exact(lake)


def test_the_store_down_while_reading_the_state(lake, store):
    lake.run(operator(lake))
    op = operator(lake)
    with store.down():
        for look in (op.last_committed_batch, op.buffer, op.peek):
            with refused(
                dsi.StorageError, BUCKET, "could not be reached", fix="make the store reachable"
            ):
                look()
    assert op.last_committed_batch() == 0
    exact(lake)


# --- the Dagster IO manager ----------------------------------------------------------------


def test_the_store_down_while_the_io_manager_loads_an_input(spark, store):
    import dagster as dg

    from dagster_sideinputs.dagster_layer.io_manager import DeltaIOManager
    from dagster_sideinputs.dagster_layer.resources import SparkResource

    @dg.asset
    def orders(spark: SparkResource) -> DataFrame:
        return spark.spark_session.createDataFrame([(1, "a"), (2, "b")], "id long, name string")

    @dg.asset
    def order_count(orders: DataFrame) -> DataFrame:
        return orders.agg(F.count("*").alias("n"))

    session = SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR")
    root = store.server.fresh_prefix("io")
    manager = DeltaIOManager(root=root, storage_options=store.options(), spark=session)
    resources = {"spark": session, "io_manager": manager}
    with dg.instance_for_test() as instance:
        dg.materialize([orders], resources=resources, instance=instance)
        with store.down(), pytest.raises(Exception) as failure:  # noqa: PT011 (Dagster's wrapper)
            dg.materialize(
                [orders, order_count], resources=resources, instance=instance,
                selection=[order_count],
            )  # fmt: skip
        chain = [failure.value]
        while chain[-1].__cause__ is not None:
            chain.append(chain[-1].__cause__)
        [error] = [e for e in chain if isinstance(e, dsi.SideInputError)]
        assert type(error) is dsi.StorageError, error
        for name in ("Asset orders", "could not be reached", "reading table", BUCKET):
            assert name in error.message, (name, error.message)
        assert error.fix
        assert "make the store reachable" in error.fix
        dg.materialize(
            [orders, order_count], resources=resources, instance=instance, selection=[order_count]
        )  # the store back: the same run works
    lake = Lake(spark, manager.storage)
    assert lake.rows("order_count") == [(2,)]
