"""One process of a race on the test S3 server (see test_object_store.py).

    python -m tests.delta.object_store_worker <command> <json arguments>

Storage options come in the environment (``DSI_STORAGE_OPTIONS``, JSON). A racing
command imports and connects first, prints ``READY`` and waits for a line on stdin, so
that the test releases all processes at once. The answer is one JSON line on stdout.
"""

import json
import os
import sys
import time
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from dagster_sideinputs.core.state.lock import operator_lock
from dagster_sideinputs.delta.store.files import TableFiles
from dagster_sideinputs.delta.store.lease import ObjectStoreLease
from dagster_sideinputs.errors import OperatorBusyError


def _options() -> dict[str, str]:
    return json.loads(os.environ["DSI_STORAGE_OPTIONS"])


def _ready() -> None:
    print("READY", flush=True)
    sys.stdin.readline()


def create(root: str, keys: int, tag: str) -> Any:
    """Create race/<i>.json exclusively for every i; which ones did this process win."""
    files = TableFiles(root, _options())
    files.object_store()  # connect before the start
    _ready()
    return [
        i
        for i in range(keys)
        if files.write_bytes_atomic(f"race/{i}.json", tag.encode(), exclusive=True)
    ]


def lock(state_uri: str, rounds: int, hold_s: float, lease_s: float) -> Any:
    """Take the operator lock ``rounds`` times; the wall-clock intervals it was held."""
    _ready()
    held = []
    for _ in range(rounds):
        with operator_lock(
            state_uri,
            operator_id="race",
            wait_s=120,
            storage_options=_options(),
            lease_s=lease_s,
        ):
            began = time.time()
            time.sleep(hold_s)
            held.append([began, time.time()])
    return held


def try_lock(state_uri: str) -> Any:
    """Take the operator lock once without waiting: the error message if refused."""
    try:
        with operator_lock(state_uri, operator_id="race", storage_options=_options()):
            return "acquired"
    except OperatorBusyError as exc:
        return str(exc)


def hold(root: str, lease_s: float) -> None:
    """Take a lease, renew it, say so, and stay until killed."""
    lease = ObjectStoreLease(root, "lock", _options(), lease_s=lease_s)
    if not lease.acquire(wait_s=30):
        raise SystemExit("could not take the lease")
    print(json.dumps({"generation": lease.generation}), flush=True)
    while True:
        time.sleep(1)


def commit(uri: str, tag: int, retries: int) -> Any:
    """Append one row to the table as read before the start; the committed version."""
    table = DeltaTable(uri, storage_options=_options())
    data = pa.table({"writer": pa.array([tag], pa.int64())})
    _ready()
    try:
        write_deltalake(
            table,
            data,
            mode="append",
            commit_properties=CommitProperties(max_commit_retries=retries),
        )
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc)[:300]}
    return {"version": table.version()}


def main() -> None:
    command, arguments = sys.argv[1], json.loads(sys.argv[2])
    result = globals()[command](**arguments)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
