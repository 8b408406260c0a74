"""Faster local JVM starts: a class-data-sharing archive per class path.

A local session's driver JVM loads and verifies some ten thousand classes of Spark and
Delta before its first batch is written, and every Dagster run process starts its own
JVM. The JDK can record the classes a JVM loaded in an archive when it exits (dynamic
class data sharing, ``-XX:ArchiveClassesAtExit``); a later JVM with the same Java and
class path maps that archive instead of loading them (``-XX:SharedArchiveFile``).
Measured on 2 cores, alternating with it off (docs/JVM_PACKAGES.md): a process that
creates a 400-row Delta table, appends and reads it 15.4-16.3 s -> 11.4 s (start
4.9-5.8 s -> 3.2 s, first table 5.3-5.4 s -> 3.3 s); the crash harness's worker (two
enrichment jobs and an FX materialization through Dagster) 31.5-33.1 s -> 26.6-28.4 s.

Opt-in: ``DSI_JVM_ARCHIVE=on`` turns it on (the project's tests, ``make demo`` and
``make dev`` do). A library must not, uninvited, hold a user's process at exit while the
JDK writes an archive, nor keep hundreds of megabytes in their cache; so by default a
session starts as Spark starts it. Once on:

- The second local JVM of a class path (the first only counts: a class path used once
  never pays for this) records its classes when its process exits: the
  process closes the JVM's input at exit, waits while the JDK writes the archive (once,
  10-20 s) and only then keeps it (``<key>.jsa``), so a JVM killed meanwhile leaves no
  archive behind, only a ``.partial`` file that the next start removes. A class path
  gets three such attempts (:data:`MAX_ATTEMPTS`).
- Every later start of the same class path maps it. The key covers the Java executable,
  every jar of the class path (name, size, time: pyspark's, the packages', and what
  ``SPARK_DIST_CLASSPATH`` or ``spark.driver.extraClassPath`` add) and the JVM's
  options, so an upgrade
  of any of them records anew; a JVM refusing an archive (``-Xshare:auto``) starts
  normally.
- ``DSI_JVM_ARCHIVE_DIR`` moves the archives
  (default ``$XDG_CACHE_HOME/dagster-sideinputs/jvm``, i.e. ``~/.cache/...``); the
  :data:`MAX_ARCHIVES` most recently used are kept (100-200 MB each). Options
  the user gives the driver JVM that already name an archive (``SharedArchiveFile``,
  ``Xshare``) are left alone.
"""

import atexit
import contextlib
import hashlib
import logging
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyspark

from dagster_sideinputs.core.spark.java_runtime import find_java

log = logging.getLogger("dagster_sideinputs")

ENABLED_VARIABLE = "DSI_JVM_ARCHIVE"
DIR_VARIABLE = "DSI_JVM_ARCHIVE_DIR"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
# The JDK explains every class it cannot archive (signed jars, old class files): one
# line each, hundreds per dump. Quiet; a refused archive just starts without it.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_USER_CDS_FLAGS = ("SharedArchiveFile", "Xshare", "ArchiveClassesAtExit")
WRITE_TIMEOUT_S = 180.0
MAX_ATTEMPTS = 3
"""Recordings of one key before giving up: a process killed, or leaving through
``os._exit``, never keeps its archive (a JDK that cannot write one gives up at once)."""
MAX_ARCHIVES = 8
"""Archives kept (100-200 MB each): the least recently used go when a new one is kept."""


@dataclass(frozen=True)
class ArchivePlan:
    """The driver JVM options for one launch, and the archive it would record."""

    options: str
    recording: Path | None = None
    archive: Path | None = None


def archive_dir() -> Path:
    configured = os.environ.get(DIR_VARIABLE)
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "dagster-sideinputs" / "jvm"


def enabled() -> bool:
    """On only when the environment asks for it (``DSI_JVM_ARCHIVE=on``, ``1``, ``true``)."""
    return os.environ.get(ENABLED_VARIABLE, "").strip().lower() in {"on", "1", "true", "yes"}


def _spark_jars() -> list[Path]:
    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    folder = Path(home) / "jars"
    return sorted(folder.glob("*.jar")) if folder.is_dir() else []


def _stamp(paths: Iterable[Path | str]) -> list[str]:
    found = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            found.append(f"{path}:missing")
            continue
        found.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    return found


def archive_key(java: str, jars: Iterable[str], jvm_options: Iterable[str]) -> str:
    """What an archive is valid for: the Java, every jar of the class path, the options."""
    java_real = os.path.realpath(java)
    modules = Path(java_real).parent.parent / "lib" / "modules"
    parts = [
        java_real,
        *_stamp([java_real, modules]),
        *_stamp(_spark_jars()),
        *_stamp(jars),
        *jvm_options,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(folder: Path, key: str) -> bool:
    """Remove partial archives of dead processes; whether a living one records ``key``."""
    recording = False
    for partial in folder.glob("*.partial"):
        name_key, _, rest = partial.name.partition(".")
        pid = rest.split(".", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            recording = recording or name_key == key
        else:
            with contextlib.suppress(OSError):
                partial.unlink()
    return recording


def _attempt(counter: Path) -> bool:
    """Count one more launch of a key without its archive; whether this one records.

    The first launch only counts (a class path seen once, e.g. a temporary one, never
    pays for recording); the next :data:`MAX_ATTEMPTS` record.
    """
    launches = counter.read_text().count("x") if counter.exists() else 0
    if launches > MAX_ATTEMPTS:
        return False
    with open(counter, "a") as handle:
        handle.write("x")
    return launches >= 1


def plan_launch(settings: Mapping[str, str], jars: Iterable[str]) -> ArchivePlan:
    """The driver JVM options of a local launch: map the archive of this class path, or
    record one at exit when there is none (and no other process is recording it)."""
    own = settings.get(DRIVER_OPTIONS, "")
    java = find_java()
    submit_options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if not enabled() or java is None:
        return ArchivePlan(own)
    if any(flag in own or flag in submit_options for flag in _USER_CDS_FLAGS):
        return ArchivePlan(own)
    folder = archive_dir()
    # What else shapes the JVM: its heap (compressed pointers) and class path additions.
    shaping = [
        own,
        submit_options,
        settings.get("spark.driver.memory", ""),
        settings.get("spark.driver.extraClassPath", ""),
        os.environ.get("SPARK_DIST_CLASSPATH", ""),
    ]
    key = archive_key(java, jars, shaping)
    archive = folder / f"{key}.jsa"
    if archive.is_file():
        with contextlib.suppress(OSError):
            os.utime(archive)  # last used: pruning keeps the archives in use
        return ArchivePlan(f"{own} -XX:SharedArchiveFile={archive} {_QUIET}".strip())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if _sweep(folder, key) or not _attempt(folder / f"{key}.launches"):
            return ArchivePlan(own)
    except OSError:
        return ArchivePlan(own)
    partial = folder / f"{key}.{os.getpid()}.partial"
    options = f"{own} -XX:ArchiveClassesAtExit={partial} {_QUIET}".strip()
    return ArchivePlan(options, recording=partial, archive=archive)


def with_options(settings: Mapping[str, str], plan: ArchivePlan | None) -> dict[str, str]:
    """``settings`` with the driver JVM options of ``plan`` (a copy: a retried launch
    without an archive starts from the settings as they were)."""
    merged = dict(settings)
    if plan is not None and plan.options:
        merged[DRIVER_OPTIONS] = plan.options
    return merged


def keep_at_exit(plan: ArchivePlan, process: "subprocess.Popen[bytes] | None") -> None:
    """Once this process exits, let the JVM write its archive and keep it if complete."""
    if plan.recording is None or plan.archive is None or process is None:
        return
    atexit.register(_finish, plan.recording, plan.archive, process)


def _prune(folder: Path) -> None:
    kept = sorted(folder.glob("*.jsa"), key=lambda path: path.stat().st_mtime, reverse=True)
    for stale in kept[MAX_ARCHIVES:]:
        with contextlib.suppress(OSError):
            stale.unlink()  # a JVM mapping it keeps its pages


def _finish(partial: Path, archive: Path, process: "subprocess.Popen[bytes]") -> None:
    try:
        _keep(partial, archive, process)
    except Exception as exc:  # at exit: a failure here must never fail the program
        log.debug("No JVM class archive kept: %s", exc)


def _keep(partial: Path, archive: Path, process: "subprocess.Popen[bytes]") -> None:
    if process.poll() is None:
        log.info("Recording the JVM's classes for faster starts (once per class path) ...")
        with contextlib.suppress(OSError, ValueError):
            if process.stdin is not None:
                process.stdin.close()  # PySpark's gateway exits on end of input
        try:
            process.wait(timeout=WRITE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    written = partial.is_file() and partial.stat().st_size > 0
    if process.returncode == 0 and written:
        os.replace(partial, archive)
        _prune(archive.parent)
        return
    with contextlib.suppress(OSError):
        partial.unlink()
    if process.returncode == 0:  # exited cleanly, yet no archive: this JDK cannot
        with contextlib.suppress(OSError):
            archive.with_suffix(".launches").write_text("x" * (MAX_ATTEMPTS + 1))
