"""Spark Connect sessions: the checks before connecting (client installed, server
listening) and after (settings the server refuses, Delta on the server).

The Connect client would otherwise retry an unreachable server for minutes, and its
builder drops settings a server refuses with a mere warning.
"""

import importlib
import socket
import urllib.parse
from collections.abc import Mapping

import pyspark
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from dagster_sideinputs.delta.spark.setup import (
    DELTA_CATALOG,
    DELTA_SQL_EXTENSION,
    delta_package,
    is_delta_configured,
)
from dagster_sideinputs.errors import SparkStartupError

CONNECT_DEFAULT_PORT = 15002


def require_connect_client(remote: str) -> None:
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


def require_connect_server(remote: str, *, timeout_s: float) -> None:
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


def apply_remote_settings(
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


def check_remote_delta(spark: SparkSession, remote: str) -> None:
    """delta=True over Spark Connect: the server must run with Delta's extension and catalog."""
    if is_delta_configured(spark):
        return
    raise SparkStartupError(
        f"delta=True, but the Spark Connect server at {remote!r} runs without Delta Lake "
        "(spark.sql.extensions / spark.sql.catalog.spark_catalog are not Delta's).",
        fix=f"start the server with `--packages {delta_package()} --conf "
        f"spark.sql.extensions={DELTA_SQL_EXTENSION} --conf "
        f"spark.sql.catalog.spark_catalog={DELTA_CATALOG}`, or pass delta='auto'",
    )
