"""The optional JVM packages: coordinates, the Ivy cache layout, fetching, and that the
shared test session really loaded them (one JVM for every engine and connector test).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

from dagster_sideinputs.core.spark.packages import (
    AVRO,
    AWS_SDK_BUNDLE,
    HADOOP_AWS,
    JAR_LISTS,
    KAFKA,
    OPTIONAL_PACKAGES,
    S3A_PACKAGES,
    cached_jar_list,
    default_ivy_dir,
    forget_jar_list,
    ivy_dir_of,
    missing_packages,
    parse_packages,
    remember_jar_list,
    retrieved_jar,
)
from dagster_sideinputs.delta.spark.setup import delta_package
from tests.cluster import free_port, spark_env

# --- coordinates and the cache layout ---------------------------------------------------------


def test_package_list_is_split_trimmed_and_deduplicated_in_order():
    assert parse_packages(f" {KAFKA}, {AVRO},,{KAFKA} ") == [KAFKA, AVRO]
    assert parse_packages([AVRO, KAFKA, AVRO]) == [AVRO, KAFKA]
    assert parse_packages(None) == []


@pytest.mark.parametrize("bad", ["kafka-0-10", "a:b", "a:b:c:d", "a::1"])
def test_a_coordinate_without_group_artifact_and_version_is_refused(bad):
    with pytest.raises(ValueError, match="is neither a Maven coordinate group:artifact:version"):
        parse_packages([bad])


def test_a_short_name_stands_for_the_packages_that_match_this_spark():
    assert parse_packages(["Kafka", "s3", KAFKA]) == [KAFKA, *S3A_PACKAGES]


def test_spark_retrieves_a_package_as_group_underscore_artifact_dash_version(tmp_path):
    assert retrieved_jar(KAFKA, str(tmp_path)) == str(
        tmp_path / "jars" / "org.apache.spark_spark-sql-kafka-0-10_2.13-4.1.1.jar"
    )


def test_missing_packages_are_those_without_a_retrieved_jar(tmp_path):
    (tmp_path / "jars").mkdir()
    Path(retrieved_jar(AVRO, str(tmp_path))).touch()
    assert missing_packages([KAFKA, AVRO], str(tmp_path)) == [KAFKA]


def test_ivy_dir_is_spark_jars_ivy_or_spark_4s_default():
    assert ivy_dir_of({"spark.jars.ivy": "/srv/ivy"}) == "/srv/ivy"
    assert ivy_dir_of({}) == default_ivy_dir()
    assert default_ivy_dir().endswith(".ivy2.5.2")


def test_versions_match_the_pinned_pyspark_and_its_hadoop():
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    assert pyspark.__version__ == "4.1.1"
    assert KAFKA.endswith(f":{pyspark.__version__}")
    assert AVRO.endswith(f":{pyspark.__version__}")
    hadoop = HADOOP_AWS.rsplit(":", 1)[1]
    assert (jars / f"hadoop-client-api-{hadoop}.jar").exists()
    assert OPTIONAL_PACKAGES == (KAFKA, AVRO, HADOOP_AWS, AWS_SDK_BUNDLE)


# --- the fetch command -------------------------------------------------------------------------


def fetch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dagster_sideinputs.core.spark.jars", *args],
        capture_output=True,
        text=True,
        env=env or spark_env(),
        timeout=600,
        check=False,
    )


def test_fetch_lists_delta_first_then_the_optional_packages():
    listed = fetch("list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [delta_package(), *OPTIONAL_PACKAGES]


def test_fetch_with_everything_cached_is_a_file_check():
    started = time.monotonic()
    done = fetch("fetch")  # `make test` ran `make install`, which fetched them
    assert done.returncode == 0, done.stderr
    assert "already in" in done.stdout
    assert time.monotonic() - started < 30  # a Python start: no JVM, no network


@pytest.mark.slow
def test_fetch_without_maven_exits_2_naming_each_package_and_the_fix():
    with tempfile.TemporaryDirectory() as scratch:
        home, ivy = Path(scratch, "home"), Path(scratch, "ivy")
        home.mkdir()
        env = spark_env(
            DEFAULT_ARTIFACT_REPOSITORY=f"http://127.0.0.1:{free_port()}/",
            SPARK_SUBMIT_OPTS=f"-Duser.home={home}",  # hides ~/.m2/repository
        )
        done = fetch("fetch", "--ivy", str(ivy), env=env)
        assert done.returncode == 2, done.stdout + done.stderr
        for coordinate in (delta_package(), *OPTIONAL_PACKAGES):
            assert coordinate in done.stderr
        assert "Connection refused" in done.stderr
        assert "Fix: make Maven Central" in done.stderr
        assert not list(ivy.rglob("*.jar"))


# --- the jar list a start records for the next one ---------------------------------------------


def ivy_with_jars(tmp_path: Path, *names: str) -> tuple[dict[str, str], list[str]]:
    """Settings naming an Ivy directory under tmp_path, and jars retrieved into it."""
    ivy = tmp_path / "ivy"
    (ivy / "jars").mkdir(parents=True)
    jars = []
    for name in names:
        (ivy / "jars" / name).write_bytes(b"PK")
        jars.append(str(ivy / "jars" / name))
    return {"spark.jars.ivy": str(ivy)}, jars


def test_a_recorded_jar_list_keeps_the_ivy_jars_of_spark_jars_only(tmp_path):
    settings, (delta, storage) = ivy_with_jars(tmp_path, "io.delta_a-1.jar", "io.delta_b-1.jar")
    # spark.jars as Spark reports it: the user's own jar first, file: URIs, a repeat.
    spark_jars = f"/opt/mine.jar,file://{delta},file:{storage},{delta}"
    assert remember_jar_list(["io.delta:a:1"], settings, spark_jars) == [delta, storage]
    assert cached_jar_list(["io.delta:a:1"], settings) == [delta, storage]
    [recorded] = (tmp_path / "ivy" / JAR_LISTS).iterdir()
    assert json.loads(recorded.read_text())["coordinates"] == ["io.delta:a:1"]


def test_a_jar_list_is_per_package_list_order_and_exclusions(tmp_path):
    settings, jars = ivy_with_jars(tmp_path, "g_a-1.jar", "g_b-1.jar")
    remember_jar_list(["g:a:1", "g:b:1"], settings, ",".join(jars))
    assert cached_jar_list(["g:a:1", "g:b:1"], settings) == jars
    assert cached_jar_list(["g:b:1", "g:a:1"], settings) is None
    assert cached_jar_list(["g:a:1"], settings) is None
    assert cached_jar_list([], settings) is None
    excluding = {**settings, "spark.jars.excludes": "g:c"}
    assert cached_jar_list(["g:a:1", "g:b:1"], excluding) is None


def test_a_jar_list_naming_a_jar_that_went_away_is_not_used(tmp_path):
    settings, jars = ivy_with_jars(tmp_path, "g_a-1.jar", "g_b-1.jar")
    remember_jar_list(["g:a:1"], settings, ",".join(jars))
    os.remove(jars[1])
    assert cached_jar_list(["g:a:1"], settings) is None


@pytest.mark.parametrize("content", ["", "{", "[]", '{"coordinates": ["g:a:1"], "jars": []}'])
def test_an_unreadable_or_empty_jar_list_is_not_used(tmp_path, content):
    settings, jars = ivy_with_jars(tmp_path, "g_a-1.jar")
    remember_jar_list(["g:a:1"], settings, jars[0])
    [recorded] = (tmp_path / "ivy" / JAR_LISTS).iterdir()
    recorded.write_text(content)
    assert cached_jar_list(["g:a:1"], settings) is None


def test_nothing_is_recorded_when_no_jar_came_from_ivy_or_the_folder_cannot_be_written(tmp_path):
    settings, jars = ivy_with_jars(tmp_path, "g_a-1.jar")
    assert remember_jar_list(["g:a:1"], settings, "/opt/mine.jar") == []
    (tmp_path / "ivy" / JAR_LISTS).write_text("a file where the folder goes")
    assert remember_jar_list(["g:a:1"], settings, jars[0]) == []
    assert cached_jar_list(["g:a:1"], settings) is None


def test_a_forgotten_jar_list_is_resolved_again(tmp_path):
    settings, jars = ivy_with_jars(tmp_path, "g_a-1.jar")
    remember_jar_list(["g:a:1"], settings, jars[0])
    forget_jar_list(["g:a:1"], settings)
    forget_jar_list(["g:a:1"], settings)  # twice: nothing to forget is fine
    assert cached_jar_list(["g:a:1"], settings) is None


# --- the shared session loaded them -------------------------------------------------------------


def test_shared_session_has_every_optional_jar_on_its_classpath(spark):
    # Resolved by this start (spark.jars) or named by an earlier start's jar list (a local
    # master's JVM class path).
    jars = spark.sparkContext.getConf().get("spark.jars", "").split(",")
    jvm = spark.sparkContext._jvm.java.lang.System.getProperty("java.class.path")
    names = {Path(jar).name for jar in [*jars, *jvm.split(os.pathsep)]}
    for coordinate in OPTIONAL_PACKAGES:
        assert Path(retrieved_jar(coordinate, "/")).name in names
    # Dependencies come along: the Kafka client and the token provider.
    assert "org.apache.kafka_kafka-clients-3.9.1.jar" in names
    assert "org.apache.spark_spark-token-provider-kafka-0-10_2.13-4.1.1.jar" in names


def test_kafka_source_is_available(spark):
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9")  # never contacted: not started
        .option("subscribe", "t")
        .load()
    )
    assert stream.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


def test_avro_functions_and_the_dsv2_avro_reader_work(spark, tmp_path):
    schema = '{"type":"record","name":"r","fields":[{"name":"id","type":"long"}]}'
    encoded = spark.range(3).select(to_avro(F.struct("id")).alias("b"))
    decoded = encoded.select(from_avro("b", schema).alias("r")).select("r.id")
    assert sorted(r.id for r in decoded.collect()) == [0, 1, 2]
    # spark-avro 4.1.1's DSv2 reader is what breaks on Spark 4.1.4 (NoSuchMethodError).
    spark.range(3).write.format("avro").save(str(tmp_path / "a"))
    spark.conf.set("spark.sql.sources.useV1SourceList", "")
    try:
        assert spark.read.format("avro").load(str(tmp_path / "a")).count() == 3
    finally:
        spark.conf.unset("spark.sql.sources.useV1SourceList")


# --- a session already running ----------------------------------------------------------------

REUSE_SCRIPT = """
import json
from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.errors import SparkStartupError

start = dict(master="local[1]", delta=False, ui_enabled=False)
first = build_spark_session(**start, packages=["avro"])
again = build_spark_session(**start, packages=["avro"])
plain = build_spark_session(**start)
try:
    build_spark_session(**start, packages=["avro", "kafka"])
    refusal = None
except SparkStartupError as exc:
    refusal = str(exc)
try:
    build_spark_session(**{**start, "delta": True}, packages=["avro"])
    delta_refusal = None
except SparkStartupError as exc:
    delta_refusal = str(exc)
print(json.dumps({
    "reused": again is first and plain is first, "refusal": refusal, "delta": delta_refusal
}))
"""


def test_a_running_session_without_the_packages_asked_for_is_refused_naming_them():
    """Before: the running session came back without them, and the first Kafka read failed
    far away (a worker's tests did, when an in-process resource had started Spark first)."""
    done = subprocess.run(
        [sys.executable, "-c", REUSE_SCRIPT],
        capture_output=True,
        text=True,
        env=spark_env(),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["reused"], result
    refusal = result["refusal"]
    assert refusal is not None, "a session without Kafka was returned for packages=['kafka']"
    for coordinate in parse_packages("kafka"):
        assert coordinate in refusal
    assert AVRO not in refusal, refusal  # it is loaded
    assert "first session this process starts" in refusal, refusal
    # delta=True needs Delta's jar in the running JVM too (delta="auto" falls back instead).
    assert result["delta"] is not None, "a session without Delta was returned for delta=True"
    assert delta_package() in result["delta"], result["delta"]
