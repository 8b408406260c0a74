"""The SparkSession the Delta engines run on: the active one, and session settings
changed for the duration of one operation."""

import contextlib
import threading
from collections.abc import Iterator

from pyspark.sql import SparkSession

# Session settings are per session, and the operator's commits run one after the other;
# the lock keeps two threads of one process from overlapping their temporary settings.
_CONF_LOCK = threading.RLock()


def active_session() -> SparkSession | None:
    """The session of this thread, else the process's default one (classic or Connect)."""
    with contextlib.suppress(Exception):
        session = SparkSession.getActiveSession()
        if session is not None:
            return session
    with contextlib.suppress(Exception):
        return SparkSession.active()
    return None


@contextlib.contextmanager
def session_setting(spark: SparkSession, key: str, value: str | None) -> Iterator[None]:
    """Set a session setting for the duration of one operation (None: leave it alone)."""
    if value is None:
        yield
        return
    with _CONF_LOCK:
        previous = spark.conf.get(key, None)
        spark.conf.set(key, value)
        try:
            yield
        finally:
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)
