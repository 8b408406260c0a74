"""Building a SparkSession with the settings the project relies on.

The Dagster ``SparkResource`` is a thin configurable wrapper around
:func:`build_spark_session`; plain PySpark programs can call it directly.
"""

import importlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyspark
from pyspark.errors import AnalysisException, PySparkRuntimeError
from pyspark.sql import SparkSession

from dagster_sideinputs.core.packages import (
    fetch_packages,
    ivy_dir_of,
    missing_packages,
    parse_packages,
)
from dagster_sideinputs.errors import SparkStartupError

log = logging.getLogger("dagster_sideinputs")

MIN_JAVA_MAJOR = 17

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

_JAVA_INSTALL_HINT = (
    "install a Java 17+ runtime (Debian/Ubuntu: `apt-get install -y openjdk-17-jre-headless`, "
    "macOS: `brew install openjdk@17`) and make `java` available on PATH or set JAVA_HOME"
)


def find_java() -> str | None:
    """Path of the ``java`` executable PySpark will launch, or None when there is none."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def java_major_version(java: str, *, timeout_s: float = 30.0) -> int:
    """Major version of a ``java`` executable (8 for ``1.8.0_x``, 17 for ``17.0.15``)."""
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkStartupError(
            f"Could not run `{java} -version` ({exc}).", fix=_JAVA_INSTALL_HINT
        ) from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if match is None:
        raise SparkStartupError(
            f"`{java} -version` printed no version: {proc.stderr.strip()[:200]!r}.",
            fix=_JAVA_INSTALL_HINT,
        )
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java(min_major: int = MIN_JAVA_MAJOR) -> int:
    """Fail fast, with the install command, when no suitable Java is found.

    PySpark itself would either hang waiting for the JVM gateway or print a long
    stack trace; this check turns both into one clear :class:`SparkStartupError`.

    Returns:
        The major version of the Java that Spark will use.
    """
    java = find_java()
    if java is None:
        java_home = os.environ.get("JAVA_HOME")
        where = (
            f"executable {os.path.join(java_home, 'bin', 'java')} (from JAVA_HOME)"
            if java_home
            else "`java` on PATH"
        )
        raise SparkStartupError(
            f"Spark needs Java {min_major}+ but no {where} was found.", fix=_JAVA_INSTALL_HINT
        )
    major = java_major_version(java)
    if major < min_major:
        raise SparkStartupError(
            f"Spark 4 needs Java {min_major}+, but {java} is Java {major}.", fix=_JAVA_INSTALL_HINT
        )
    return major


def default_shuffle_partitions(master: str) -> int | None:
    """A shuffle partition count that suits a local master: two per core, at least 4."""
    match = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
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


def _require_connect_client(remote: str) -> None:
    """Fail with the pip command when the Spark Connect client's packages are missing."""
    try:
        # Importing it checks grpcio, grpcio-status, googleapis-common-protos, ...
        importlib.import_module("pyspark.sql.connect.session")
    except ImportError as exc:
        version = ".".join(pyspark.__version__.split(".")[:2])
        raise SparkStartupError(
            f"Spark Connect URL {remote!r} needs the Spark Connect client, whose "
            f"packages are not installed: {exc}",
            fix=f'pip install "pyspark[connect]=={version}.*"',
        ) from exc


CONNECT_DEFAULT_PORT = 15002


def connect_endpoint(remote: str) -> tuple[str, int] | None:
    """(host, port) of an ``sc://host:port/;params`` URL; None for other remote forms."""
    if not remote.startswith("sc://"):
        return None
    parsed = urllib.parse.urlparse("http" + remote[2:])
    if not parsed.hostname:
        return None
    try:
        port = parsed.port
    except ValueError:  # a malformed port: let the Connect client report it
        return None
    return parsed.hostname, port or CONNECT_DEFAULT_PORT


def _require_connect_server(remote: str, *, timeout_s: float) -> None:
    """Fail fast when nothing listens at the Connect URL.

    The Connect client retries an unreachable server with backoff for more than ten
    minutes before it gives up; a TCP connect answers in milliseconds.
    """
    endpoint = connect_endpoint(remote)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise SparkStartupError(
            f"No Spark Connect server answers at {host}:{port} (from {remote!r}): {exc}.",
            fix="start one (`spark-submit --class "
            "org.apache.spark.sql.connect.service.SparkConnectServer spark-internal`, or "
            "`sbin/start-connect-server.sh` of a Spark distribution), or fix the URL's host / port",
        ) from exc


def _apply_remote_settings(
    spark: SparkSession, settings: Mapping[str, str], *, remote: str, required: Mapping[str, str]
) -> None:
    """Set each setting on a Spark Connect session; fail naming those the server refuses.

    A Connect session can change runtime SQL settings only: static ones (executor
    memory, the UI, the warehouse, ...) are fixed when the server starts, and the Connect
    builder would drop them with a mere warning. A value the server already has passes.
    """
    refused: dict[str, str | None] = {}
    for key, value in settings.items():
        try:
            spark.conf.set(key, value)
        except AnalysisException:  # CANNOT_MODIFY_CONFIG / CANNOT_MODIFY_STATIC_CONFIG
            found = spark.conf.get(key, None)
            if found != value:
                refused[key] = found
    if not refused:
        return
    shown = ", ".join(
        f"{key}={settings[key]!r} (server has {found!r})" for key, found in sorted(refused.items())
    )
    needed = sorted(set(refused) & set(required))
    why = (
        f" The Delta bridge needs {needed} to be correct."
        if needed
        else " They would be silently ignored."
    )
    conf_flags = " ".join(f"--conf {key}={settings[key]}" for key in sorted(refused))
    raise SparkStartupError(
        f"The Spark Connect server at {remote!r} refuses settings that a Connect session "
        f"cannot change (Spark Connect sets only runtime SQL settings per session): {shown}." + why,
        fix=f"start the Connect server with them (`{conf_flags}`), or drop them from the "
        "session's configs",
    )


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


DeltaMode = Literal["auto"] | bool

_FETCH_FIX = (
    "make Maven Central (https://repo1.maven.org/maven2) reachable and run "
    "`python -m dagster_sideinputs.core.jars fetch` once (`make install` does), or name a "
    "mirror in spark.jars.repositories / DEFAULT_ARTIFACT_REPOSITORY (docs/JVM_PACKAGES.md)"
)


def _resolve_jvm_packages(
    delta: DeltaMode, packages: list[str], settings: Mapping[str, str], *, trust_cache: bool = True
) -> bool:
    """Make sure the session's Maven packages are in the Ivy cache; whether to configure Delta.

    Cached packages cost nothing here (a file check), so a start needs no network. Missing
    ones are resolved in a separate spark-submit first: its output is captured, and a
    failure becomes one clear message instead of a JVM that dies before PySpark's gateway
    answers. With ``delta="auto"`` a Delta jar that cannot be had turns Delta off (one
    warning); packages asked for by name, or ``delta=True``, fail the start instead.
    ``trust_cache=False`` resolves even when every jar is there (after a start failed).
    """
    want_delta = delta is True or delta == "auto"
    if not want_delta and not packages:
        return False
    coordinates = list(packages)
    if want_delta:
        try:
            # Our wrapper of delta-spark's pip package; core never imports `delta` itself.
            from dagster_sideinputs.delta.spark_setup import delta_package

            coordinates.insert(0, delta_package())
        except ImportError as exc:
            if delta is True:
                raise SparkStartupError(
                    f"delta=True needs the delta-spark pip package: {exc}.",
                    fix='pip install "delta-spark==4.4.0"',
                ) from exc
            log.warning("Delta Lake for Spark is off: delta-spark is not importable (%s).", exc)
            want_delta = False
            coordinates = list(packages)
    ivy = ivy_dir_of(settings)
    repositories = settings.get("spark.jars.repositories")
    if trust_cache and not missing_packages(coordinates, ivy):
        return want_delta
    result = fetch_packages(coordinates, ivy_dir=ivy, repositories=repositories)
    if result.ok:
        return want_delta
    if delta == "auto" and want_delta:
        if packages and missing_packages(packages, ivy):
            rest = fetch_packages(packages, ivy_dir=ivy, repositories=repositories)
            if not rest.ok:
                raise SparkStartupError(
                    f"Could not fetch the Spark packages {packages} into {ivy}: {rest.reason}.",
                    fix=_FETCH_FIX,
                )
        log.warning(
            "Delta Lake for Spark is off in this session: could not fetch %s into %s (%s); "
            "Delta tables go through the delta-rs bridge. To turn it on, %s.",
            coordinates[0],
            ivy,
            result.reason,
            _FETCH_FIX,
        )
        return False
    raise SparkStartupError(
        f"Could not fetch the Spark packages {coordinates} into {ivy}: {result.reason}.",
        fix=_FETCH_FIX,
    )


def _local_builder(
    app_name: str, master: str, settings: Mapping[str, str], *, delta: bool, packages: list[str]
) -> SparkSession.Builder:
    """A classic builder with every setting, Delta (through delta-spark) and the packages."""
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    if delta:
        from dagster_sideinputs.delta.spark_setup import configure_delta

        return configure_delta(
            builder, extensions=settings.get("spark.sql.extensions"), extra_packages=packages
        )
    if packages:
        builder = builder.config("spark.jars.packages", ",".join(packages))
    return builder


def _check_remote_delta(spark: SparkSession, remote: str) -> None:
    """delta=True over Spark Connect: the server must run with Delta's extension and catalog."""
    from dagster_sideinputs.delta.spark_setup import (
        DELTA_CATALOG,
        DELTA_SQL_EXTENSION,
        delta_package,
        is_delta_configured,
    )

    if is_delta_configured(spark):
        return
    raise SparkStartupError(
        f"delta=True, but the Spark Connect server at {remote!r} runs without Delta Lake "
        "(spark.sql.extensions / spark.sql.catalog.spark_catalog are not Delta's).",
        fix=f"start the server with `--packages {delta_package()} --conf "
        f"spark.sql.extensions={DELTA_SQL_EXTENSION} --conf "
        f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}`, or pass delta='auto'",
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
    """Start (or reuse) a SparkSession configured for the Delta bridge.

    Args:
        master: Spark master URL: ``local[*]``, ``local[2]``, ``spark://host:7077``, ...
        remote: a Spark Connect URL (``sc://host:15002``); replaces ``master``. The Connect
            server owns the JVM, so ``app_name``, ``ui_enabled``, ``driver_memory`` and
            ``log_level`` are the server's business there and are not applied; the other
            settings are set on the session and must be runtime SQL settings.
        app_name: application name shown in the Spark UI.
        shuffle_partitions: ``spark.sql.shuffle.partitions``; by default two per core for
            local masters and Spark's default on a cluster.
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
        packages: more Maven coordinates to load (``spark.jars.packages``), e.g.
            :data:`~dagster_sideinputs.core.packages.KAFKA_PACKAGES` or ``S3A_PACKAGES``;
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
            ``delta=True``), or the session could not start.

    Examples:
        >>> spark = build_spark_session(master="local[2]", ui_enabled=False)  # doctest: +SKIP
    """
    settings: dict[str, str] = dict(DEFAULT_CONFIGS)
    # Over Connect the master is the server's, so only an explicit count applies.
    partitions = shuffle_partitions or (None if remote else default_shuffle_partitions(master))
    if partitions is not None:
        settings["spark.sql.shuffle.partitions"] = str(partitions)
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
            fix="name each package group:artifact:version, e.g. "
            "'org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1'",
        ) from exc

    if remote is not None:
        if wanted:
            raise SparkStartupError(
                f"Spark packages {wanted} cannot be added over Spark Connect ({remote!r}): "
                "the server's JVM loads jars when it starts.",
                fix=f"start the Connect server with `--packages {','.join(wanted)}`",
            )
        _require_connect_client(remote)
        _require_connect_server(remote, timeout_s=10.0)
        # Settings go through conf.set below: the Connect builder ignores refused ones.
        builder = SparkSession.builder.remote(remote)
    else:
        check_java()
        _choose_worker_python(master, settings)
        use_delta = _resolve_jvm_packages(delta, wanted, settings)
        if use_delta and partitions is not None and default_shuffle_partitions(master):
            # Delta rebuilds a table's state from its log in 50 tasks by default; on a local
            # master that made every first read after a commit 10-20 s slower (measured on
            # two cores), for tables whose log is a few files.
            settings.setdefault("spark.databricks.delta.snapshotPartitions", str(partitions))
        builder = _local_builder(app_name, master, settings, delta=use_delta, packages=wanted)
    try:
        try:
            spark = builder.getOrCreate()
        except PySparkRuntimeError as exc:
            if remote is not None or not (use_delta or wanted):
                raise
            if exc.getCondition() != "JAVA_GATEWAY_EXITED":
                raise
            # The jars were there, yet Ivy could not resolve them offline (its metadata may
            # point at a ~/.m2 that was cleaned): resolve again, capturing why, and retry.
            use_delta = _resolve_jvm_packages(delta, wanted, settings, trust_cache=False)
            builder = _local_builder(app_name, master, settings, delta=use_delta, packages=wanted)
            spark = builder.getOrCreate()
        if remote is not None:
            try:
                _apply_remote_settings(spark, settings, remote=remote, required=REQUIRED_CONFIGS)
                if delta is True:
                    _check_remote_delta(spark, remote)
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
