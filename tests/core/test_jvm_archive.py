"""Local JVM starts map a class archive recorded by an earlier start of the same class path.

The end-to-end test starts three real driver JVMs in subprocesses (the test session's
own JVM is already up) and reads the JVM's class-loading log to see where classes came
from: the JDK names "shared objects file (top)" for classes mapped from a dynamic archive.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dagster_sideinputs.core.spark import jvm_archive
from dagster_sideinputs.core.spark.jvm_archive import DIR_VARIABLE, ENABLED_VARIABLE, plan_launch

REPO = Path(__file__).resolve().parents[2]

START = """
import sys
from dagster_sideinputs.core.spark.session import build_spark_session
spark = build_spark_session(
    master="local[1]", ui_enabled=False, delta=False, log_level="ERROR",
    configs={"spark.driver.extraJavaOptions": "-Xlog:class+load=info:file=%s"},
)
assert spark.range(100).selectExpr("sum(id)").first()[0] == 4950
"""


def start_jvm(folder: Path, class_log: Path) -> None:
    class_log.unlink(missing_ok=True)
    env = {**os.environ, DIR_VARIABLE: str(folder), "PYTHONPATH": str(REPO), ENABLED_VARIABLE: "on"}
    subprocess.run(
        [sys.executable, "-c", START % class_log], env=env, check=True, timeout=300, cwd=REPO
    )


def from_archive(class_log: Path) -> int:
    return sum("shared objects file (top)" in line for line in class_log.open())


@pytest.mark.slow
@pytest.mark.extended  # tier 3: three JVM starts in subprocesses
def test_a_class_path_started_twice_records_its_classes_and_the_next_start_maps_them(tmp_path):
    folder, class_log = tmp_path / "jvm", tmp_path / "classes.log"
    start_jvm(folder, class_log)  # seen once: counted, nothing recorded
    assert list(folder.glob("*.jsa")) == []
    assert from_archive(class_log) == 0

    start_jvm(folder, class_log)  # seen again: records at exit
    assert len(list(folder.glob("*.jsa"))) == 1
    assert list(folder.glob("*.partial")) == []
    assert from_archive(class_log) == 0

    start_jvm(folder, class_log)
    assert from_archive(class_log) > 1000  # Spark's classes, mapped rather than loaded


@pytest.fixture
def archives(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(DIR_VARIABLE, str(tmp_path))
    monkeypatch.setenv(ENABLED_VARIABLE, "on")
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    return tmp_path


def recording(settings: dict[str, str], jars: list[str]) -> Path | None:
    return plan_launch(settings, jars).recording


def test_launches_of_one_class_path_record_three_times_at_most(archives):
    planned = [recording({}, ["/a.jar"]) for _ in range(6)]
    assert planned[0] is None  # the first only counts
    assert all(planned[1:4])
    assert planned[4:] == [None, None]
    assert recording({}, ["/b.jar"]) is None  # another class path counts on its own


def test_an_archive_is_mapped_and_the_users_options_are_kept(archives):
    plan = plan_launch({"spark.driver.extraJavaOptions": "-Dmine=1"}, [])
    assert plan.options == "-Dmine=1"
    plan = plan_launch({"spark.driver.extraJavaOptions": "-Dmine=1"}, [])
    assert plan.recording is not None
    assert plan.archive is not None
    assert plan.options.startswith("-Dmine=1 -XX:ArchiveClassesAtExit=")
    plan.archive.write_bytes(b"archive")
    mapped = plan_launch({"spark.driver.extraJavaOptions": "-Dmine=1"}, [])
    assert mapped.recording is None
    assert f"-XX:SharedArchiveFile={plan.archive}" in mapped.options


@pytest.mark.parametrize(
    "change",
    [
        {"env": {"SPARK_DIST_CLASSPATH": "/extra.jar"}},
        {"settings": {"spark.driver.extraClassPath": "/extra.jar"}},
        {"settings": {"spark.driver.memory": "3g"}},
        {"jars": ["/other.jar"]},
    ],
)
def test_a_jvm_shaped_otherwise_does_not_map_the_archive(archives, monkeypatch, change):
    monkeypatch.delenv("SPARK_DIST_CLASSPATH", raising=False)
    plan_launch({}, ["/a.jar"])
    plan = plan_launch({}, ["/a.jar"])
    assert plan.archive is not None
    plan.archive.write_bytes(b"archive")
    assert "SharedArchiveFile" in plan_launch({}, ["/a.jar"]).options
    for name, value in change.get("env", {}).items():
        monkeypatch.setenv(name, value)
    other = plan_launch(change.get("settings", {}), change.get("jars", ["/a.jar"]))
    assert "SharedArchiveFile" not in other.options


def test_the_launch_settings_are_a_copy_with_the_plans_options(archives):
    settings = {"spark.driver.extraJavaOptions": "-Dmine=1", "spark.app.name": "x"}
    plan_launch(settings, [])
    plan = plan_launch(settings, [])
    merged = jvm_archive.with_options(settings, plan)
    assert merged["spark.driver.extraJavaOptions"] == plan.options
    assert plan.options != "-Dmine=1"
    assert settings["spark.driver.extraJavaOptions"] == "-Dmine=1"  # a retry starts from these
    assert jvm_archive.with_options(settings, None) == settings


@pytest.mark.parametrize(
    ("settings", "submit_options"),
    [
        ({"spark.driver.extraJavaOptions": "-XX:SharedArchiveFile=/mine.jsa"}, ""),
        ({}, "-Xshare:off"),
    ],
)
def test_options_that_already_name_an_archive_are_left_alone(
    archives, monkeypatch, settings, submit_options
):
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", submit_options)
    for _ in range(3):
        plan = plan_launch(settings, [])
        assert plan.recording is None
        assert plan.options == settings.get("spark.driver.extraJavaOptions", "")
    assert list(archives.iterdir()) == []


@pytest.mark.parametrize("value", [None, "", "off", "0"])
def test_off_unless_asked_it_neither_maps_nor_records(archives, monkeypatch, value):
    """Opt-in: a user's process that did not ask starts its JVM as Spark does, and
    nothing is written to their cache."""
    if value is None:
        monkeypatch.delenv(ENABLED_VARIABLE)
    else:
        monkeypatch.setenv(ENABLED_VARIABLE, value)
    assert {plan_launch({}, []).options for _ in range(3)} == {""}
    assert list(archives.iterdir()) == []


def test_a_partial_archive_of_a_dead_process_goes_and_a_living_ones_blocks_recording(archives):
    plan_launch({}, [])
    first = plan_launch({}, [])
    assert first.recording is not None
    key = first.recording.name.split(".")[0]
    first.recording.write_bytes(b"half")  # this process is alive: another recording waits
    assert plan_launch({}, []).recording is None
    dead = subprocess.Popen(["true"])
    dead.wait()
    first.recording.unlink()
    stale = archives / f"{key}.{dead.pid}.partial"
    stale.write_bytes(b"half")
    again = plan_launch({}, [])
    assert not stale.exists()
    assert again.recording is not None


def test_an_archive_is_kept_only_from_a_jvm_that_exited_cleanly(archives):
    plan_launch({}, [])
    plan = plan_launch({}, [])
    assert plan.recording is not None
    assert plan.archive is not None

    plan.recording.write_bytes(b"half")
    killed = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE)
    killed.send_signal(signal.SIGKILL)
    jvm_archive._finish(plan.recording, plan.archive, killed)
    assert not plan.archive.exists()
    assert not plan.recording.exists()

    plan.recording.write_bytes(b"whole")
    clean = subprocess.Popen(["cat"], stdin=subprocess.PIPE)  # ends at end of input
    jvm_archive._finish(plan.recording, plan.archive, clean)
    assert plan.archive.read_bytes() == b"whole"
    assert not plan.recording.exists()


def test_a_jdk_that_writes_no_archive_stops_being_asked(archives):
    plan_launch({}, [])
    plan = plan_launch({}, [])
    assert plan.recording is not None
    assert plan.archive is not None
    jvm_archive._finish(plan.recording, plan.archive, subprocess.Popen(["true"]))
    assert not plan.archive.exists()
    assert plan_launch({}, []).recording is None


def test_an_archive_folder_that_cannot_be_made_leaves_the_options_alone(archives, monkeypatch):
    blocker = archives / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(DIR_VARIABLE, str(blocker / "jvm"))
    for _ in range(3):
        assert plan_launch({"spark.driver.extraJavaOptions": "-Dmine=1"}, []) == (
            jvm_archive.ArchivePlan("-Dmine=1")
        )


def test_only_the_most_recently_used_archives_are_kept(archives):
    for index in range(jvm_archive.MAX_ARCHIVES + 2):
        old = archives / f"old{index}.jsa"
        old.write_bytes(b"archive")
        os.utime(old, (1_000_000 + index, 1_000_000 + index))
    os.utime(archives / "old0.jsa")  # used just now
    plan_launch({}, [])
    plan = plan_launch({}, [])
    assert plan.recording is not None
    assert plan.archive is not None
    plan.recording.write_bytes(b"whole")
    jvm_archive._finish(plan.recording, plan.archive, subprocess.Popen(["true"]))
    kept = {path.name for path in archives.glob("*.jsa")}
    assert len(kept) == jvm_archive.MAX_ARCHIVES
    assert {"old0.jsa", plan.archive.name} <= kept
    assert "old1.jsa" not in kept
    assert "old2.jsa" not in kept
