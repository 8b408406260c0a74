"""Object storage against a real S3-compatible server (moto, tests/servers/s3.py).

The server's conditional writes, delta-rs commits racing on one version, exclusive file
creation and the lease lock racing across processes, and which special characters
table paths and partition values survive in delta-rs.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError
from deltalake import DeltaTable, write_deltalake

from dagster_sideinputs.core.state.lock import operator_lock
from dagster_sideinputs.delta.store.files import TableFiles
from dagster_sideinputs.delta.store.lease import LeaseRecord, ObjectStoreLease
from dagster_sideinputs.delta.store.object_store import object_store_options
from tests.servers.s3 import DEFAULT_BUCKET, S3Server

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_worker(server: S3Server, command: str, **arguments: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.delta.object_store_worker", command, json.dumps(arguments)],
        cwd=REPO,
        env={**os.environ, "DSI_STORAGE_OPTIONS": json.dumps(server.storage_options)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def race(server: S3Server, command: str, arguments: list[dict[str, Any]]) -> list[Any]:
    """Start one worker per argument set, wait until each is connected, release them at once."""
    workers = [start_worker(server, command, **each) for each in arguments]
    for worker in workers:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line.strip() == "READY", (line, worker.stderr.read() if worker.stderr else "")
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    return answers(workers)


def answers(workers: list[subprocess.Popen], timeout: float = 180) -> list[Any]:
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=timeout)
        assert worker.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def status_of(error: ClientError) -> int:
    return error.response["ResponseMetadata"]["HTTPStatusCode"]


# --- the server --------------------------------------------------------------------------


def test_server_refuses_a_second_create_and_a_stale_compare_and_swap(s3_server):
    client, bucket = s3_server.client(), s3_server.bucket
    key = s3_server.fresh_prefix("cond").split("/", 3)[3] + "/object"
    first = client.put_object(Bucket=bucket, Key=key, Body=b"one", IfNoneMatch="*")
    with pytest.raises(ClientError) as again:
        client.put_object(Bucket=bucket, Key=key, Body=b"two", IfNoneMatch="*")
    assert status_of(again.value) == 412
    second = client.put_object(Bucket=bucket, Key=key, Body=b"three", IfMatch=first["ETag"])
    with pytest.raises(ClientError) as stale:
        client.put_object(Bucket=bucket, Key=key, Body=b"four", IfMatch=first["ETag"])
    assert status_of(stale.value) == 412
    with pytest.raises(ClientError) as stale_delete:
        client.delete_object(Bucket=bucket, Key=key, IfMatch=first["ETag"])
    assert status_of(stale_delete.value) == 412
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"three"
    assert second["ETag"] != first["ETag"]


def test_server_stops_and_its_process_is_gone():
    server = S3Server(bucket="short-lived").start()
    process = server._process
    assert server.running
    server.client().put_object(Bucket="short-lived", Key="k", Body=b"x")
    server.stop()
    assert process is not None
    assert process.poll() is not None
    assert not server.running


# --- delta-rs ----------------------------------------------------------------------------


def test_delta_rs_writes_and_reads_a_table_on_s3(s3_server):
    uri = s3_server.fresh_prefix("delta")
    options = s3_server.storage_options
    write_deltalake(uri, pa.table({"id": [1, 2], "p": ["a", "b"]}), storage_options=options)
    write_deltalake(uri, pa.table({"id": [3], "p": ["a"]}), mode="append", storage_options=options)
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]
    logged = [key for key in s3_server.keys(uri) if "/_delta_log/" in key]
    assert [key.rsplit("/", 1)[1] for key in logged] == [
        "00000000000000000000.json",
        "00000000000000000001.json",
    ]


def test_delta_rs_commits_racing_on_one_version_have_one_winner(s3_server):
    """Without retries, of four writers committing version 1 at once exactly one wins.

    delta-rs 1.x writes the commit file with ``If-None-Match: *``; a store that ignored
    it would let several writers "win" version 1, and all but the last would be lost.
    """
    uri = s3_server.fresh_prefix("race-commit")
    schema = pa.schema([("writer", pa.int64())])
    write_deltalake(
        uri, pa.table({"writer": []}, schema=schema), storage_options=s3_server.storage_options
    )
    results = race(s3_server, "commit", [{"uri": uri, "tag": n, "retries": 0} for n in range(4)])
    winners = [tag for tag, result in enumerate(results) if "version" in result]
    losers = [result for result in results if "error" in result]
    assert len(winners) == 1, results
    assert results[winners[0]]["version"] == 1
    assert len(losers) == 3
    assert all(loser["error"] == "CommitFailedError" for loser in losers), losers
    table = DeltaTable(uri, storage_options=s3_server.storage_options)
    assert table.version() == 1
    assert table.to_pyarrow_table().column("writer").to_pylist() == winners


def test_delta_rs_commits_racing_with_retries_all_land_once(s3_server):
    uri = s3_server.fresh_prefix("race-retry")
    schema = pa.schema([("writer", pa.int64())])
    write_deltalake(
        uri, pa.table({"writer": []}, schema=schema), storage_options=s3_server.storage_options
    )
    results = race(s3_server, "commit", [{"uri": uri, "tag": n, "retries": 10} for n in range(4)])
    assert sorted(result["version"] for result in results) == [1, 2, 3, 4], results
    table = DeltaTable(uri, storage_options=s3_server.storage_options)
    assert table.version() == 4
    assert sorted(table.to_pyarrow_table().column("writer").to_pylist()) == [0, 1, 2, 3]


# --- exclusive creation ------------------------------------------------------------------


def test_object_store_options_come_from_delta_rs_storage_options(s3_server):
    options = {
        **s3_server.storage_options,
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",  # delta-rs only
        "max_retries": "3",  # delta-rs only
        "timeout": "30s",  # an HTTP client setting
    }
    config, client = object_store_options("s3://lake/x", options)
    assert client == {"allow_http": "true", "timeout": "30s"}
    assert config == {
        key: value for key, value in s3_server.storage_options.items() if key != "AWS_ALLOW_HTTP"
    }
    files = TableFiles(s3_server.fresh_prefix("options"), options)
    assert files.write_bytes_atomic("a.json", b"1", exclusive=True)


def test_a_folder_marker_is_not_listed_as_a_file_and_an_empty_file_is(s3_server):
    """Hadoop's S3A marks an empty folder with an empty object whose key ends in ``/``
    (delta-spark's ``_delta_log/_staged_commits/``). The store lists it as an empty file
    named like the folder, which no read can open: it is not one of the table's files."""
    prefix = s3_server.fresh_prefix("marker")
    key = prefix.split("/", 3)[3]
    client = s3_server.client()
    for name, body in [("_staged_commits/", b""), ("empty.json", b""), ("0.json", b"{}")]:
        client.put_object(Bucket=DEFAULT_BUCKET, Key=f"{key}/_delta_log/{name}", Body=body)
    files = TableFiles(prefix, s3_server.storage_options)
    listed = {entry.path: entry.size for entry in files.list_files("_delta_log")}
    assert listed == {"_delta_log/0.json": 2, "_delta_log/empty.json": 0}
    assert {path: files.read_bytes(path) for path in listed} == {
        "_delta_log/0.json": b"{}",
        "_delta_log/empty.json": b"",
    }


def test_exclusive_write_creates_once_and_keeps_the_first(s3_server):
    files = TableFiles(s3_server.fresh_prefix("exclusive"), s3_server.storage_options)
    assert files.write_bytes_atomic("plans/1.json", b"first", exclusive=True)
    assert not files.write_bytes_atomic("plans/1.json", b"second", exclusive=True)
    assert files.read_bytes("plans/1.json") == b"first"
    files.write_bytes_atomic("plans/1.json", b"replaced")
    assert files.read_bytes("plans/1.json") == b"replaced"


def test_exclusive_creation_racing_across_processes_has_one_winner_per_file(s3_server):
    root = s3_server.fresh_prefix("race-create")
    keys = 30
    won = race(
        s3_server, "create", [{"root": root, "keys": keys, "tag": f"w{n}"} for n in range(3)]
    )
    files = TableFiles(root, s3_server.storage_options)
    for key in range(keys):
        winners = [n for n in range(3) if key in won[n]]
        assert len(winners) == 1, (key, won)
        assert files.read_bytes(f"race/{key}.json") == f"w{winners[0]}".encode()


# --- the lease lock ----------------------------------------------------------------------


def test_lease_is_exclusive_and_passes_on_when_released(s3_server):
    root = s3_server.fresh_prefix("lease")
    options = s3_server.storage_options
    first = ObjectStoreLease(root, storage_options=options, owner="first")
    second = ObjectStoreLease(root, storage_options=options, owner="second")
    assert first.try_acquire()
    assert first.generation == 1
    assert not second.try_acquire()
    holder = second.holder()
    assert holder is not None
    assert holder.owner == "first"
    assert first.renew()
    assert first.check()
    first.release()
    assert not first.held
    assert second.try_acquire()
    assert second.generation == 2
    assert not first.try_acquire()
    second.release()


def test_expired_lease_is_taken_over_and_the_old_holder_learns_it(s3_server):
    root = s3_server.fresh_prefix("lease-expiry")
    options = s3_server.storage_options
    paused = ObjectStoreLease(
        root, storage_options=options, owner="paused", lease_s=1.0, clock_skew_s=0.0
    )
    waiting = ObjectStoreLease(root, storage_options=options, owner="waiting", lease_s=30.0)
    assert paused.try_acquire()  # and never renews: a paused process
    assert not waiting.try_acquire()
    time.sleep(1.3)
    assert waiting.try_acquire()
    assert waiting.generation == 2
    assert paused.held  # it does not know yet...
    assert not paused.renew()  # ...until it tries to renew
    assert not paused.held
    paused.release()  # must not release the new holder's lease
    holder = waiting.holder()
    assert holder is not None
    assert (holder.owner, holder.released) == ("waiting", False)
    assert waiting.check()
    waiting.release()


def test_lease_unchanged_for_a_whole_lease_is_over_whatever_its_clock_says(s3_server):
    """A holder whose clock runs an hour ahead cannot keep the lock by its record alone."""
    root = s3_server.fresh_prefix("lease-skew")
    files = TableFiles(root, s3_server.storage_options)
    ahead = LeaseRecord("fast clock", "token", 7, time.time() + 3600, 1.0)
    assert files.write_bytes_atomic("lock", ahead.to_bytes(), exclusive=True)
    waiting = ObjectStoreLease(root, storage_options=s3_server.storage_options)
    assert not waiting.try_acquire()  # first sight of that record
    time.sleep(1.3)
    assert waiting.try_acquire()
    assert waiting.generation == 8
    waiting.release()


def test_operator_lock_racing_across_processes_never_overlaps(s3_server):
    state = s3_server.fresh_prefix("op-state")
    arguments = {"state_uri": state, "rounds": 3, "hold_s": 0.4, "lease_s": 10}
    held = race(s3_server, "lock", [arguments] * 3)
    intervals = sorted(interval for each in held for interval in each)
    assert len(intervals) == 9
    for (_, end), (begin, _) in itertools.pairwise(intervals):
        assert end <= begin, intervals


def test_operator_lock_refuses_a_second_run_and_names_the_holder(s3_server):
    state = s3_server.fresh_prefix("op-busy")
    with operator_lock(state, operator_id="race", storage_options=s3_server.storage_options):
        (message,) = answers([start_worker(s3_server, "try_lock", state_uri=state)])
    assert "Operator 'race' is already running (pid " in message
    assert f"on {os.uname().nodename}, lease until" in message
    assert "wait_for_lock=<seconds>" in message
    (after,) = answers([start_worker(s3_server, "try_lock", state_uri=state)])
    assert after == "acquired"


def test_lock_of_a_killed_holder_is_taken_after_its_lease(s3_server):
    root = s3_server.fresh_prefix("lease-kill")
    holder = start_worker(s3_server, "hold", root=root, lease_s=2.0)
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline()) == {"generation": 1}
        waiting = ObjectStoreLease(root, storage_options=s3_server.storage_options, lease_s=2.0)
        time.sleep(3)  # renewed meanwhile (every 2/3 s): still held
        assert not waiting.try_acquire()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        started = time.monotonic()
        assert waiting.acquire(wait_s=20, poll_s=0.2)
        waited = time.monotonic() - started
        assert waited < 2.0 + 1.0  # one lease of observation, plus polling
        assert waiting.generation == 2
        waiting.release()
    finally:
        holder.kill()
        holder.wait(10)
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()


# --- special characters in delta-rs -------------------------------------------------------

SPECIAL = {
    "space": " ",
    "percent": "%",
    "pct20": "%20",
    "hash": "#",
    "question": "?",
    "bracket": "[",
    "colon": ":",
    "plus": "+",
}


def test_special_characters_in_delta_rs_table_paths(s3_server):
    """What delta-rs makes of a table URI holding each character (recorded truth).

    ``#`` and ``?`` end the URI's path (fragment, query): the table silently lands in
    another folder. ``%XX`` is decoded: ``a%20b`` and ``a b`` are one table to delta-rs
    but two folders to Spark. ``[`` makes delta-rs panic. Space, ``:`` and ``+`` work.
    """
    base = s3_server.fresh_prefix("paths")
    options = s3_server.storage_options
    where: dict[str, str] = {}
    for name, char in SPECIAL.items():
        uri = f"{base}/{name}-a{char}b"
        try:
            write_deltalake(uri, pa.table({"x": [1]}), storage_options=options)
            assert DeltaTable(uri, storage_options=options).to_pyarrow_table().num_rows == 1
        except BaseException as exc:  # a Rust panic is a BaseException
            if isinstance(exc, KeyboardInterrupt):
                raise
            where[name] = f"error: {type(exc).__name__}"
            continue
        (log,) = [
            key
            for key in s3_server.keys(base)
            if key.endswith("/_delta_log/00000000000000000000.json") and f"/{name}-" in key
        ]
        where[name] = log.split("/", 1)[1].removesuffix("/_delta_log/00000000000000000000.json")
    assert where == {
        "space": "space-a b",
        "percent": "percent-a%b",
        "pct20": "pct20-a b",  # decoded
        "hash": "hash-a",  # the rest of the name is a URI fragment, dropped
        "question": "question-a",  # the rest is a query string, dropped
        "bracket": "error: PanicException",
        "colon": "colon-a:b",
        "plus": "plus-a+b",
    }


def test_special_characters_in_partition_values_round_trip_in_delta_rs(s3_server):
    base = s3_server.fresh_prefix("values")
    options = s3_server.storage_options
    folders = {}
    for name, char in SPECIAL.items():
        uri = f"{base}/{name}"
        value = f"a{char}b"
        write_deltalake(
            uri,
            pa.table({"x": [1, 2], "p": [value, "plain"]}),
            partition_by=["p"],
            storage_options=options,
        )
        read = DeltaTable(uri, storage_options=options).to_pyarrow_table()
        assert sorted(read.column("p").to_pylist()) == sorted([value, "plain"])
        (folder,) = {key.split("/")[2] for key in s3_server.keys(uri) if "/p=a" in key}
        folders[name] = folder
    assert folders == {
        "space": "p=a%20b",
        "percent": "p=a%25b",
        "pct20": "p=a%2520b",
        "hash": "p=a%23b",
        "question": "p=a%3Fb",
        "bracket": "p=a%5Bb",
        "colon": "p=a%3Ab",
        "plus": "p=a%2Bb",
    }


# --- secrets -------------------------------------------------------------------------------


def test_storage_secrets_stay_out_of_reprs_and_errors(s3_server):
    """The secret key must not show in a repr, nor in the errors of delta-rs and obstore."""
    from dagster_sideinputs.delta.storage import DeltaStorage
    from tests.servers.s3 import SECRET_KEY

    options = s3_server.storage_options
    assert SECRET_KEY not in repr(DeltaStorage(root="s3://lake/x", storage_options=options))
    missing = "s3://no-such-bucket/table"
    failures = []
    for attempt in (
        lambda: DeltaTable(missing, storage_options=options),
        lambda: TableFiles(missing, options).write_bytes_atomic("plan", b"1", exclusive=True),
        lambda: TableFiles(missing, options).read_bytes("plan"),
    ):
        with pytest.raises(Exception) as failure:  # noqa: PT011 (any error: we read its text)
            attempt()
        failures.append(failure)
    for failure in failures:
        text = str(failure.value)
        assert "no-such-bucket" in text
        assert SECRET_KEY not in text
        assert SECRET_KEY not in repr(failure.value)
