"""Kill points: a library function wrapped, in this process only, so that its n-th call
SIGKILLs the process's whole group (the Python driver and its Spark JVM) before it runs.

Nothing after the kill runs, as when a machine dies. Used by the Kafka crash worker
(tests/core/kafka_worker.py) and the crash harness (bench/crash_harness.py).
"""

import functools
import importlib
import os
import signal
from collections.abc import Callable
from typing import Any


def arm_kill_point(spec: str, before_kill: Callable[[], None]) -> None:
    """Arm ``module:attribute:n`` (``attribute`` may be ``Class.method``).

    ``before_kill`` runs just before the SIGKILL (to record where the process died); the
    library itself is not changed, only this process's reference to the function.
    """
    module_name, attribute, nth = spec.split(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    calls = 0

    @functools.wraps(original)
    def killing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == int(nth):
            before_kill()
            os.killpg(os.getpgid(0), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(owner, name, killing)
