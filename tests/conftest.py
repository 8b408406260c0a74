"""Shared fixtures: one SparkSession for the whole test session, fresh lakes per test.

Storage cases: a test marked ``each_storage`` (a storage contract test) runs once per
storage case (:data:`STORAGE_CASES`), its ``lake`` on the local filesystem or on the S3
test server (the Spark session reaches the latter through s3a with the lake's own
settings), under each Delta engine. Every other test gets a local lake under the engine
users get (delta-spark).
"""

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import SparkSession

from dagster_sideinputs.core.spark.packages import OPTIONAL_PACKAGES
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.storage import DeltaStorage
from tests.servers.s3 import S3Server

# The engine users get: the test session has Delta configured, so "auto" picks delta-spark,
# as a user's session with Delta does (the demo's and the UI's runs report
# `delta_engine: delta-spark`). The semantics and bad-input tests run under it; the
# contract tests (the ``both_engines`` and ``each_storage`` ones, tests/delta) name the
# engines they compare. DSI_DELTA_ENGINE=delta-rs runs the rest under the bridge.
os.environ.setdefault("DSI_DELTA_ENGINE", "auto")

# Every JVM the tests start in subprocesses (workers, demo runs, Connect servers, the
# cluster's driver, and through it its executors; the cluster's master and workers, as
# daemons; tests/cluster.py `spark_env` keeps these variables) collects garbage in one
# thread and compiles with C1 only: they live seconds to minutes, and HotSpot's C2
# compiler spent their CPU on code they would not run long enough to repay it. A JVM
# started to write one small Delta table took ~19.5 s of CPU, ~10 s with C1 only; the
# end-to-end modules (crash harness, concurrency, cluster, docs, webserver, browser), two
# workers, idle machine, alternating: 261 and 319 s against 307 and 375 s; the cluster's
# module alone, its executors and daemons too: 62 s against 77. This session's own JVM,
# which runs the whole module's Spark work, keeps both compilers (MAIN_JVM_OPTIONS: C1
# only measured slower there, docs/testing.md). SerialGC: the heaps are small; on 2 cores
# it measured faster than the default G1 (tests/core/test_recovery.py 95-100 s against
# 104-111 s). A value the environment already has is kept.
SUBPROCESS_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
os.environ.setdefault(
    "SPARK_SUBMIT_OPTS",
    # A driver reads spark.* system properties as settings: a cluster's executors too.
    f"{SUBPROCESS_JVM_OPTIONS} -Dspark.executor.extraJavaOptions='{SUBPROCESS_JVM_OPTIONS}'",
)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", SUBPROCESS_JVM_OPTIONS)
MAIN_JVM_OPTIONS = "-XX:TieredStopAtLevel=4"
"""Appended to this session's driver options (after ``SPARK_SUBMIT_OPTS``: the last flag
wins): both JIT compilers."""

# The tests start hundreds of JVMs of a few class paths (this session's, the workers',
# demo runs', Connect servers'): they opt in to the class archive of each class path
# (dagster_sideinputs/core/spark/jvm_archive.py, off by default in users' processes).
os.environ.setdefault("DSI_JVM_ARCHIVE", "on")

if TYPE_CHECKING:
    from dagster_sideinputs.core.spark.connect_server import LocalConnectServer
    from tests.servers.kafka import KafkaBroker


SERVER_MARKS = {"kafka_broker": "kafka", "s3_server": "s3"}
"""The mark of every test that starts (or shares) a server in a subprocess, whether it
asks for the fixture or its ``each_storage`` case does: ``make test-fast`` leaves them
out."""


END_TO_END = (
    "webserver",
    "cluster",
    "connect",
    "kafka",
    "browser",
    "airflow",
    "crash_harness",
    "demo",
)
"""The marks of end-to-end tests: a server, a cluster, a browser, or a whole pipeline in
subprocesses."""


SHARED_SCOPES = {
    "tests/dagster_layer/test_browser.py": "tests/dagster_layer/test_webserver.py",
    "tests/test_airflow.py": "tests/dagster_layer/test_webserver.py",
    "tests/delta/test_delta_connect.py": "tests/dagster_layer/test_webserver.py",
    **{
        module: "tests/core/test_kafka.py"
        for module in (
            "tests/core/test_kafka_keyed.py",
            "tests/core/test_kafka_crash.py",
            "tests/core/test_bad_input_decode.py",
            "tests/core/test_bad_input_resets.py",
            "tests/dagster_layer/test_kafka_assets.py",
            "tests/servers/test_kafka_broker.py",
        )
    },
}
"""Modules that use another module's session-scoped server. In two xdist workers they run
in that module's worker, so the server starts once: the browser test uses the GraphQL
test's webserver and story; those two, Airflow's tasks and the Connect tests attach to one
Spark Connect server (:func:`connect_server`); and the modules that use the Kafka broker
(:func:`kafka_broker`), which then starts once."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` with :data:`SHARED_SCOPES`: a module's tests in one worker, the
    modules sharing a server in the same one, handed out in the collection's order (other
    ``--dist`` modes: xdist's own)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedServers(LoadFileScheduling):
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            # Hand the modules out in the collection's order (the end-to-end modules
            # first: pytest_collection_modifyitems), not xdist's default of the modules
            # with the most tests first, which left the long end-to-end modules for last:
            # one worker ran 1,635 s, the other 1,478 s (CI, 2026-12-04 night, simulated
            # from its durations); in this order, 1,550 s and 1,563 s.
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return SHARED_SCOPES.get(module, module)

    return SharedServers(config, log)  # type: ignore[arg-type]


STOPPED_WHEN_IDLE = ("kafka_broker", "connect_server")
"""Session-scoped servers in subprocesses stopped once the tests of their scope (a module
and the modules :data:`SHARED_SCOPES` gives it) are done in this worker, unless the next test
asks for them: they would otherwise idle until the session ends. An idle Kafka broker kept
3-6% of a core busy for the rest of the run (its scope's modules run first, the run's other
twenty minutes after them: ~45 s of CPU on a machine whose two cores the tests keep 95% busy).
A later test that asks again starts a new one."""

_running_servers: dict[str, Any] = {}


def _scope_of(item: pytest.Item) -> str:
    module = item.nodeid.split("::", 1)[0]
    return SHARED_SCOPES.get(module, module)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the :data:`STOPPED_WHEN_IDLE` servers the tests to come do not need (after the
    test's own teardown; xdist's worker knows its next test before running this one)."""
    info = getattr(item, "_fixtureinfo", None)
    for name in STOPPED_WHEN_IDLE:
        if info is not None and name in info.name2fixturedefs and name in item.fixturenames:
            _running_servers[name] = info.name2fixturedefs[name][-1]
    for name, fixturedef in list(_running_servers.items()):
        if nextitem is not None and (
            name in getattr(nextitem, "fixturenames", ()) or _scope_of(nextitem) == _scope_of(item)
        ):
            continue
        del _running_servers[name]
        if fixturedef.cached_result is not None:  # pytest's own teardown ran it at the end
            fixturedef.finish(item._request)  # type: ignore[attr-defined]


FAST_MODULES = (
    "tests/core/test_semantics.py",
    "tests/delta/test_writer.py",
    "tests/delta/test_reader.py",
    "tests/delta/test_log_commit.py",
    "tests/test_docs.py",
)
"""``make test-fast``'s modules that use the test session's Spark: the semantics users rely
on, the Delta writer and reader, the docs' examples. Beside them it runs every test that
does not ask for the session (the pure logic, the structure, the packages and settings,
the Dagster definitions; some run Spark through Dagster); never a slow test or one with a
server in a subprocess (:data:`FAST_EXCLUDED`)."""

FAST_EXCLUDED = ("slow", "extended", *END_TO_END, *SERVER_MARKS.values())


def is_fast(item: pytest.Item) -> bool:
    """Whether ``make test-fast`` (``pytest -m fast``) runs the test: the inner loop,
    minutes on 2 cores, its time in docs/testing.md."""
    if any(item.get_closest_marker(mark) for mark in FAST_EXCLUDED):
        return False
    path = item.nodeid.split("::", 1)[0]
    return path in FAST_MODULES or "spark" not in getattr(item, "fixturenames", ())


def tier(item: pytest.Item) -> str:
    """The tier of a test (README's testing section; ``pytest -m <tier>`` runs one):
    ``contract`` (the matrix of engines and stores: ``each_storage``, ``both_engines``, a
    module that sets ``DELTA_ENGINES``, tests/delta), ``end_to_end`` (:data:`END_TO_END`),
    else ``semantics`` (semantics and bad input, once, under the engine users get)."""
    path = item.nodeid.split("::", 1)[0]
    if any(item.get_closest_marker(mark) for mark in END_TO_END):
        return "end_to_end"
    engines = getattr(getattr(item, "module", None), "DELTA_ENGINES", None)
    contract = ("each_storage", "both_engines")
    if engines or path.startswith("tests/delta/") or any(map(item.get_closest_marker, contract)):
        return "contract"
    return "semantics"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test's :func:`tier` and the tests of subprocess servers
    (:data:`SERVER_MARKS`), and run the end-to-end modules first. ``make test`` runs the
    tests in two pytest-xdist workers with ``--dist loadfile``: a module's tests run in one
    worker, which starts the module's fixtures (servers, clusters, template runs) once;
    each worker has its own Spark session."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, mark in SERVER_MARKS.items():
            if fixture in fixtures and item.get_closest_marker(mark) is None:
                item.add_marker(getattr(pytest.mark, mark))
        callspec = getattr(item, "callspec", None)
        case = callspec.params.get("storage_case") if callspec is not None else None
        if isinstance(case, StorageCase) and case.store == "s3":
            item.add_marker(pytest.mark.s3)
        item.add_marker(getattr(pytest.mark, tier(item)))
        if is_fast(item):
            item.add_marker(pytest.mark.fast)
    # The modules of end-to-end tests first (each keeps its order): they are the longest,
    # and started first in two xdist workers they do not leave one worker finishing alone.
    longest = {
        item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("end_to_end")
    }
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in longest)


# The shared session evaluates expressions interpreted, without generated code: its tests
# run thousands of small queries, and compiling each plan's Java code (Janino) cost more
# CPU than running it. Measured 2026-12-04 on four semantics modules in two workers, two
# alternating rounds: 343 and 302 s with Spark's defaults, 295 and 290 s without
# whole-stage code generation, 277 and 247 s fully interpreted (-19%). The results are
# the same by Spark's contract (its own suites run both modes). What users run keeps
# generated code: the subprocesses (Dagster runs, the demo, the cluster, Connect, the
# crash harness) and the benchmarks use Spark's defaults, and ``DSI_TEST_CODEGEN=1``
# gives this session Spark's defaults too (``make test-extended`` sets it).
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
CODEGEN = os.environ.get("DSI_TEST_CODEGEN") == "1"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[2], UI off, 4 shuffle partitions, UTC (set by build_spark_session), and
    expressions interpreted (:data:`INTERPRETED`).

    With Delta Lake for Spark (``delta=True``: no jar fails the run rather than silently
    testing without it) and the Kafka, avro and S3A packages, so that every engine and
    connector test shares this one JVM. ``make test`` fetched the jars into the Ivy
    cache, so starting it downloads nothing.
    """
    warehouse = tempfile.mkdtemp(prefix="dsi-warehouse-")
    session = build_spark_session(
        master="local[2]",
        app_name="dagster-sideinputs-tests",
        ui_enabled=False,
        shuffle_partitions=4,
        log_level="ERROR",
        delta=True,
        packages=OPTIONAL_PACKAGES,
        configs={
            "spark.sql.warehouse.dir": warehouse,
            "spark.driver.memory": "2g",
            "spark.sql.adaptive.enabled": "true",
            "spark.driver.extraJavaOptions": MAIN_JVM_OPTIONS,
            **({} if CODEGEN else INTERPRETED),
        },
    )
    yield session
    session.stop()


@pytest.fixture(scope="session", autouse=True)
def shared_session_first(request: pytest.FixtureRequest) -> None:
    """Start :func:`spark` before any test of a session that uses it. A test that builds
    its own local session first (a Dagster resource materializing in-process, as
    test_airflow.py's comparison does) would otherwise launch this process's one JVM
    without the optional packages, and the shared session's start would be refused
    (``build_spark_session`` refuses a running session without the packages asked for;
    before that refusal every later Kafka, avro and S3A test of the worker failed). The
    order of the modules decides which comes first, so it is not left to it."""
    if any("spark" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("spark")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator["KafkaBroker"]:
    """A real Kafka broker on 127.0.0.1 (KRaft, one node), shared by the session.

    Started only when a test asks for it (its jars are fetched on first use), stopped
    whatever the outcome once the tests of its scope are done (:data:`STOPPED_WHEN_IDLE`),
    or at the end of the session. Tests share it, so each creates its own topics
    (``kafka_broker.unique_topic()``).
    """
    from tests.servers.kafka import KafkaBroker

    with KafkaBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator["LocalConnectServer"]:
    """The Spark Connect server with Delta that ``make dev`` starts
    (core/spark/connect_server.py), local[2], warmed up as ``make dev`` does it.

    Shared by the end-to-end modules whose runs attach to one (the webserver's, Airflow's
    tasks, the Connect tests: :data:`SHARED_SCOPES` keeps them in one worker): each opens
    its own Connect sessions and writes its own tables, and one JVM starts and compiles
    Delta's classes once instead of three times (about a minute of CPU each on 2 cores).
    """
    from dagster_sideinputs.core.spark.connect_server import LocalConnectServer
    from tests.cluster import free_port

    root = tmp_path_factory.mktemp("connect-server")
    server = LocalConnectServer(
        root / "connect-server.log",
        port=free_port(),
        master="local[2]",
        confs={"spark.ui.enabled": "false", "spark.sql.warehouse.dir": str(root / "warehouse")},
    )
    with server as running:
        running.warm_up()
        yield running


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server (moto) on 127.0.0.1 with the bucket ``lake``.

    Started the first time a test asks for it, stopped at the end of the session (also
    when the session fails). Tests share it: use ``s3_server.fresh_prefix()`` for a
    folder of your own.
    """
    with S3Server() as server:
        yield server


@dataclass(frozen=True)
class StorageCase:
    """Where a test's lake lives, and which Delta engine serves it."""

    store: str  # "local" (a temporary folder) or "s3" (a fresh prefix on the S3 test server)
    # "default": the engine users get (``DSI_DELTA_ENGINE``, see above); "bridge": the
    # delta-rs bridge; "native": delta-spark
    engine: str = "default"

    @property
    def id(self) -> str:
        return f"{self.store}-{self.engine}"

    @property
    def native(self) -> bool:
        return self.engine == "native"

    @property
    def engine_name(self) -> str | None:
        """``DeltaStorage(engine=...)`` of this case (None: the environment's)."""
        return {"bridge": "delta-rs", "native": "delta-spark"}.get(self.engine)


DEFAULT_CASE = StorageCase("local")
"""Every test that is not ``each_storage``: a local lake under the engine users get."""

STORAGE_CASES: tuple[StorageCase, ...] = (
    StorageCase("local", "bridge"),
    StorageCase("local", "native"),
    StorageCase("s3", "bridge"),
    StorageCase("s3", "native"),
)
"""The storage contract's matrix: an ``each_storage`` test runs on each store (the local
filesystem, the S3 test server) under each engine. Only contract tests carry the mark
(docs/testing.md): the semantics they check run once, on a local lake, elsewhere.

On S3 the lake is ``DeltaStorage`` with the S3 server's endpoint and credentials given
once, as storage options: under delta-spark, Spark reaches the bucket through s3a with
them (set per bucket on the session by ``DeltaStorage.bind``), and the operator's state
(plans, claims, commit records, the lock's lease) goes through the same options with the
store's conditional writes (obstore), under either engine."""

STORES: tuple[StorageCase, ...] = (DEFAULT_CASE, StorageCase("s3"))
"""``each_storage(engines=False)``: each store under the default engine, for what does not
depend on the engine (the operator's lock, its state files)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("each_storage")
    if marker is None:
        return
    if marker.args or set(marker.kwargs) - {"engines"}:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: each_storage(engines=True|False)")
    if "storage_case" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: each_storage without a lake")
    cases = STORAGE_CASES if marker.kwargs.get("engines", True) else STORES
    metafunc.parametrize("storage_case", cases, ids=[case.id for case in cases], indirect=True)


@pytest.fixture
def storage_case(request: pytest.FixtureRequest) -> StorageCase:
    """The storage case of an ``each_storage`` test; :data:`DEFAULT_CASE` otherwise."""
    return getattr(request, "param", DEFAULT_CASE)


@pytest.fixture
def lake_storage(
    request: pytest.FixtureRequest, storage_case: StorageCase, tmp_path
) -> DeltaStorage:
    """An empty storage root for Delta tables, where the storage case says, under its
    engine.

    On S3 the options are passed explicitly, once (the other form, ``AWS_*`` environment
    variables, is what tests/dagster_layer use); delta-spark gets them as s3a settings.
    """
    engine = storage_case.engine_name
    if storage_case.store == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return DeltaStorage(
            root=server.fresh_prefix("lake"), storage_options=server.storage_options, engine=engine
        )
    root = tmp_path / "lake"
    root.mkdir()
    return DeltaStorage(root=str(root), engine=engine)


@pytest.fixture
def lake(lake_storage: DeltaStorage) -> DeltaStorage:
    """An empty storage root for Delta tables."""
    return lake_storage


def table_files(uri: str) -> set[str]:
    """Every file under a table folder except the log, relative to it."""
    found = set()
    for directory, _, names in os.walk(uri):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), uri)
            if not relative.startswith("_delta_log"):
                found.add(relative)
    return found


def stage_names(spark: SparkSession, action: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``action()``'s result and the names (call sites) of the Spark stages it ran."""
    group = f"stage-names-{id(action)}"
    context = spark.sparkContext
    context.setJobGroup(group, "stage names")
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    names = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else ():
            stage_info = tracker.getStageInfo(stage)
            if stage_info is not None:
                names.append(stage_info.name)
    return result, names
