"""The example code location behind a real ``dagster-webserver``, driven as the UI drives it.

A fresh Dagster instance and Delta lake; runs are launched and terminated with the very
GraphQL mutations the UI's Materialize and Terminate buttons send (copied from the UI's
``LaunchAssetExecutionButton`` and ``TerminationDialog``), and the asset graph and the
materialization metadata are read back through GraphQL.
"""

import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from assets.payments import hourly

pytestmark = [pytest.mark.webserver, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
LOCATION = "payments"
REPOSITORY = "__repository__"
ASSET_JOB = "__ASSET_JOB"
OUTPUTS = [
    "enriched_transactions",
    "suspicious_transactions",
    "unmatched_transactions",
    "late_transactions",
]
INPUTS = ["transactions", "customer_profiles", "fx_rates", "fraud_rules"]
# The FX partitions this module materializes, and the hour its transactions are in: fixed
# when the module is imported, so that a run crossing the hour boundary stays consistent.
PREVIOUS_HOUR, THIS_HOUR = hourly.get_partition_keys()[-2:]
SMALL_BATCH = {
    "ops": {
        "transactions": {
            "config": {
                "count": 500,
                "hour": dt.datetime.strptime(THIS_HOUR, hourly.fmt)
                .replace(tzinfo=dt.timezone.utc)
                .isoformat(),
            }
        }
    }
}
STARTUP_TIMEOUT_S = 120
RUN_TIMEOUT_S = 420
CANCEL_TIMEOUT_S = 90

LAUNCH = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message stack }
  }
}"""
TERMINATE = """
mutation Terminate($runIds: [String!]!, $terminatePolicy: TerminateRunPolicy) {
  terminateRuns(runIds: $runIds, terminatePolicy: $terminatePolicy) {
    __typename
    ... on TerminateRunsResult {
      terminateRunResults {
        __typename
        ... on TerminateRunSuccess { run { id canTerminate } }
        ... on TerminateRunFailure { message }
        ... on RunNotFoundError { message }
        ... on PythonError { message }
      }
    }
    ... on PythonError { message }
  }
}"""
REPOSITORY_JOBS = """
query ($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on Repository { jobs { name } }
  }
}"""
RUN_STATUS = """
query ($runId: ID!) { runOrError(runId: $runId) { ... on Run { status } } }"""
RUN_ERRORS = """
query ($runId: ID!) {
  logsForRun(runId: $runId) {
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message stepKey }
        ... on ErrorEvent { error { message stack cause { message stack } } }
      }
    }
  }
}"""
ASSET_GRAPH = """
{ assetNodes { assetKey { path } dependencyKeys { path } dependedByKeys { path } } }"""
MATERIALIZATIONS = """
query ($path: [String!]!, $limit: Int!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: $limit) { runId description metadataEntries { label } }
    }
  }
}"""


@dataclass
class Webserver:
    """A running ``dagster-webserver`` and the lake its runs write to."""

    url: str
    lake: Path
    log: Path

    def query(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        assert "errors" not in answer, answer["errors"]
        return answer["data"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _instance_home(home: Path) -> None:
    home.mkdir()
    # Runs start at once without a daemon: Dagster's default coordinator queues them.
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\n"
        "run_coordinator:\n"
        "  module: dagster.core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n"
    )


def _wait_until_loaded(server: Webserver, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dagster-webserver exited:\n{server.log.read_text()[-3000:]}")
        try:
            repository = server.query(REPOSITORY_JOBS, selector=selector)["repositoryOrError"]
            if repository["__typename"] == "Repository":
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    pytest.fail(f"code location not loaded in {STARTUP_TIMEOUT_S}s:\n{server.log.read_text()}")


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the whole group (webserver, code server, runs, their Spark JVMs), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def webserver(tmp_path_factory) -> Iterator[Webserver]:
    """``dagster-webserver -w workspace.yaml`` on a fresh instance, lake and port."""
    root = tmp_path_factory.mktemp("webserver")
    _instance_home(root / "dagster_home")
    port = _free_port()
    server = Webserver(f"http://127.0.0.1:{port}", root / "lake", root / "webserver.log")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "DSI_LAKE_ROOT": str(server.lake),
        "DSI_SPARK_UI": "false",
    }
    # `python -m dagster_webserver` is `dagster-webserver`, even when .venv/bin is not on PATH.
    command = [sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml"]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    with server.log.open("w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_until_loaded(server, process)
        yield server
    finally:
        _stop(process)


def launch(
    server: Webserver,
    job: str,
    assets: list[str] | None = None,
    *,
    tags: dict[str, str] | None = None,
    run_config: dict[str, Any] | None = None,
) -> str:
    """Launch a run as the Materialize button (``assets``) or the job page does; its id."""
    selector: dict[str, Any] = {
        "repositoryLocationName": LOCATION,
        "repositoryName": REPOSITORY,
        "pipelineName": job,
    }
    if assets is not None:
        selector["assetSelection"] = [{"path": [name]} for name in assets]
    params = {
        "mode": "default",
        "selector": selector,
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]},
        "runConfigData": json.dumps(run_config or {}),
    }
    result = server.query(LAUNCH, executionParams=params)["launchPipelineExecution"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["id"]


def run_errors(server: Webserver, run_id: str) -> str:
    events = server.query(RUN_ERRORS, runId=run_id)["logsForRun"]["events"]
    return "\n\n".join(
        f"{e['__typename']} {e.get('stepKey') or ''}: {e['message']}\n{json.dumps(e['error'])}"
        for e in events
        if e.get("error")
    )


def wait_for_run(server: Webserver, run_id: str, status: str, timeout: float) -> None:
    """Poll until the run reaches ``status``; fail at once with its errors if it fails."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = server.query(RUN_STATUS, runId=run_id)["runOrError"]["status"]
        if seen == status:
            return
        if seen in ("FAILURE", "CANCELED", "SUCCESS"):
            break
        time.sleep(1)
    pytest.fail(f"run {run_id} is {seen}, expected {status}:\n{run_errors(server, run_id)}")


def materializations(server: Webserver, asset: str, limit: int = 10) -> list[dict[str, Any]]:
    """The latest materializations of an asset, newest first."""
    answer = server.query(MATERIALIZATIONS, path=[asset], limit=limit)["assetOrError"]
    return answer.get("assetMaterializations", [])


def wait_for_micro_batch(server: Webserver, run_id: str, asset: str, timeout: float) -> None:
    """Poll until the (still running) run reports a micro-batch materialization of ``asset``."""
    deadline = time.monotonic() + timeout
    while not any(
        m["runId"] == run_id and (m["description"] or "").startswith("micro-batch ")
        for m in materializations(server, asset)
    ):
        status = server.query(RUN_STATUS, runId=run_id)["runOrError"]["status"]
        if status not in ("QUEUED", "STARTING", "STARTED"):
            pytest.fail(f"run {run_id} is {status}:\n{run_errors(server, run_id)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no micro-batch of {asset} in run {run_id} after {timeout}s")
        time.sleep(1)


def _files(folder: Path) -> int:
    return len(list(folder.iterdir())) if folder.exists() else 0


@pytest.fixture(scope="module")
def sources(webserver: Webserver) -> Webserver:
    """Profiles, fraud rules, 500 transactions and the FX rates of the last two hours."""
    unpartitioned = launch(
        webserver,
        ASSET_JOB,
        ["fraud_rules", "customer_profiles", "transactions"],
        run_config=SMALL_BATCH,  # the code location's executor is in-process
    )
    # One partition at a time: the first write creates the table, and two runs creating
    # it at once make one fail (ConcurrentWriteError).
    for key in (PREVIOUS_HOUR, THIS_HOUR):
        fx = launch(webserver, ASSET_JOB, ["fx_rates"], tags={"dagster/partition": key})
        wait_for_run(webserver, fx, "SUCCESS", RUN_TIMEOUT_S)
    wait_for_run(webserver, unpartitioned, "SUCCESS", RUN_TIMEOUT_S)
    return webserver


def test_asset_graph_shows_every_output_depending_on_main_and_side_inputs(webserver):
    nodes = webserver.query(ASSET_GRAPH)["assetNodes"]
    upstream = {
        n["assetKey"]["path"][-1]: {k["path"][-1] for k in n["dependencyKeys"]} for n in nodes
    }
    downstream = {
        n["assetKey"]["path"][-1]: {k["path"][-1] for k in n["dependedByKeys"]} for n in nodes
    }

    for output in OUTPUTS:
        assert upstream[output] == set(INPUTS), output
    for source in INPUTS:
        assert downstream[source] == set(OUTPUTS), source


def test_operator_job_launched_after_materialize_reports_rows_version_and_side_versions(sources):
    run_id = launch(sources, "payments_enrichment_job")
    wait_for_run(sources, run_id, "SUCCESS", RUN_TIMEOUT_S)

    latest = materializations(sources, "enriched_transactions", limit=1)[0]
    assert latest["runId"] == run_id
    labels = {entry["label"] for entry in latest["metadataEntries"]}
    assert {"rows_written", "delta_version", "side_input_versions"} <= labels


def test_terminate_button_cancels_continuous_run_after_a_complete_micro_batch(sources):
    # New main input, so the continuous run has a micro-batch to do whatever ran before.
    wait_for_run(
        sources,
        launch(sources, ASSET_JOB, ["transactions"], run_config=SMALL_BATCH),
        "SUCCESS",
        RUN_TIMEOUT_S,
    )
    run_id = launch(sources, "payments_enrichment_continuous_job")
    wait_for_micro_batch(sources, run_id, "enriched_transactions", RUN_TIMEOUT_S)

    answer = sources.query(TERMINATE, runIds=[run_id], terminatePolicy="SAFE_TERMINATE")
    [result] = answer["terminateRuns"]["terminateRunResults"]
    assert result["__typename"] == "TerminateRunSuccess", result
    wait_for_run(sources, run_id, "CANCELED", CANCEL_TIMEOUT_S)

    state = sources.lake / "_sideinputs" / "enriched_transactions"
    assert _files(state / "commits") >= 1
    assert _files(state / "plans") == _files(state / "commits")
