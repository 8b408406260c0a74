"""Building a SparkSession with the settings the project relies on.

The Dagster ``SparkResource`` is a thin configurable wrapper around
:func:`build_spark_session`; plain PySpark programs can call it directly. What a start
checks first lives apart: Java (:mod:`~dagster_sideinputs.core.spark.java_runtime`), the JVM
packages (:mod:`~dagster_sideinputs.core.spark.packages`) and Spark Connect
(:mod:`~dagster_sideinputs.core.spark.connect`).
"""

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from dagster_sideinputs.core.spark import jvm_archive
from dagster_sideinputs.core.spark.connect import (
    apply_remote_settings,
    check_remote_delta,
    require_connect_client,
    require_connect_server,
)
from dagster_sideinputs.core.spark.java_runtime import check_java
from dagster_sideinputs.core.spark.packages import (
    DeltaMode,
    cached_jar_list,
    forget_jar_list,
    packages_not_loaded,
    parse_packages,
    remember_jar_list,
    resolve_session_packages,
)
from dagster_sideinputs.delta.spark.setup import configure_delta, delta_package
from dagster_sideinputs.errors import SparkStartupError

# Settings every session needs for the Delta bridge to be correct, not just fast:
# Delta stores timestamps as microseconds in UTC, and Spark's default INT96
# timestamps are not readable by delta-rs / pyarrow as such.
REQUIRED_CONFIGS: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Output files are committed by the bridge, which wants no marker files.
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.enable.summary-metadata": "false",
}

# Defaults a session gets unless ``configs`` say otherwise.
DEFAULT_CONFIGS: Mapping[str, str] = {
    # The operator persists each batch's classified records and writes its outputs from
    # that cache. By default AQE keeps a cached plan's shuffle partitions, so on a cluster
    # (Spark's 200) every batch ran 200-task stages and wrote 200 files per output:
    # bench/cluster.py measured 2.5x the batch time on two executors.
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
}


_LOCAL_MASTER = re.compile(r"local(?:\[(\d+|\*)(?:,\d+)?\])?")


def is_local_master(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``, ``local[N,F]``: executors in the driver's JVM
    (not ``local-cluster[...]``, whose executors are processes of their own)."""
    return _LOCAL_MASTER.fullmatch(master) is not None


def default_shuffle_partitions(master: str) -> int | None:
    """A shuffle partition count that suits a local master: two per core, at least 4."""
    match = _LOCAL_MASTER.fullmatch(master)
    if match is None:
        return None  # a cluster: keep Spark's default, AQE coalesces small partitions
    threads = match.group(1)
    if threads is None:
        cores = 1  # plain "local" runs a single worker thread
    elif threads == "*":
        cores = os.cpu_count() or 2
    else:
        cores = int(threads)
    return max(4, 2 * cores)


FOLLOW_CORES = "spark.dsi.shufflePartitions"
"""Set by :func:`build_spark_session` on a cluster session given no partition count:
``cores`` while the operator keeps ``spark.sql.shuffle.partitions`` at two per executor
core, ``user`` once somebody else changed it (then it is left alone)."""
_APPLIED = FOLLOW_CORES + ".applied"


def fit_shuffle_partitions(spark: SparkSession) -> int | None:
    """Make a cluster session's shuffle partitions follow its executor cores (two per
    core, at least 4, as local masters get) unless the user set them; called before every
    batch, so executors that registered late, or were added, count. Returns the count set,
    or None when the session does not follow cores (a count was given, a local master,
    Spark Connect, or the user changed it since)."""
    try:
        if spark.conf.get(FOLLOW_CORES, None) != "cores":
            return None
        current = spark.conf.get("spark.sql.shuffle.partitions")
        applied = spark.conf.get(_APPLIED, None)
        if applied is not None and current != applied:
            spark.conf.set(FOLLOW_CORES, "user")  # set by someone else: theirs from now on
            return None
        partitions = str(max(4, 2 * spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext in the client
        return None
    if partitions != current:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    spark.conf.set(_APPLIED, partitions)
    return int(partitions)


def _choose_worker_python(master: str, settings: Mapping[str, str]) -> None:
    """The Python that runs UDFs, data sources and row functions on the executors.

    PySpark starts its workers with ``PYSPARK_PYTHON`` (default ``python3`` from PATH,
    often an interpreter without this project's packages). Unless it is set, the workers
    of a local master run this interpreter, and ``spark.pyspark.python`` is honoured for
    any master; on a cluster, set either to the executors' Python.
    """
    if os.environ.get("PYSPARK_PYTHON"):
        return
    chosen = settings.get("spark.pyspark.python")
    if chosen is None and master.startswith("local"):
        chosen = sys.executable
    if chosen:
        os.environ["PYSPARK_PYTHON"] = chosen


DIST_CLASS_PATH = "SPARK_DIST_CLASSPATH"

PACKAGES_KEY = "spark.dsi.packages"
"""Set on every local session that loads Maven packages: their coordinates, Delta's first.
(``spark.jars.packages`` is set only when a start resolves them; see
:func:`~dagster_sideinputs.core.spark.packages.cached_jar_list`.)"""


def _coordinates(delta: bool, packages: list[str]) -> list[str]:
    """Every coordinate a session loads, in the order ``spark.jars.packages`` would get."""
    if not delta:
        return packages
    return [delta_package(), *packages]


def _local_builder(
    app_name: str,
    master: str,
    settings: Mapping[str, str],
    *,
    delta: bool,
    packages: list[str],
    jars: list[str] | None,
) -> SparkSession.Builder:
    """A classic builder with every setting, Delta (through delta-spark) and the packages.

    With ``jars`` (the list an earlier start resolved for these packages) they are not
    resolved again: a cluster's go into ``spark.jars`` after any the user named, a local
    master's onto the JVM's class path (:func:`_launch_class_path`).
    """
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    coordinates = _coordinates(delta, packages)
    if coordinates:
        builder = builder.config(PACKAGES_KEY, ",".join(coordinates))
    if jars and not is_local_master(master):
        # Executors elsewhere fetch them from the driver (a local master's go on the
        # launched JVM's class path instead: _launch_class_path).
        own = [jar.strip() for jar in settings.get("spark.jars", "").split(",")]
        builder = builder.config("spark.jars", ",".join([*filter(None, own), *jars]))
    if delta:
        return configure_delta(
            builder,
            extensions=settings.get("spark.sql.extensions"),
            extra_packages=packages,
            jars_given=bool(jars),
        )
    if packages and not jars:
        builder = builder.config("spark.jars.packages", ",".join(packages))
    return builder


@contextlib.contextmanager
def _launch_class_path(jars: list[str] | None) -> Iterator[None]:
    """Put ``jars`` after Spark's own on the class path of a local JVM launched inside.

    ``SPARK_DIST_CLASSPATH`` is Spark's launcher hook for jars that follow Spark's, so a
    class both have resolves to Spark's, as with ``spark.jars`` (whose loader asks
    Spark's first), and a local master's executors share the driver's class path. Unlike
    ``spark.jars``, nothing is copied into the session's temporary folder (712 MB with
    the S3A bundle) and no loader is added. Set only while the JVM launches.
    """
    if not jars:
        yield
        return
    before = os.environ.get(DIST_CLASS_PATH)
    os.environ[DIST_CLASS_PATH] = os.pathsep.join([*filter(None, [before]), *jars])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DIST_CLASS_PATH, None)
        else:
            os.environ[DIST_CLASS_PATH] = before


def _remember_jars(
    spark: SparkSession, coordinates: list[str], settings: Mapping[str, str]
) -> None:
    """After a start that resolved ``coordinates``, record its jars for the next start."""
    conf = spark.sparkContext.getConf()
    # A session that was already running may have been started with other packages.
    if conf.get("spark.jars.packages", "") != ",".join(coordinates):
        return
    remember_jar_list(coordinates, settings, conf.get("spark.jars", ""))


def _check_running_packages(spark: SparkSession, required: list[str]) -> None:
    """Refuse a running session that lacks packages asked for: it was started first (by
    other code, or another resource) without them, and a JVM loads packages only when it
    starts, so the first read of a Kafka topic or an ``s3a://`` path would fail far away."""
    if not required:
        return
    conf = spark.sparkContext.getConf()
    jvm = spark.sparkContext._jvm
    class_path = jvm.java.lang.System.getProperty("java.class.path") if jvm is not None else ""
    jars = [*conf.get("spark.jars", "").split(","), *str(class_path).split(os.pathsep)]
    missing = packages_not_loaded(required, jars)
    if missing:
        raise SparkStartupError(
            f"A Spark session already runs in this process without the packages {missing}: "
            "a session's JVM loads packages only when it starts, and this one was started "
            "earlier (by other code or another resource) without them.",
            fix="ask for these packages in the first session this process starts "
            "(build_spark_session(packages=[...]) or SparkResource(packages=[...]) before "
            "anything else starts Spark), or run this code in its own process",
        )


def build_spark_session(
    *,
    master: str = "local[*]",
    remote: str | None = None,
    app_name: str = "dagster-sideinputs",
    shuffle_partitions: int | None = None,
    configs: Mapping[str, Any] | None = None,
    ui_enabled: bool = True,
    driver_memory: str | None = None,
    log_level: str = "WARN",
    delta: DeltaMode = "auto",
    packages: Sequence[str] = (),
) -> SparkSession:
    """Start (or reuse) a SparkSession for the operator: with Delta Lake (delta-spark) where
    its jar can be had, and the packages asked for.

    Args:
        master: Spark master URL: ``local[*]``, ``local[2]``, ``spark://host:7077``, ...
        remote: a Spark Connect URL (``sc://host:15002``); replaces ``master``. The Connect
            server owns the JVM, so ``app_name``, ``ui_enabled``, ``driver_memory`` and
            ``log_level`` are the server's business there and are not applied; the other
            settings are set on the session and must be runtime SQL settings.
        app_name: application name shown in the Spark UI.
        shuffle_partitions: ``spark.sql.shuffle.partitions``; by default two per core:
            of the local master, or, on a cluster, of the executors registered when the
            operator starts each batch (:func:`fit_shuffle_partitions`; a count set in
            ``configs`` or later on the session is kept).
        configs: extra Spark configs; they win over the defaults (including
            :data:`DEFAULT_CONFIGS`), except the settings in :data:`REQUIRED_CONFIGS`,
            which the bridge needs to be correct.
        ui_enabled: whether to start the Spark UI.
        driver_memory: ``spark.driver.memory`` (only effective when this call starts the JVM).
        log_level: Spark log level once started.
        delta: configure Delta Lake for Spark (delta-spark's jar through
            ``configure_spark_with_delta_pip``, its SQL extension and catalog). ``"auto"``
            (default): when its jar cannot be fetched, start without it and log one
            warning (Delta tables then go through the delta-rs bridge); ``True``: fail
            instead; ``False``: leave it out. Over Spark Connect the server decides:
            ``True`` checks that it runs with Delta.
        packages: more Maven packages to load (``spark.jars.packages``): coordinates, or
            the short names ``"kafka"``, ``"avro"`` and ``"s3"`` (the versions that match
            this Spark, :data:`~dagster_sideinputs.core.spark.packages.BUNDLES`);
            merged with any ``spark.jars.packages`` in ``configs``. Fetched into the Ivy
            cache before the JVM starts, once (``make install`` fetches them all).
            Not possible over Spark Connect (start the server with ``--packages``).

    Returns:
        The active SparkSession.

    Raises:
        SparkStartupError: no Java 17+ (checked before launching, so it never hangs), a
            ``remote`` URL without the Spark Connect client installed or with no server
            answering (checked before connecting, so it never hangs either), a setting the
            Connect server refuses, packages that cannot be fetched (or Delta's jar with
            ``delta=True``), a session already running in this process without the
            packages asked for (or without Delta, with ``delta=True``): a JVM loads packages
            only when it starts, or the session could not start.

    Examples:
        >>> spark = build_spark_session(master="local[2]", ui_enabled=False)  # doctest: +SKIP
    """
    settings: dict[str, str] = dict(DEFAULT_CONFIGS)
    # Over Connect the master is the server's, so only an explicit count applies.
    partitions = shuffle_partitions or (None if remote else default_shuffle_partitions(master))
    if partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(partitions)
    elif remote is None and "spark.sql.shuffle.partitions" not in (configs or {}):
        # A cluster's cores are known once its executors register: the operator sets the
        # count before each batch (fit_shuffle_partitions).
        settings[FOLLOW_CORES] = "cores"
    if remote is None:
        settings["spark.ui.enabled"] = str(ui_enabled).lower()
        # The operator reports its own progress; Spark's console bar garbles logs.
        settings["spark.ui.showConsoleProgress"] = "false"
        if driver_memory:
            settings["spark.driver.memory"] = driver_memory
    settings.update({key: str(value) for key, value in (configs or {}).items()})
    settings.update(REQUIRED_CONFIGS)
    # One list: configure_spark_with_delta_pip replaces spark.jars.packages as a whole.
    try:
        wanted = parse_packages(
            [*parse_packages(settings.pop("spark.jars.packages", None)), *packages]
        )
    except ValueError as exc:
        raise SparkStartupError(
            f"Bad Spark package list: {exc}.",
            fix="name each package group:artifact:version (e.g. "
            "'org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1'), or by its short name: "
            "'kafka', 'avro' or 's3'",
        ) from exc

    archive: jvm_archive.ArchivePlan | None = None  # a local launch's class archive
    coordinates: list[str] = []  # the Maven packages of a local session, Delta's first
    jars: list[str] | None = None  # their jars, as an earlier start of them resolved them
    if remote is not None:
        if wanted:
            raise SparkStartupError(
                f"Spark packages {wanted} cannot be added over Spark Connect ({remote!r}): "
                "the server's JVM loads jars when it starts.",
                fix=f"start the Connect server with `--packages {','.join(wanted)}`",
            )
        require_connect_client(remote)
        require_connect_server(remote, timeout_s=10.0)
        # Settings go through conf.set below: the Connect builder ignores refused ones.
        builder = SparkSession.builder.remote(remote)
    else:
        check_java()
        _choose_worker_python(master, settings)
        use_delta = resolve_session_packages(delta, wanted, settings)
        coordinates = _coordinates(use_delta, wanted)
        jars = cached_jar_list(coordinates, settings)
        if use_delta and partitions is not None and default_shuffle_partitions(master):
            # Delta rebuilds a table's state from its log in 50 tasks by default; on a local
            # master that made every first read after a commit 10-20 s slower (measured on
            # two cores), for tables whose log is a few files.
            settings.setdefault("spark.databricks.delta.snapshotPartitions", str(partitions))
        if is_local_master(master) and SparkContext._gateway is None and (jars or not coordinates):
            archive = jvm_archive.plan_launch(settings, jars or [])
        builder = _local_builder(
            app_name,
            master,
            jvm_archive.with_options(settings, archive),
            delta=use_delta,
            packages=wanted,
            jars=jars,
        )
    # A JVM already running in this process is reused: it keeps the packages it started with.
    running = remote is None and SparkContext._gateway is not None
    try:
        try:
            with _launch_class_path(jars if is_local_master(master) else None):
                spark = builder.getOrCreate()
            if archive is not None:
                jvm_archive.keep_at_exit(archive, getattr(SparkContext._gateway, "proc", None))
        except PySparkRuntimeError as exc:
            if remote is not None or not (use_delta or wanted):
                raise
            if exc.getCondition() != "JAVA_GATEWAY_EXITED":
                raise
            # The jars were there, yet Ivy could not resolve them offline (its metadata may
            # point at a ~/.m2 that was cleaned), or a start from the recorded jar list
            # failed: resolve again, capturing why, and retry through Ivy.
            forget_jar_list(coordinates, settings)
            use_delta = resolve_session_packages(delta, wanted, settings, trust_cache=False)
            coordinates, jars = _coordinates(use_delta, wanted), None
            builder = _local_builder(
                app_name, master, settings, delta=use_delta, packages=wanted, jars=None
            )
            spark = builder.getOrCreate()
        if running:
            _check_running_packages(spark, [c for c in coordinates if c in wanted or delta is True])
        elif remote is None and coordinates and not jars:
            _remember_jars(spark, coordinates, settings)
        if remote is not None:
            try:
                apply_remote_settings(spark, settings, remote=remote, required=REQUIRED_CONFIGS)
                if delta is True:
                    check_remote_delta(spark, remote)
            except SparkStartupError:
                spark.stop()  # not left behind half-configured for the next getOrCreate()
                raise
    except SparkStartupError:
        raise
    except Exception as exc:  # py4j / grpc errors have no common base class
        target = remote or master
        raise SparkStartupError(
            f"Could not start a Spark session on {target!r}: {exc}",
            fix="check the master / remote URL and that the cluster is reachable",
        ) from exc
    if remote is None:
        spark.sparkContext.setLogLevel(log_level)
    return spark
