"""A real ``dagster-webserver`` on the example code location, driven as the UI drives it.

Runs are launched and terminated with the very GraphQL mutations the UI's Materialize,
Execute (checks) and Terminate buttons send (from the UI's
``LaunchAssetExecutionButton``, ``useExecuteAssetChecks`` and ``TerminationDialog``);
assets, events and checks are read back through GraphQL.
"""

import contextlib
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

REPO = Path(__file__).resolve().parents[2]
LOCATION = "payments"
REPOSITORY = "__repository__"
ASSET_JOB = "__ASSET_JOB"
STARTUP_TIMEOUT_S = 120
RUN_TIMEOUT_S = 420
POLL_S = 0.25  # between GraphQL polls of a run's status (each run is waited for)

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
REPOSITORY_DEFINITIONS = """
query ($selector: RepositorySelector!) {
  repositoryOrError(repositorySelector: $selector) {
    __typename
    ... on Repository {
      jobs { name }
      sensors { name }
      schedules { name }
      assetNodes { assetKey { path } }
    }
  }
}"""
RUN_STATUS = """
query ($runId: ID!) { runOrError(runId: $runId) { ... on Run { status } } }"""
RUN_LOGS = """
query ($runId: ID!) {
  logsForRun(runId: $runId) {
    ... on EventConnection {
      events {
        __typename
        ... on MessageEvent { message stepKey level timestamp }
        ... on ErrorEvent { error { message stack cause { message stack } } }
      }
    }
  }
}"""
METADATA = """
  label
  __typename
  ... on IntMetadataEntry { intRepr }
  ... on FloatMetadataEntry { floatValue }
  ... on TextMetadataEntry { text }
  ... on MarkdownMetadataEntry { mdStr }
  ... on JsonMetadataEntry { jsonString }
  ... on PathMetadataEntry { path }
"""
ASSET_NODES = """
{
  assetNodes {
    assetKey { path }
    dependencyKeys { path }
    dependedByKeys { path }
    description
    kinds
    tags { key value }
    metadataEntries { METADATA }
    assetChecksOrError { ... on AssetChecks { checks { name canExecuteIndividually } } }
  }
}""".replace("METADATA", METADATA)
ASSET_EVENTS = """
query ($path: [String!]!, $limit: Int!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: $limit) {
        runId timestamp description metadataEntries { METADATA }
      }
      assetObservations(limit: $limit) {
        runId timestamp description metadataEntries { METADATA }
      }
    }
  }
}""".replace("METADATA", METADATA)
CHECK_EXECUTIONS = """
query ($path: [String!]!, $name: String!, $limit: Int!) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $name, limit: $limit) {
    runId
    status
    evaluation { success description metadataEntries { METADATA } }
  }
}""".replace("METADATA", METADATA)


def metadata_values(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """GraphQL metadata entries as plain values (ints, floats, text, markdown, JSON)."""
    values: dict[str, Any] = {}
    for entry in entries:
        kind = entry["__typename"]
        if kind == "IntMetadataEntry":
            values[entry["label"]] = int(entry["intRepr"])
        elif kind == "FloatMetadataEntry":
            values[entry["label"]] = entry["floatValue"]
        elif kind == "JsonMetadataEntry":
            values[entry["label"]] = json.loads(entry["jsonString"])
        else:
            values[entry["label"]] = entry.get("text") or entry.get("mdStr") or entry.get("path")
    return values


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

    def definitions(self) -> dict[str, Any]:
        selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
        return self.query(REPOSITORY_DEFINITIONS, selector=selector)["repositoryOrError"]

    def launch(
        self,
        job: str,
        assets: list[str] | None = None,
        *,
        checks: list[tuple[str, str]] | None = None,
        tags: dict[str, str] | None = None,
        run_config: dict[str, Any] | None = None,
    ) -> str:
        """Launch a run as the Materialize button (``assets``), the Execute button of
        checks (``checks``: (asset, check) pairs) or the job page does; its id."""
        selector: dict[str, Any] = {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "pipelineName": job,
        }
        if assets is not None or checks is not None:
            selector["assetSelection"] = [{"path": [name]} for name in assets or []]
        if checks is not None:
            selector["assetCheckSelection"] = [
                {"assetKey": {"path": [asset]}, "name": name} for asset, name in checks
            ]
        params = {
            "mode": "default",
            "selector": selector,
            "executionMetadata": {
                "tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]
            },
            "runConfigData": json.dumps(run_config or {}),
        }
        result = self.query(LAUNCH, executionParams=params)["launchPipelineExecution"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["id"]

    def logs(self, run_id: str) -> list[dict[str, Any]]:
        return self.query(RUN_LOGS, runId=run_id)["logsForRun"]["events"]

    def run_errors(self, run_id: str) -> str:
        return "\n\n".join(
            f"{e['__typename']} {e.get('stepKey') or ''}: {e['message']}\n{json.dumps(e['error'])}"
            for e in self.logs(run_id)
            if e.get("error")
        )

    def wait_for_run(self, run_id: str, status: str = "SUCCESS", timeout: float = RUN_TIMEOUT_S):
        """Poll until the run reaches ``status``; fail at once with its errors if it fails."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = self.query(RUN_STATUS, runId=run_id)["runOrError"]["status"]
            if seen == status:
                return
            if seen in ("FAILURE", "CANCELED", "SUCCESS"):
                break
            time.sleep(POLL_S)
        pytest.fail(f"run {run_id} is {seen}, expected {status}:\n{self.run_errors(run_id)}")

    def run(self, job: str, assets: list[str] | None = None, **kwargs: Any) -> str:
        """Launch and wait for success; the run id."""
        run_id = self.launch(job, assets, **kwargs)
        self.wait_for_run(run_id)
        return run_id

    def events(self, asset: str, limit: int = 20) -> dict[str, list[dict[str, Any]]]:
        """Latest materializations and observations of an asset, newest first, with their
        metadata as plain values under ``values``."""
        answer = self.query(ASSET_EVENTS, path=[asset], limit=limit)["assetOrError"]
        found: dict[str, list[dict[str, Any]]] = {}
        for kind in ("assetMaterializations", "assetObservations"):
            found[kind] = [
                {**event, "values": metadata_values(event["metadataEntries"])}
                for event in answer.get(kind, [])
            ]
        return found

    def materializations(self, asset: str, run_id: str | None = None) -> list[dict[str, Any]]:
        events = self.events(asset)["assetMaterializations"]
        return [e for e in events if run_id is None or e["runId"] == run_id]

    def observations(self, asset: str, run_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events(asset)["assetObservations"] if e["runId"] == run_id]

    def check_executions(self, asset: str, check: str) -> list[dict[str, Any]]:
        """The latest executions of a check, newest first."""
        return self.query(CHECK_EXECUTIONS, path=[asset], name=check, limit=20)[
            "assetCheckExecutions"
        ]

    def check_execution(self, asset: str, check: str, run_id: str) -> dict[str, Any]:
        """The evaluation of a check in a run, metadata as plain values under ``values``."""
        [execution] = [e for e in self.check_executions(asset, check) if e["runId"] == run_id]
        evaluation = execution["evaluation"]
        assert evaluation is not None, execution
        return {**evaluation, "values": metadata_values(evaluation["metadataEntries"])}

    def wait_for_micro_batch(self, run_id: str, asset: str, timeout: float = RUN_TIMEOUT_S):
        """Poll until the (still running) run reports a micro-batch materialization of
        ``asset``."""
        deadline = time.monotonic() + timeout
        while not any(
            (m["description"] or "").startswith("micro-batch ")
            for m in self.materializations(asset, run_id)
        ):
            status = self.query(RUN_STATUS, runId=run_id)["runOrError"]["status"]
            if status not in ("QUEUED", "STARTING", "STARTED"):
                pytest.fail(f"run {run_id} is {status}:\n{self.run_errors(run_id)}")
            if time.monotonic() > deadline:
                pytest.fail(f"no micro-batch of {asset} in run {run_id} after {timeout}s")
            time.sleep(POLL_S)


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
    # The welcome dialog ("Add your email...") counts as seen on this instance: the UI
    # opens it a second after a page loads, over whatever a browser test clicks next.
    (home / ".nux").mkdir()
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")


def _wait_until_loaded(server: Webserver, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"dagster-webserver exited:\n{server.log.read_text()[-3000:]}")
        try:
            if server.definitions()["__typename"] == "Repository":
                return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(POLL_S)
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


@contextlib.contextmanager
def serve(root: Path, env: dict[str, str]) -> Iterator[Webserver]:
    """``dagster-webserver -w workspace.yaml`` on a fresh instance and lake under ``root``."""
    _instance_home(root / "dagster_home")
    port = _free_port()
    server = Webserver(f"http://127.0.0.1:{port}", root / "lake", root / "webserver.log")
    environment = {
        **os.environ,
        "DAGSTER_HOME": str(root / "dagster_home"),
        "DSI_LAKE_ROOT": str(server.lake),
        "DSI_SPARK_UI": "false",
        **env,
    }
    # `python -m dagster_webserver` is `dagster-webserver`, even when .venv/bin is not on PATH.
    command = [sys.executable, "-m", "dagster_webserver", "-w", "workspace.yaml"]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    with server.log.open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_until_loaded(server, process)
        yield server
    finally:
        _stop(process)
