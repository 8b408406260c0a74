"""Building the SparkSession: the Java check, shuffle partitions, required settings.

The Java tests point JAVA_HOME / PATH at tiny fake ``java`` scripts, so they check our
parsing without starting a JVM. Everything else uses the one shared test session.
"""

import datetime as dt
import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.core.spark.java_runtime import (
    MIN_JAVA_MAJOR,
    check_java,
    find_java,
    java_major_version,
)
from dagster_sideinputs.core.spark.packages import (
    KAFKA,
    OPTIONAL_PACKAGES,
    default_ivy_dir,
    forget_jar_list,
    retrieved_jar,
)
from dagster_sideinputs.core.spark.session import (
    REQUIRED_CONFIGS,
    _choose_worker_python,
    _launch_class_path,
    _local_builder,
    build_spark_session,
    default_shuffle_partitions,
    is_local_master,
)
from dagster_sideinputs.delta.spark.setup import delta_package
from dagster_sideinputs.errors import SparkStartupError
from tests.cluster import free_port, spark_env
from tests.conftest import CODEGEN

INSTALL_HINT = "openjdk-17-jre-headless"


def fake_java(home: Path, script: str) -> Path:
    """A ``<home>/bin/java`` shell script; returns its path."""
    java = home / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\n{script}\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


def banner(version: str) -> str:
    """What ``java -version`` prints (to stderr), e.g. for ``1.8.0_392``."""
    return f"echo 'openjdk version \"{version}\" 2024-01-16' >&2\necho 'OpenJDK Runtime' >&2"


# --- the Java check --------------------------------------------------------------------


def test_java_home_without_java_raises_with_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkStartupError, match=r"Java 17\+ but no executable") as info:
        check_java()
    assert str(tmp_path / "bin" / "java") in info.value.message
    assert INSTALL_HINT in str(info.value.fix)


def test_no_java_on_path_raises_with_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkStartupError, match=r"no `java` on PATH was found") as info:
        check_java()
    assert INSTALL_HINT in str(info.value.fix)


def test_java_8_is_rejected_with_the_install_hint(monkeypatch, tmp_path):
    java = fake_java(tmp_path / "jdk8", banner("1.8.0_392"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    with pytest.raises(SparkStartupError, match=r"needs Java 17\+, but .* is Java 8\.") as info:
        check_java()
    assert str(java) in info.value.message
    assert INSTALL_HINT in str(info.value.fix)


def test_java_11_is_rejected(monkeypatch, tmp_path):
    fake_java(tmp_path / "jdk11", banner("11.0.22"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk11"))
    with pytest.raises(SparkStartupError, match=r"is Java 11\."):
        check_java()


@pytest.mark.parametrize(
    ("version", "major"),
    [("1.8.0_392", 8), ("9.0.4", 9), ("17.0.15", 17), ("21", 21), ("25-ea", 25)],
)
def test_java_version_banner_gives_the_major_version(tmp_path, version, major):
    java = fake_java(tmp_path, banner(version))
    assert java_major_version(str(java)) == major


def test_java_17_from_java_home_passes(monkeypatch, tmp_path):
    fake_java(tmp_path, banner("17.0.15"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert check_java() == 17


def test_java_on_path_is_used_when_java_home_is_unset(monkeypatch, tmp_path):
    java = fake_java(tmp_path, banner("21.0.2"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(java.parent))
    assert find_java() == str(java)
    assert check_java() == 21


def test_java_home_wins_over_java_on_path(monkeypatch, tmp_path):
    on_path = fake_java(tmp_path / "path", banner("21.0.2"))
    fake_java(tmp_path / "home", banner("1.8.0_392"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "home"))
    with pytest.raises(SparkStartupError, match="is Java 8"):
        check_java()


def test_java_that_prints_no_version_raises_what_it_printed(tmp_path):
    java = fake_java(tmp_path, "echo 'Error: could not open jvm.cfg' >&2\nexit 1")
    with pytest.raises(SparkStartupError, match="printed no version: 'Error: could not open"):
        java_major_version(str(java))


def test_java_that_hangs_times_out_instead_of_hanging(tmp_path):
    java = fake_java(tmp_path, "exec sleep 30")
    with pytest.raises(SparkStartupError, match="Could not run") as info:
        java_major_version(str(java), timeout_s=0.5)
    assert INSTALL_HINT in str(info.value.fix)


def test_installed_java_is_recent_enough():
    assert check_java() >= MIN_JAVA_MAJOR


def test_missing_java_fails_before_any_session_is_built(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkStartupError, match="Java 17"):
        build_spark_session(master="local[2]", ui_enabled=False)


# --- shuffle partitions -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("master", "partitions"),
    [
        ("local[2]", 4),
        ("local[1]", 4),
        ("local[8]", 16),
        ("local[3,2]", 6),
        ("local", 4),
        ("local[*]", 32),
        ("local[*,4]", 32),
        ("spark://x:7077", None),
        ("yarn", None),
        ("local-cluster[2,1,1024]", None),
    ],
)
def test_default_shuffle_partitions_are_two_per_local_core(monkeypatch, master, partitions):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_shuffle_partitions(master) == partitions


# --- the session ---------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), sorted(REQUIRED_CONFIGS.items()))
def test_running_session_has_the_required_config(spark, key, value):
    assert spark.conf.get(key) == value


def test_session_time_zone_is_utc(spark):
    assert spark.sql("select current_timezone() as tz").first().tz == "UTC"


def test_timestamps_are_written_as_utc_microseconds(spark, tmp_path):
    at = dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)
    spark.createDataFrame([(at,)], "at timestamp").coalesce(1).write.parquet(str(tmp_path / "t"))
    [written] = (tmp_path / "t").glob("*.parquet")
    table = pq.read_table(written)
    assert str(table.schema.field("at").type) == "timestamp[us, tz=UTC]"
    assert table.column("at")[0].as_py() == at


def test_spark_writes_no_success_marker_files(spark, tmp_path):
    spark.range(3).write.parquet(str(tmp_path / "t"))
    assert not (tmp_path / "t" / "_SUCCESS").exists()


def test_building_again_returns_the_running_session(spark):
    again = build_spark_session(
        master="local[2]", ui_enabled=False, shuffle_partitions=4, log_level="ERROR"
    )
    assert again is spark


def test_master_ui_and_shuffle_options_reach_the_session(spark):
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.sparkContext.getConf().get("spark.ui.enabled") == "false"


# --- Spark Connect -----------------------------------------------------------------------


def test_remote_url_fails_fast_with_startup_error_and_keeps_the_classic_session(spark):
    # Without the Connect client this fails on import; with it, pyspark refuses to mix
    # a remote session with the running classic one. Neither contacts the URL.
    with pytest.raises(SparkStartupError, match=r"sc://127\.0\.0\.1:1"):
        build_spark_session(remote="sc://127.0.0.1:1")
    assert SparkSession.getActiveSession() is spark
    assert spark.range(3).count() == 3
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


# --- the executors' Python ---------------------------------------------------------------


def test_python_workers_of_the_local_session_run_this_interpreter(spark):
    # Not `python3` from PATH, which may lack this project's packages (pyarrow, ...).
    where = F.udf(lambda _: sys.executable, "string")
    assert spark.range(1).select(where("id")).first()[0] == sys.executable


@pytest.mark.parametrize(
    ("preset", "master", "settings", "expected"),
    [
        (None, "local[2]", {}, sys.executable),
        (None, "spark://10.0.0.5:7077", {}, None),
        (None, "spark://10.0.0.5:7077", {"spark.pyspark.python": "/opt/py"}, "/opt/py"),
        ("/usr/bin/python3.11", "local[2]", {}, "/usr/bin/python3.11"),
    ],
)
def test_worker_python_defaults_to_this_interpreter_on_local_masters_only(
    monkeypatch, preset, master, settings, expected
):
    if preset is None:
        monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    else:
        monkeypatch.setenv("PYSPARK_PYTHON", preset)
    _choose_worker_python(master, settings)
    assert os.environ.get("PYSPARK_PYTHON") == expected


# --- Delta and other JVM packages --------------------------------------------------------

_OFFLINE_SESSION = """
import glob, json, logging, sys
from pyspark import SparkFiles

warnings = []


class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())


logging.getLogger("dagster_sideinputs").addHandler(Keep(level=logging.WARNING))
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.delta.spark.setup import is_delta_configured

args = json.loads(sys.argv[1])
report = {"warnings": warnings}
try:
    spark = build_spark_session(master="local[1]", ui_enabled=False, log_level="ERROR", **args)
except Exception as exc:
    report.update(error=type(exc).__name__, message=str(exc))
else:
    report.update(delta=is_delta_configured(spark), count=spark.range(3).count())
    conf = spark.sparkContext.getConf()
    report.update(
        packages=conf.get("spark.dsi.packages", ""),
        resolved=conf.get("spark.jars.packages", ""),
        class_path=spark.sparkContext._jvm.java.lang.System.getProperty("java.class.path"),
        copied=[p for p in glob.glob(SparkFiles.getRootDirectory() + "/**", recursive=True)
                if p.endswith(".jar")],
    )
    if report["delta"]:
        table = sys.argv[2] + "/table"
        spark.range(4).write.format("delta").save(table)
        report.update(delta_rows=spark.read.format("delta").load(table).count())
    spark.stop()
print("REPORT " + json.dumps(report))
"""


def test_subprocess_jvms_of_the_tests_get_their_jvm_options_and_nothing_else_of_spark(
    monkeypatch,
):
    """``spark_env`` (every JVM the tests start in a subprocess) passes on the JVM options
    and the class-archive setting tests/conftest.py gives them, and drops every other
    Spark or project setting of this process."""
    kept = {
        "SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=1",
        "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC",
        "DSI_JVM_ARCHIVE": "on",
    }
    for name, value in {**kept, "SPARK_CONF_DIR": "/elsewhere", "DSI_LAKE_ROOT": "/x"}.items():
        monkeypatch.setenv(name, value)
    env = spark_env(DSI_SPARK_UI="false")
    assert {name: env.get(name) for name in kept} == kept
    assert "SPARK_CONF_DIR" not in env
    assert "DSI_LAKE_ROOT" not in env
    assert env["DSI_SPARK_UI"] == "false"


def start_offline(
    tmp_path: Path, ivy: Path | None = None, *, hide_m2: bool = True, **args: object
) -> dict:
    """Build a session in a subprocess whose Maven repository refuses connections.

    ``DEFAULT_ARTIFACT_REPOSITORY`` replaces Maven Central (and spark-packages) in Spark's
    Ivy resolver chain, and ``hide_m2`` hides ``~/.m2/repository``, the first link of that
    chain (``-Duser.home``), so nothing can be found but what ``ivy`` (default: the real
    Ivy cache) already holds. The real cache may point at ``~/.m2`` for modules it found
    there, so a test of it keeps ``~/.m2``.
    """
    if ivy is not None:
        args["configs"] = {"spark.jars.ivy": str(ivy)}
    extra = {"DEFAULT_ARTIFACT_REPOSITORY": f"http://127.0.0.1:{free_port()}/"}
    if hide_m2:
        home = tmp_path / "home"
        home.mkdir(exist_ok=True)
        extra["SPARK_SUBMIT_OPTS"] = f"-Duser.home={home}"
    env = spark_env(**extra)
    proc = subprocess.run(
        [sys.executable, "-c", _OFFLINE_SESSION, json.dumps(args), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")] or [
        f"REPORT {json.dumps({'crashed': proc.stderr[-3000:]})}"
    ]
    return json.loads(line.removeprefix("REPORT "))


def jars_under(folder: Path) -> list[Path]:
    return list(folder.rglob("*.jar")) if folder.exists() else []


@pytest.mark.slow
def test_delta_auto_without_maven_starts_without_delta_and_says_why_in_one_line(tmp_path):
    ivy = tmp_path / "ivy"
    report = start_offline(tmp_path, ivy, delta="auto")
    assert report.get("count") == 3, report
    assert report["delta"] is False
    assert report["packages"] == ""
    [warning] = report["warnings"]
    assert "\n" not in warning
    assert "Delta Lake for Spark is off" in warning
    assert "io.delta:delta-spark_4.1_2.13:4.4.0" in warning
    assert "Connection refused" in warning
    assert "delta-rs bridge" in warning
    assert "python -m dagster_sideinputs.core.spark.jars fetch" in warning
    assert jars_under(ivy) == []


@pytest.mark.slow
@pytest.mark.extended  # tier 3: a JVM start in a subprocess
def test_a_retrieved_jar_that_ivy_cannot_resolve_offline_falls_back_the_same_way(tmp_path):
    # The jar file passes the quick cache check, but Ivy's cache has no metadata for it:
    # the JVM dies resolving it, and the session is retried after a captured resolution.
    ivy = tmp_path / "ivy"
    (ivy / "jars").mkdir(parents=True)
    Path(retrieved_jar(delta_package(), str(ivy))).touch()
    report = start_offline(tmp_path, ivy, delta="auto")
    assert report.get("count") == 3, report
    assert report["delta"] is False
    [warning] = report["warnings"]
    assert "Connection refused" in warning


@pytest.mark.slow
def test_delta_true_without_maven_fails_naming_the_jar_and_the_fix(tmp_path):
    report = start_offline(tmp_path, tmp_path / "ivy", delta=True)
    assert report.get("error") == "SparkStartupError", report
    assert "io.delta:delta-spark_4.1_2.13:4.4.0" in report["message"]
    assert "Connection refused" in report["message"]
    assert "Fix: make Maven Central" in report["message"]
    assert report["warnings"] == []


@pytest.mark.slow
@pytest.mark.extended  # tier 3: a JVM start in a subprocess
def test_named_packages_without_maven_fail_even_with_delta_auto(tmp_path):
    kafka = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"
    report = start_offline(tmp_path, tmp_path / "ivy", delta="auto", packages=[kafka])
    assert report.get("error") == "SparkStartupError", report
    assert kafka in report["message"]


@pytest.mark.slow
@pytest.mark.extended  # tier 3: a JVM start in a subprocess
def test_cached_packages_start_without_any_network(tmp_path):
    # The real Ivy cache, filled by `make install`; Maven is unreachable in the subprocess.
    # Packages from configs and from `packages` are merged, in order, without repeats.
    report = start_offline(
        tmp_path,
        hide_m2=False,
        delta=True,
        configs={"spark.jars.packages": ",".join(OPTIONAL_PACKAGES[:2])},
        packages=list(OPTIONAL_PACKAGES[1:]),
    )
    assert report.get("count") == 3, report
    assert report["delta"] is True
    assert report["packages"].split(",") == [delta_package(), *OPTIONAL_PACKAGES]
    assert report["delta_rows"] == 4
    assert report["warnings"] == []


@pytest.mark.slow
@pytest.mark.extended  # tier 3: a JVM start in a subprocess
def test_a_second_start_of_the_same_packages_neither_resolves_nor_copies_jars(tmp_path, request):
    # An exclusion no package has gives these starts a jar list of their own.
    configs = {"spark.jars.excludes": f"org.example:unused-{uuid.uuid4().hex}"}
    request.addfinalizer(lambda: forget_jar_list([delta_package()], configs))
    first = start_offline(tmp_path / "first", hide_m2=False, delta=True, configs=configs)
    assert first.get("delta_rows") == 4, first
    # Resolved through Ivy, and PySpark copied every jar into the session's folder.
    assert first["resolved"] == first["packages"] == delta_package()
    assert any(Path(jar).name.startswith("io.delta_delta-spark") for jar in first["copied"])
    second = start_offline(tmp_path / "second", hide_m2=False, delta=True, configs=configs)
    assert second.get("delta_rows") == 4, second
    assert second["packages"] == delta_package()
    assert second["resolved"] == ""  # no Ivy resolution at all
    assert second["copied"] == []
    assert str(Path(retrieved_jar(delta_package(), default_ivy_dir()))) in second[
        "class_path"
    ].split(os.pathsep)
    assert second["warnings"] == []


def test_packages_over_connect_fail_before_connecting():
    with pytest.raises(SparkStartupError, match="cannot be added over Spark Connect") as info:
        build_spark_session(remote="sc://127.0.0.1:1", packages=[KAFKA])
    assert f"--packages {KAFKA}" in str(info.value.fix)


def test_a_bad_package_coordinate_fails_before_the_jvm_starts(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # a JVM start would fail on Java first
    with pytest.raises(SparkStartupError, match="'kafka-0-10' is neither a Maven coordinate"):
        build_spark_session(master="local[1]", packages=["kafka-0-10"])


def test_the_shared_session_interprets_expressions_unless_told_to_generate_code(spark):
    """tests/conftest.py INTERPRETED: no whole-stage code in the shared session's plans
    (``*(1)`` marks a generated stage), unless ``DSI_TEST_CODEGEN=1`` asked for Spark's
    defaults."""
    plan = spark.range(3).selectExpr("id + 1 AS n")._jdf.queryExecution().executedPlan()
    generated = "*(" in plan.toString()
    assert generated == CODEGEN, plan.toString()
    factory = spark.conf.get("spark.sql.codegen.factoryMode")
    assert factory == ("FALLBACK" if CODEGEN else "NO_CODEGEN")


def test_delta_rebuilds_table_state_in_as_many_tasks_as_shuffle_partitions(spark):
    # Delta's default of 50 made each first read after a commit 10-20 s slower locally.
    assert spark.conf.get("spark.databricks.delta.snapshotPartitions") == "4"


def test_the_operator_fits_cluster_shuffle_partitions_until_the_user_sets_them(spark, tmp_path):
    """On a session marked to follow its executor cores (what build_spark_session does for
    a cluster master given no count), each run sets two partitions per core before its
    steps; a count somebody else set afterwards is kept from then on."""
    import deltalake
    import pyarrow as pa

    import dagster_sideinputs as dsi
    from dagster_sideinputs.core.spark.session import FOLLOW_CORES

    main = str(tmp_path / "events")
    deltalake.write_deltalake(main, pa.table({"k": pa.array([1, 2], pa.int64())}))
    op = dsi.SideInputOperator(
        main=dsi.MainInput("events", key="k", path=main),
        side_inputs={},
        fn=lambda records, sides: records,
        main_output="copied",
        storage=dsi.DeltaStorage(str(tmp_path / "lake")),
    )
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set(FOLLOW_CORES, "cores")
        spark.conf.set("spark.sql.shuffle.partitions", "200")  # Spark's default on a cluster
        assert [b.rows_in for b in op.run(spark).batches] == [2]
        cores = spark.sparkContext.defaultParallelism
        assert spark.conf.get("spark.sql.shuffle.partitions") == str(max(4, 2 * cores))
        spark.conf.set("spark.sql.shuffle.partitions", "7")  # the user's own choice
        op.run(spark)
        assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
        assert spark.conf.get(FOLLOW_CORES) == "user"
    finally:
        spark.conf.unset(FOLLOW_CORES)
        spark.conf.unset(FOLLOW_CORES + ".applied")
        spark.conf.set("spark.sql.shuffle.partitions", before)


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[2,3]", True),
        ("local-cluster[2,1,1024]", False),
        ("spark://127.0.0.1:7077", False),
    ],
)
def test_only_masters_whose_executors_share_the_drivers_jvm_are_local(master, local):
    assert is_local_master(master) is local


def test_recorded_jars_follow_the_users_dist_class_path_during_the_launch_only(monkeypatch):
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", "/opt/hadoop/*")
    with _launch_class_path(["/ivy/jars/a.jar", "/ivy/jars/b.jar"]):
        assert os.environ["SPARK_DIST_CLASSPATH"] == os.pathsep.join(
            ["/opt/hadoop/*", "/ivy/jars/a.jar", "/ivy/jars/b.jar"]
        )
    assert os.environ["SPARK_DIST_CLASSPATH"] == "/opt/hadoop/*"
    monkeypatch.delenv("SPARK_DIST_CLASSPATH")
    with _launch_class_path(["/ivy/jars/a.jar"]):
        assert os.environ["SPARK_DIST_CLASSPATH"] == "/ivy/jars/a.jar"
    assert "SPARK_DIST_CLASSPATH" not in os.environ


@pytest.mark.parametrize("delta", [False, True], ids=["packages", "delta"])
@pytest.mark.parametrize(
    ("master", "in_spark_jars"),
    [("spark://127.0.0.1:7077", True), ("local-cluster[2,1,1024]", True), ("local[2]", False)],
)
def test_recorded_jars_go_to_a_clusters_spark_jars_after_the_users_own(
    master, in_spark_jars, delta
):
    """A start from a recorded jar list resolves nothing: a cluster's executors fetch the
    jars from the driver (``spark.jars``, after any the user named); a local master gets
    them on the launched JVM's class path instead (the test above)."""
    recorded = ["/ivy/jars/io.delta_delta-spark.jar", "/ivy/jars/org.example_kafka.jar"]
    settings = {"spark.jars": "/opt/own.jar"}
    builder = _local_builder("t", master, settings, delta=delta, packages=[KAFKA], jars=recorded)
    options = dict(builder._options)
    assert "spark.jars.packages" not in options
    expected = ",".join(["/opt/own.jar", *recorded]) if in_spark_jars else "/opt/own.jar"
    assert options["spark.jars"] == expected
    coordinates = options["spark.dsi.packages"].split(",")
    assert coordinates == ([delta_package()] if delta else []) + [KAFKA]
    # Without a recorded list the same builder asks Ivy for the packages.
    fresh = dict(_local_builder("t", master, {}, delta=delta, packages=[KAFKA], jars=None)._options)
    assert KAFKA in fresh["spark.jars.packages"].split(",")
    assert "spark.jars" not in fresh
