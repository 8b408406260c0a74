"""The Java runtime a local Spark session launches: finding it and checking its version.

PySpark itself would either hang waiting for the JVM gateway or print a long stack trace
when Java is missing or too old; :func:`check_java` says so first, with the install command.
"""

import os
import re
import shutil
import subprocess

from dagster_sideinputs.errors import SparkStartupError

MIN_JAVA_MAJOR = 17

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
