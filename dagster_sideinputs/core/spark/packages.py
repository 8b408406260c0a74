"""The optional JVM packages a SparkSession may load, and fetching them into the Ivy cache.

Spark resolves ``spark.jars.packages`` with Apache Ivy when its JVM starts: every
coordinate and its dependencies are looked up in ``~/.m2/repository``, then the Ivy
cache, then Maven Central, and the jars are copied to ``<ivy dir>/jars``. A first start
therefore downloads (about 750 MB for everything below: the AWS SDK bundle alone is
640 MB), and a start without Maven Central fails. :func:`fetch_packages` (run by
``make install``: ``python -m dagster_sideinputs.core.spark.jars fetch``) resolves them
once, so later starts read the cache only (the command lives in
``dagster_sideinputs.core.spark.jars``); :func:`resolve_session_packages` does it for a
session about to start when something is missing. See docs/JVM_PACKAGES.md.

Even from the cache, a start that names packages costs seconds: Ivy resolves them again,
and PySpark copies every resolved jar into the session's temporary folder (86 MB for
Delta, 712 MB with S3A's SDK bundle). So the first start of a package list records the
jars it resolved (:func:`remember_jar_list`), and later starts of the same list load
those jars (:func:`cached_jar_list`; ``core.spark.session`` puts them on a local JVM's class
path, or in a cluster's ``spark.jars``): no resolution, no copy.

The versions are the newest that Maven Central serves *with their dependencies* for
pyspark 4.1.1 (pinned in pyproject.toml). Delta's own coordinate is not here: it follows
the ``delta-spark`` pip package (``dagster_sideinputs.delta.spark.setup``).
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import pyspark

from dagster_sideinputs.delta.spark.setup import delta_package
from dagster_sideinputs.errors import SparkStartupError

log = logging.getLogger("dagster_sideinputs")

# Spark's Kafka source and sink; brings spark-token-provider-kafka-0-10 4.1.1 and
# kafka-clients 3.9.1. 4.1.2 / 4.1.3 exist but need a token provider that is not served.
KAFKA = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"
# from_avro / to_avro and the DSv2 avro reader (spark-avro 4.1.1 breaks on Spark 4.1.4:
# NoSuchMethodError on AvroDeserializer, one reason pyspark is pinned to 4.1.1).
AVRO = "org.apache.spark:spark-avro_2.13:4.1.1"
# s3a:// support; hadoop-aws must equal pyspark's bundled hadoop-client (3.4.2), and the
# AWS SDK v2 bundle is the version hadoop 3.4.2 was built with (hadoop-project's
# aws-java-sdk-v2.version).
HADOOP_AWS = "org.apache.hadoop:hadoop-aws:3.4.2"
AWS_SDK_BUNDLE = "software.amazon.awssdk:bundle:2.29.52"

KAFKA_PACKAGES: tuple[str, ...] = (KAFKA,)
AVRO_PACKAGES: tuple[str, ...] = (AVRO,)
S3A_PACKAGES: tuple[str, ...] = (HADOOP_AWS, AWS_SDK_BUNDLE)
OPTIONAL_PACKAGES: tuple[str, ...] = KAFKA_PACKAGES + AVRO_PACKAGES + S3A_PACKAGES
BUNDLES: dict[str, tuple[str, ...]] = {
    "kafka": KAFKA_PACKAGES,
    "avro": AVRO_PACKAGES,
    "s3": S3A_PACKAGES,
}
"""Short names ``packages=`` takes for the optional packages (``packages=["kafka", "s3"]``):
the versions that match this Spark are chosen here, not by the user."""

_COORDINATE = re.compile(r"^([^:/\s]+)[:/]([^:\s]+):([^:\s]+)$")


def parse_packages(value: str | Iterable[str] | None) -> list[str]:
    """Coordinates from a ``spark.jars.packages`` value or a list, in order, without repeats;
    a short name of :data:`BUNDLES` (``"kafka"``, ``"avro"``, ``"s3"``) stands for its
    coordinates.

    Raises:
        ValueError: neither a short name nor a coordinate ``group:artifact:version``.

    Examples:
        >>> parse_packages(["s3", "org.example:lib:1.0"])[-1]
        'org.example:lib:1.0'
        >>> parse_packages("kafka") == list(KAFKA_PACKAGES)
        True
    """
    items = value.split(",") if isinstance(value, str) else list(value or ())
    found: list[str] = []
    for item in (text.strip() for text in items):
        if not item:
            continue
        expanded = BUNDLES.get(item.lower())
        if expanded is None and _COORDINATE.match(item) is None:
            raise ValueError(
                f"{item!r} is neither a Maven coordinate group:artifact:version nor one of "
                f"{sorted(BUNDLES)}"
            )
        for coordinate in expanded or (item,):
            if coordinate not in found:
                found.append(coordinate)
    return found


def default_ivy_dir() -> str:
    """Spark 4's default Ivy directory (``spark.jars.ivy`` unset): ``~/.ivy2.5.2``."""
    return os.path.join(os.path.expanduser("~"), ".ivy2.5.2")


def ivy_dir_of(settings: Mapping[str, str]) -> str:
    """The Ivy directory a session with these Spark settings resolves packages into."""
    chosen = settings.get("spark.jars.ivy", "").strip()
    return os.path.expanduser(chosen) if chosen else default_ivy_dir()


def retrieved_jar(coordinate: str, ivy_dir: str) -> str:
    """Where Spark copies a resolved coordinate's jar: ``<ivy>/jars/<group>_<artifact>-<v>.jar``."""
    match = _COORDINATE.match(coordinate)
    if match is None:
        raise ValueError(f"{coordinate!r} is not a Maven coordinate group:artifact:version")
    group, artifact, version = match.groups()
    return os.path.join(ivy_dir, "jars", f"{group}_{artifact}-{version}.jar")


def missing_packages(coordinates: Iterable[str], ivy_dir: str) -> list[str]:
    """The coordinates whose jar Spark has not retrieved into ``ivy_dir`` yet.

    Spark copies the jars only after a resolution without errors, so a coordinate's jar
    being there means its dependencies were retrieved with it: a start then needs no
    network (Ivy keeps resolved fixed versions in its cache for good).
    """
    return [c for c in coordinates if not os.path.isfile(retrieved_jar(c, ivy_dir))]


@dataclasses.dataclass(frozen=True)
class FetchResult:
    """What one resolution did.

    Attributes:
        ok: every coordinate resolved, with its dependencies.
        seconds: wall time of the resolution (a JVM start included).
        jars: jars Ivy reported as copied or already there (0 when unknown).
        reason: on failure, one line saying why (unresolved coordinates, first network error).
        output: everything spark-submit printed, for a closer look.
    """

    ok: bool
    seconds: float
    jars: int
    reason: str
    output: str


def packages_not_loaded(coordinates: Iterable[str], jar_paths: Iterable[str]) -> list[str]:
    """The coordinates whose jar is not among ``jar_paths`` (a running JVM's class path and
    ``spark.jars``): named as Spark retrieves it (``<group>_<artifact>-<v>.jar``) or as
    Maven publishes it (``<artifact>-<v>.jar``).

    Examples:
        >>> packages_not_loaded(["g:a:1", "g:b:2"], ["/ivy/jars/g_a-1.jar", "/m2/b-3.jar"])
        ['g:b:2']
    """
    names = {os.path.basename(path.strip()) for path in jar_paths}
    missing = []
    for coordinate in coordinates:
        retrieved = os.path.basename(retrieved_jar(coordinate, "/"))
        group = coordinate.split(":", 1)[0]
        published = retrieved[len(group) + 1 :]
        if retrieved not in names and published not in names:
            missing.append(coordinate)
    return missing


def _spark_submit() -> str:
    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    return os.path.join(home, "bin", "spark-submit")


def _failure_reason(output: str, returncode: int) -> str:
    """One line out of Ivy's report: what is unresolved and the first transport error."""
    unresolved = sorted(set(re.findall(r"::\s+(\S+#\S+;\S+): not found", output)))
    network = re.search(
        r"(Server access error[^\n]*|Host \S+ not found[^\n]*|"
        r"java\.net\.\w+Exception[^\n]*|Connection refused[^\n]*)",
        output,
    )
    parts = []
    if unresolved:
        parts.append(
            "unresolved " + ", ".join(u.replace("#", ":").replace(";", ":") for u in unresolved)
        )
    if network:
        parts.append(network.group(1).strip()[:200])
    if not parts:
        last = [line for line in output.splitlines() if line.strip()][-1:] or [""]
        parts.append(f"spark-submit exited with {returncode}: {last[0].strip()[:200]}")
    return "; ".join(parts)


def fetch_packages(
    coordinates: Sequence[str],
    *,
    ivy_dir: str | None = None,
    repositories: str | None = None,
    timeout_s: float = 900.0,
) -> FetchResult:
    """Resolve coordinates (with their dependencies) into the Ivy cache, as a session start would.

    It runs pyspark's own ``spark-submit --packages`` on an empty Python script, so the
    resolution is Spark's (same resolvers, cache layout and exclusions of the jars Spark
    already ships); nothing is printed, the output is returned.

    Args:
        coordinates: ``group:artifact:version`` strings.
        ivy_dir: ``spark.jars.ivy``; default ``~/.ivy2.5.2``.
        repositories: ``spark.jars.repositories`` (comma-separated extra Maven repositories).
        timeout_s: give up after this long (a first download of everything takes about a
            minute on a fast link).

    Returns:
        A :class:`FetchResult`; it never raises for a failed resolution.
    """
    ivy = ivy_dir or default_ivy_dir()
    with tempfile.TemporaryDirectory(prefix="dsi-fetch-") as scratch:
        script = os.path.join(scratch, "noop.py")
        with open(script, "w") as out:
            out.write("# resolved by spark-submit before this runs\n")
        command = [
            _spark_submit(),
            "--master",
            "local[1]",
            "--conf",
            f"spark.jars.ivy={ivy}",
            "--conf",
            "spark.ui.enabled=false",
            "--packages",
            ",".join(coordinates),
        ]
        if repositories:
            command += ["--repositories", repositories]
        command.append(script)
        env = dict(os.environ)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        started = time.monotonic()
        try:
            proc = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=env,
                check=False,
                cwd=scratch,
            )
        except subprocess.TimeoutExpired as exc:
            # TimeoutExpired carries bytes even with text=True.
            raw = (exc.stdout or b"") + (exc.stderr or b"")
            output = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            return FetchResult(
                False, time.monotonic() - started, 0, f"no answer within {timeout_s:.0f} s", output
            )
        except OSError as exc:
            return FetchResult(False, 0.0, 0, f"could not run spark-submit: {exc}", "")
    seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    copied = re.search(r"(\d+) artifacts copied, (\d+) already retrieved", output)
    jars = int(copied.group(1)) + int(copied.group(2)) if copied else 0
    missing = missing_packages(coordinates, ivy)
    if proc.returncode != 0 or missing:
        return FetchResult(False, seconds, jars, _failure_reason(output, proc.returncode), output)
    return FetchResult(True, seconds, jars, "", output)


JAR_LISTS = "dagster-sideinputs-jar-lists"
"""The folder in the Ivy directory that keeps one resolved jar list per package list."""


def _jar_list_file(coordinates: Sequence[str], settings: Mapping[str, str]) -> str:
    # What changes a resolution's result: the coordinates, in order, and the exclusions.
    key = json.dumps([list(coordinates), settings.get("spark.jars.excludes", "")])
    name = hashlib.sha256(key.encode()).hexdigest()[:20] + ".json"
    return os.path.join(ivy_dir_of(settings), JAR_LISTS, name)


def cached_jar_list(coordinates: Sequence[str], settings: Mapping[str, str]) -> list[str] | None:
    """The jars an earlier start resolved for exactly these coordinates, if all still exist.

    None when there is no list yet, it cannot be read, or a jar went away (the start then
    resolves through ``spark.jars.packages`` again, and records a new list).
    """
    if not coordinates:
        return None
    try:
        with open(_jar_list_file(coordinates, settings)) as source:
            recorded = json.load(source)
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("coordinates") != list(coordinates):
        return None
    jars = recorded.get("jars")
    if not isinstance(jars, list) or not jars:
        return None
    if not all(isinstance(jar, str) and os.path.isfile(jar) for jar in jars):
        return None
    return jars


def remember_jar_list(
    coordinates: Sequence[str], settings: Mapping[str, str], spark_jars: str
) -> list[str]:
    """Record the jars a start resolved for ``coordinates``, from its ``spark.jars``.

    Only the jars in the Ivy directory's ``jars`` folder are kept (``spark.jars`` also
    holds the user's own). Written whole or not at all; a failure to write is only
    logged, since the list is a shortcut. Returns the jars recorded.
    """
    retrieved = os.path.abspath(os.path.join(ivy_dir_of(settings), "jars"))
    jars: list[str] = []
    for entry in (item.strip() for item in spark_jars.split(",")):
        path = urllib.parse.urlparse(entry).path if entry.startswith("file:") else entry
        if path and os.path.dirname(os.path.abspath(path)) == retrieved and path not in jars:
            jars.append(path)
    if not jars:
        return []
    target = _jar_list_file(coordinates, settings)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        scratch = f"{target}.{os.getpid()}.tmp"
        with open(scratch, "w") as out:
            json.dump({"coordinates": list(coordinates), "jars": jars}, out, indent=1)
        os.replace(scratch, target)
    except OSError as exc:
        log.debug("Could not record the jars of %s in %s: %s", coordinates, target, exc)
        return []
    return jars


def forget_jar_list(coordinates: Sequence[str], settings: Mapping[str, str]) -> None:
    """Drop the recorded jar list of these coordinates (a start from it failed)."""
    with contextlib.suppress(OSError):
        os.remove(_jar_list_file(coordinates, settings))


DeltaMode = Literal["auto"] | bool

_FETCH_FIX = (
    "make Maven Central (https://repo1.maven.org/maven2) reachable and run "
    "`python -m dagster_sideinputs.core.spark.jars fetch` once (`make install` does), or name a "
    "mirror in spark.jars.repositories / DEFAULT_ARTIFACT_REPOSITORY (docs/JVM_PACKAGES.md)"
)


def resolve_session_packages(
    delta: DeltaMode, packages: list[str], settings: Mapping[str, str], *, trust_cache: bool = True
) -> bool:
    """Make sure a session's Maven packages are in the Ivy cache; whether to configure Delta.

    Cached packages cost nothing here (a file check), so a start needs no network. Missing
    ones are resolved in a separate spark-submit first: its output is captured, and a
    failure becomes one clear message instead of a JVM that dies before PySpark's gateway
    answers. With ``delta="auto"`` a Delta jar that cannot be had turns Delta off (one
    warning); packages asked for by name, or ``delta=True``, fail the start instead.
    ``trust_cache=False`` resolves even when every jar is there (after a start failed).

    Raises:
        SparkStartupError: packages that cannot be fetched, or Delta's with ``delta=True``.
    """
    want_delta = delta is True or delta == "auto"
    if not want_delta and not packages:
        return False
    coordinates = list(packages)
    if want_delta:
        try:
            # Our wrapper of delta-spark's pip package; core never imports `delta` itself.
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
