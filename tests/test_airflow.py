"""The Airflow 3 provider against a real Airflow (``airflow standalone``: API server,
scheduler, DAG processor, triggerer; SQLite; 127.0.0.1), run from ``.venv-airflow``
(``make airflow``: ``pip install '.[airflow]'`` into a fresh venv).

One instance for the module and one story, in order: the example's inputs are made by
Dagster in this process (lake D) and copied to the Airflow lakes; Dagster runs the
operator on D; Airflow runs the example DAG on its copy (A), triggered by the inputs'
asset events posted through the REST API, and, at the same time, a copy of the DAG
whose task is SIGKILLed mid-batch and retried (K) and one whose function fails (E).
Then a side input arrives later on both sides: Airflow's next, asset-triggered run
releases what waited. The example's and the kill DAG's tasks attach to a Spark Connect
server the module starts; the error DAG's task starts its own Spark. Outputs are compared
table by table with Dagster's, asset events' extra with Dagster's materialization metadata.
"""

import contextlib
import datetime as dt
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import requests

import dagster_sideinputs as dsi
from assets.enrichment import payments_enrichment
from assets.payments import customer_profiles, fraud_rules, fx_rates, hourly, transactions
from bench.crash_harness import KILL_POINTS
from dagster_sideinputs.core.spark.connect_server import LocalConnectServer
from tests.cluster import OUTPUT_TABLES, free_port, table_rows
from tests.dagster_layer.conftest import PREVIOUS_HOUR, THIS_HOUR, transactions_config

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-airflow"
DAG_ID = "payments_enrichment"
TASK_ID = "payments_enrichment"
INPUTS = ("transactions", "customer_profiles", "fx_rates", "fraud_rules")
STARTUP_S = 240
RUN_TIMEOUT_S = 900
# After batch 0's first table commit, under the tests' Delta engine (DSI_DELTA_ENGINE,
# tests/conftest.py; Airflow's task processes inherit it).
KILL_AT = KILL_POINTS[
    "after-first-table"
    if os.environ["DSI_DELTA_ENGINE"] == "delta-rs"
    else "after-first-table-spark"
]
# The figures both orchestrators report for an output (GLOSSARY), compared one to one.
FIGURES = (
    "rows_written",
    "new_records",
    "from_buffer",
    "records_processed",
    "released",
    "buffered",
    "late",
    "unmatched",
    "buffered_rows",
    "batches",
    "delta_version",
)

# The module's fixtures run inside its first test's timeout: several Spark task processes.
pytestmark = [pytest.mark.slow, pytest.mark.airflow, pytest.mark.timeout(2400)]


def partition_key(dagster_key: str) -> str:
    """An hourly partition as Airflow writes it (AirflowReadiness's default format)."""
    start = dt.datetime.strptime(dagster_key, hourly.fmt)
    return start.strftime("%Y-%m-%dT%H:%M:%S")


# --- the Airflow instance ----------------------------------------------------------------


DAG_FILES = {
    # The example, on lake A (DSI_LAKE_ROOT).
    "example.py": """
        from assets.airflow_dags.payments_enrichment import dag  # the airflow DAG
    """,
    # The same DAG on lake K, run on request; its task's first try is SIGKILLed (with
    # its JVM: its own process group) at DSI_KILL_AT, after which DSI_KILL_MARK exists.
    "kill.py": """
        import os
        from pathlib import Path

        from assets.airflow_payments import payments_dag

        mark = Path(os.environ["DSI_KILL_MARK"])
        if not mark.exists():
            from tests.kill_points import arm_kill_point

            arm_kill_point(os.environ["DSI_KILL_AT"], mark.touch)
        dag = payments_dag(
            "payments_kill", os.environ["DSI_KILL_LAKE"], asset_triggered=False,
            asset_prefix="kill/", retries=1,
        )
    """,
    # The same DAG on lake E with a function reading a column that does not exist; its
    # task starts its own Spark (local[2]), as a task does by default.
    "error.py": """
        import os

        from assets.airflow_payments import payments_dag

        os.environ.pop("DSI_SPARK_REMOTE", None)


        def enrich_badly(main, sides):
            return main.select("tx_id", "no_such_column")


        dag = payments_dag(
            "payments_error", os.environ["DSI_ERROR_LAKE"], asset_triggered=False,
            asset_prefix="error/", fn=enrich_badly, retries=0,
        )
    """,
}


@dataclass
class Airflow:
    url: str
    process: subprocess.Popen
    home: Path
    log: Path
    asset_ids: dict[str, int] = field(default_factory=dict)

    def get(self, path: str, **params: Any) -> Any:
        response = requests.get(f"{self.url}/api/v2{path}", params=params, timeout=30)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        response = requests.post(f"{self.url}/api/v2{path}", json=body, timeout=30)
        assert response.ok, f"POST {path}: {response.status_code} {response.text}"
        return response.json()

    def asset_id(self, name: str) -> int:
        if name not in self.asset_ids:
            found = self.get("/assets", name_pattern=name, limit=100)["assets"]
            self.asset_ids.update({a["name"]: a["id"] for a in found})
        return self.asset_ids[name]

    def asset_event(self, name: str, partition: str | None = None) -> None:
        body: dict[str, Any] = {"asset_id": self.asset_id(name), "extra": {"writer": "test"}}
        if partition is not None:
            body["partition_key"] = partition
        self.post("/assets/events", body)

    def events(self, name: str) -> list[dict[str, Any]]:
        return self.get("/assets/events", asset_id=self.asset_id(name), limit=100)["asset_events"]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.get(f"/dags/{dag_id}/dagRuns", limit=100, order_by="id")["dag_runs"]

    def trigger(self, dag_id: str) -> str:
        return self.post(f"/dags/{dag_id}/dagRuns", {"logical_date": None})["dag_run_id"]

    def wait_for_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            run = self.get(f"/dags/{dag_id}/dagRuns/{run_id}")
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(1)
        raise AssertionError(f"{dag_id} run {run_id} did not finish:\n{self.tail()}")

    def settle(self, dag_id: str, known: int) -> list[dict[str, Any]]:
        """Wait for the asset-triggered runs after ``known`` runs to be made and finish
        (none queued or running, no asset event waiting for the DAG)."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            runs = self.runs(dag_id)
            done = all(r["state"] in ("success", "failed") for r in runs)
            queued = requests.get(
                f"{self.url}/api/v2/dags/{dag_id}/assets/queuedEvents", timeout=30
            )
            waiting = queued.ok and queued.json().get("total_entries", 0) > 0
            if len(runs) > known and done and not waiting:
                return runs[known:]
            time.sleep(1)
        raise AssertionError(f"{dag_id}: runs did not settle:\n{self.tail()}")

    def task_tries(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{TASK_ID}/tries"
        return self.get(path)["task_instances"]

    def task_log(self, dag_id: str, run_id: str, try_number: int) -> list[dict[str, Any]]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{TASK_ID}/logs/{try_number}"
        content = self.get(path, full_content=True)["content"]
        return [line for line in content if isinstance(line, dict)]

    def describe(self, dag_id: str, runs: list[dict[str, Any]]) -> str:
        """The runs' states and their tasks' last logs (an assertion's message)."""
        text = []
        for run in runs:
            text.append(f"{run['dag_run_id']}: {run['state']}")
            tis = self.get(f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances")
            for ti in tis["task_instances"]:
                text.append(f"  {ti['task_id']}: {ti['state']} (try {ti['try_number']})")
                if ti["try_number"]:
                    path = (
                        f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances/"
                        f"{ti['task_id']}/logs/{ti['try_number']}"
                    )
                    lines = self.get(path, full_content=True)["content"]
                    text += [
                        f"    {line.get('event')}" for line in lines[-40:] if isinstance(line, dict)
                    ]
        return "\n".join(text)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def start_airflow(root: Path, lakes: Mapping[str, Path], spark_remote: str) -> Airflow:
    """``airflow standalone`` in its own process group (stopped by the fixture). The
    tasks of the example and kill DAGs attach to the Connect server at ``spark_remote``;
    the error DAG's task starts its own Spark."""
    if not (VENV / "bin" / "airflow").exists():
        message = f"{VENV} is missing: run `make airflow`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    dags = root / "dags"
    dags.mkdir()
    for name, text in DAG_FILES.items():
        (dags / name).write_text(textwrap.dedent(text))
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "AIRFLOW_HOME": str(root / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        # Where task processes reach the API server (default: port 8080).
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "DSI_LAKE_ROOT": str(lakes["A"]),
        "DSI_KILL_LAKE": str(lakes["K"]),
        "DSI_ERROR_LAKE": str(lakes["E"]),
        "DSI_KILL_AT": KILL_AT,
        "DSI_KILL_MARK": str(root / "killed"),
        "DSI_SPARK_UI": "false",
        "DSI_SPARK_MASTER": "local[2]",
        "DSI_SPARK_DRIVER_MEMORY": "1g",
        "DSI_SPARK_REMOTE": spark_remote,
    }
    env.pop("VIRTUAL_ENV", None)
    log = root / "airflow.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(VENV / "bin" / "airflow"), "standalone"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Airflow(f"http://127.0.0.1:{port}", process, root / "home", log)


def wait_until_ready(airflow: Airflow) -> None:
    """The API answers and the DAG processor has parsed the three DAGs."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert airflow.process.poll() is None, f"airflow exited:\n{airflow.tail()}"
        try:
            dags = {d["dag_id"] for d in airflow.get("/dags", limit=100)["dags"]}
        except requests.RequestException:
            dags = set()
        if {DAG_ID, "payments_kill", "payments_error"} <= dags:
            return
        time.sleep(2)
    raise AssertionError(f"Airflow not ready after {STARTUP_S}s:\n{airflow.tail()}")


def stop(process: subprocess.Popen) -> None:
    with_group = os.getpgid(process.pid)
    os.killpg(with_group, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(with_group, signal.SIGKILL)
        process.wait()
    time.sleep(1)
    with contextlib.suppress(ProcessLookupError):  # what standalone started, their JVMs
        os.killpg(with_group, signal.SIGKILL)


# --- Dagster, in this process --------------------------------------------------------------


class Dagster:
    """The example's assets materialized in this process, on lake D."""

    ASSETS = (transactions, customer_profiles, fx_rates, fraud_rules, payments_enrichment)

    def __init__(self, lake: Path) -> None:
        self.lake = lake
        spark = dsi.SparkResource(master="local[2]", ui_enabled=False, driver_memory="1g")
        self.resources = {
            "spark": spark,
            "io_manager": dsi.DeltaIOManager(root=str(lake), spark=spark),
        }
        self.instance = dg.DagsterInstance.ephemeral()

    def materialize(self, assets: list[Any], **kwargs: Any) -> Any:
        result = dg.materialize(
            list(self.ASSETS),
            selection=assets,
            resources=self.resources,
            instance=self.instance,
            **kwargs,
        )
        assert result.success
        return result

    def transactions(self, count: int, hours_back: int, unknown: float) -> None:
        config = transactions_config(count, hours_back, unknown)
        self.materialize([transactions], run_config=config)

    def enrich(self) -> dict[str, dict[str, Any]]:
        """Run the operator; the metadata of each output it materialized."""
        result = self.materialize([payments_enrichment])
        found = {}
        for event in result.get_asset_materialization_events():
            materialization = event.event_specific_data.materialization
            found[materialization.asset_key.to_user_string()] = {
                k: v.value for k, v in materialization.metadata.items()
            }
        return found


def copy_tables(source: Path, target: Path, names: tuple[str, ...]) -> None:
    for name in names:
        shutil.rmtree(target / name, ignore_errors=True)
        shutil.copytree(source / name, target / name)


def outputs(lake: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: table_rows(lake, name) for name in OUTPUT_TABLES if (lake / name).exists()}


# --- the story -------------------------------------------------------------------------------


@dataclass
class Story:
    airflow: Airflow
    dagster: Dagster
    lakes: dict[str, Path]
    first: dict[str, Any] = field(default_factory=dict)
    release: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def story(connect_server: LocalConnectServer) -> Iterator[Story]:
    root = Path(tempfile.mkdtemp(prefix="dsi-airflow-"))  # short: Airflow's socket paths
    lakes = {name: root / f"lake-{name}" for name in ("D", "A", "K", "E")}
    for lake in lakes.values():
        lake.mkdir()
    # A task that starts its own JVM runs the example's batch cold: the first runs (three
    # DAGs at once) settled in 125 s that way against 48 s attached to a warm server, the
    # release in 56 s against 16 s (docs/airflow.md). The server is the session's, warmed
    # up (tests/conftest.py), shared with the other modules that attach to one.
    airflow = start_airflow(root, lakes, connect_server.url)  # boots while Dagster makes the inputs
    try:
        dagster = Dagster(lakes["D"])
        dagster.materialize([fraud_rules])
        dagster.materialize([customer_profiles])
        dagster.materialize([fx_rates], partition_key=THIS_HOUR)
        dagster.transactions(500, hours_back=0, unknown=0.05)  # some customers unknown yet
        dagster.transactions(200, hours_back=1, unknown=0)  # their FX hour is not there yet
        for lake in ("A", "K", "E"):
            copy_tables(lakes["D"], lakes[lake], INPUTS)
        started = time.perf_counter()
        first = dagster.enrich()
        story = Story(airflow, dagster, lakes, seconds={"dagster_first": 0.0})
        story.seconds["dagster_first"] = time.perf_counter() - started
        story.first["dagster"] = first
        story.first["dagster_tables"] = outputs(lakes["D"])
        wait_until_ready(airflow)
        yield story
    finally:
        stop(airflow.process)
        if not os.environ.get("DSI_KEEP_AIRFLOW"):  # set it to look at Airflow's logs
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def first_runs(story: Story) -> Story:
    """The inputs' asset events posted (the example DAG runs on them), the kill and error
    DAGs triggered at the same time; all finished."""
    airflow = story.airflow
    started = time.perf_counter()
    for prefix in ("kill/", "error/", ""):  # the example's last: its events start its run
        for name in ("fraud_rules", "customer_profiles"):
            airflow.asset_event(prefix + name)
        airflow.asset_event(prefix + "fx_rates", partition_key(THIS_HOUR))
        airflow.asset_event(prefix + "transactions")
    kill_run = airflow.trigger("payments_kill")
    error_run = airflow.trigger("payments_error")
    story.first["runs"] = airflow.settle(DAG_ID, 0)
    story.seconds["airflow_first"] = time.perf_counter() - started
    story.first["kill"] = airflow.wait_for_run("payments_kill", kill_run)
    story.first["error"] = airflow.wait_for_run("payments_error", error_run)
    story.first["tables"] = outputs(story.lakes["A"])
    return story


@pytest.fixture(scope="module")
def released(first_runs: Story) -> Story:
    """The missing profiles and the previous hour's FX partition arrive: Dagster writes
    them (lake D, copied to A) and runs the operator; Airflow gets their asset events."""
    story, airflow, dagster = first_runs, first_runs.airflow, first_runs.dagster
    dagster.materialize(
        [customer_profiles],
        run_config={"ops": {"customer_profiles": {"config": {"extra_customers": 60}}}},
    )
    dagster.materialize([fx_rates], partition_key=PREVIOUS_HOUR)
    copy_tables(story.lakes["D"], story.lakes["A"], ("customer_profiles", "fx_rates"))
    started = time.perf_counter()
    story.release["dagster"] = dagster.enrich()
    story.seconds["dagster_release"] = time.perf_counter() - started
    story.release["dagster_tables"] = outputs(story.lakes["D"])
    known = len(airflow.runs(DAG_ID))
    started = time.perf_counter()
    airflow.asset_event("customer_profiles")
    airflow.asset_event("fx_rates", partition_key(PREVIOUS_HOUR))
    story.release["runs"] = airflow.settle(DAG_ID, known)
    story.seconds["airflow_release"] = time.perf_counter() - started
    story.release["tables"] = outputs(story.lakes["A"])
    return story


def latest_extra(airflow: Airflow, name: str) -> dict[str, Any]:
    events = [e for e in airflow.events(name) if e.get("source_task_id") == TASK_ID]
    assert events, f"no asset event for {name}"
    return max(events, key=lambda e: e["id"])["extra"]


def compare_figures(extra: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    assert {k: extra[k] for k in FIGURES} == {k: metadata[k] for k in FIGURES}
    assert extra["row_count"] == metadata["dagster/row_count"]
    assert extra["side_input_versions"] == metadata["side_input_versions"]


# --- tests -----------------------------------------------------------------------------------


def test_the_example_dag_writes_the_tables_dagster_writes_from_the_same_data(first_runs):
    story = first_runs
    ran = [r for r in story.first["runs"] if r["run_type"] == "asset_triggered"]
    assert ran, story.first["runs"]
    assert all(r["state"] == "success" for r in ran), story.airflow.describe(DAG_ID, ran)
    assert story.first["tables"] == story.first["dagster_tables"]
    assert story.first["tables"]["enriched_transactions"], "nothing enriched"


def test_asset_events_carry_the_figures_of_dagsters_materializations(first_runs):
    story, airflow = first_runs, first_runs.airflow
    dagster = story.first["dagster"]
    for name in ("enriched_transactions", "suspicious_transactions"):
        compare_figures(latest_extra(airflow, name), dagster[name])
    extra = latest_extra(airflow, "enriched_transactions")
    assert extra["buffered"] > 0  # records wait: for FX, and for unknown customers' profiles
    waiting = extra["not_ready"]["fx"]
    assert any("has no asset event yet" in reason for reason in waiting.values()), waiting
    # No rows written, no event (Dagster materialized the created, empty tables).
    assert not [e for e in airflow.events("late_transactions") if e.get("source_task_id")]
    assert not [e for e in airflow.events("unmatched_transactions") if e.get("source_task_id")]


@pytest.mark.extended  # tier 3: Airflow's one default run is first_runs'
def test_a_side_input_materialized_later_releases_the_waiting_records(released):
    story, airflow = released, released.airflow
    runs = story.release["runs"]
    assert any(r["run_type"] == "asset_triggered" and r["state"] == "success" for r in runs)
    assert story.release["tables"] == story.release["dagster_tables"]
    extra = latest_extra(airflow, "enriched_transactions")
    compare_figures(extra, story.release["dagster"]["enriched_transactions"])
    assert extra["from_buffer"] > 0
    print(json.dumps({k: round(v, 1) for k, v in story.seconds.items()}))  # -rP: run times


def test_a_task_sigkilled_mid_batch_and_retried_by_airflow_is_exact(first_runs):
    story, airflow = first_runs, first_runs.airflow
    run = story.first["kill"]
    assert run["state"] == "success", airflow.tail()
    tries = airflow.task_tries("payments_kill", run["dag_run_id"])
    states = [(t["try_number"], t["state"]) for t in tries]
    last = airflow.task_log("payments_kill", run["dag_run_id"], tries[-1]["try_number"])
    assert (story.lakes["D"].parent / "killed").exists(), (states, last[-40:])  # it was reached
    assert states == [(1, "failed"), (2, "success")], (states, last[-40:])
    assert outputs(story.lakes["K"]) == story.first["dagster_tables"]


def test_a_failed_batch_fails_the_task_with_the_errors_text_first(first_runs):
    story, airflow = first_runs, first_runs.airflow
    run = story.first["error"]
    assert run["state"] == "failed"
    lines = airflow.task_log("payments_error", run["dag_run_id"], 1)
    # Error lines of the task's loggers (the JVM's and pyspark's stderr are logged at
    # error level too).
    errors = [
        line
        for line in lines
        if line.get("level") == "error" and line.get("logger") != "task.stderr"
    ]
    assert errors, lines
    first = errors[0]["event"]
    assert first.startswith("FunctionError: "), errors
    assert errors[1]["event"] == "Task failed with exception", errors  # Airflow's, after
    for part in ("'enriched_transactions'", "no_such_column", "Nothing was written", "Fix: "):
        assert part in first, first


def test_the_provider_is_registered_and_imports_no_dagster(first_runs):
    providers = first_runs.airflow.get("/providers")["providers"]
    assert "dagster-sideinputs" in {p["package_name"] for p in providers}
    check = (
        "import sys; import dagster_sideinputs.airflow as a; a.SideInputOperatorTask; "
        "import assets.airflow_dags.payments_enrichment; "
        "assert 'dagster' not in sys.modules, sorted(m for m in sys.modules if 'dagster.' in m)"
    )
    subprocess.run(
        [str(VENV / "bin" / "python"), "-c", check],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        timeout=120,
    )


def test_the_core_runs_without_airflow(first_runs, spark):
    """This venv (the dev venv) has no Airflow: the core runs the operator, and the
    provider's names say how to install it."""
    assert importlib.util.find_spec("airflow") is None
    lake = first_runs.lakes["D"].parent / "lake-core"
    copy_tables(first_runs.lakes["D"], lake, INPUTS)
    from assets.payments_operator import TRANSACTIONS, declarations
    from assets.payments_operator import payments_enrichment as enrich

    op = dsi.SideInputOperator(
        main=TRANSACTIONS, fn=enrich, storage=dsi.DeltaStorage(str(lake)), **declarations()
    )
    result = op.run(spark, trigger="available_now")
    assert result.records_processed == 700
    assert all(b.accounted for b in result.batches)
    assert "airflow" not in sys.modules
    import dagster_sideinputs.airflow as provider

    with pytest.raises(dsi.DeclarationError, match=r"dagster-sideinputs\[airflow\]"):
        provider.SideInputOperatorTask  # noqa: B018


def test_airflow_shows_the_asset_graph(first_runs, tmp_path):
    """A screenshot of Airflow's asset graph (docs/airflow_asset_graph.png with
    DSI_UPDATE_SCREENSHOTS=1)."""
    from tests.dagster_layer.test_browser import CHROMIUM, FLAGS, VIEWPORT

    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: run `bash .ci/chromium.sh`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    airflow = first_runs.airflow
    target = REPO / "docs" if os.environ.get("DSI_UPDATE_SCREENSHOTS") else tmp_path
    shot = target / "airflow_asset_graph.png"
    profile = tempfile.mkdtemp(prefix="dsi-chromium-")
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile, executable_path=str(CHROMIUM), headless=True, args=FLAGS,
                viewport=VIEWPORT,
            )  # fmt: skip
            context.set_default_timeout(60_000)
            page = context.new_page()
            page.goto(f"{airflow.url}/assets/{airflow.asset_id('enriched_transactions')}")
            page.wait_for_load_state("networkidle")
            page.get_by_text("payments_enrichment").first.wait_for()
            page.get_by_text("fx_rates").first.wait_for()
            page.screenshot(path=shot)
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert shot.stat().st_size > 20_000, f"{shot} looks empty"


@dataclass(frozen=True)
class Event:
    """An asset event as the task reads it (``AssetEventResult``'s fields it uses)."""

    timestamp: dt.datetime
    partition_key: str | None = None


def test_airflow_readiness_decides_from_asset_events(tmp_path):
    """Events, their partitions and their age decide; no table, no readiness (the rules
    the module's Airflow runs do not all reach: a stale side input, a missing table)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from dagster_sideinputs.airflow.readiness import AirflowReadiness
    from dagster_sideinputs.core.sideinputs.readiness import SideFacts

    write_deltalake(str(tmp_path / "rules"), pa.table({"x": [1]}))
    snapshot = dsi.DeltaStorage(str(tmp_path)).delta.snapshot(str(tmp_path / "rules"))
    now = dt.datetime(2026, 5, 1, 12, 30, tzinfo=dt.timezone.utc)
    events = {
        "rules": [Event(now - dt.timedelta(hours=13)), Event(now - dt.timedelta(hours=2))],
        "fx": [Event(now, partition_key="2026-05-01T11:00:00")],
        "profile": [],
    }
    readiness = AirflowReadiness(
        lambda name: events[name],
        {"rules": "fraud_rules", "fx": "fx_rates", "profile": "customer_profiles"},
        max_age={"rules": dt.timedelta(hours=12)},
    )
    rules = dsi.SideInput.singleton("fraud_rules")
    fx = dsi.SideInput.map(
        "fx_rates",
        key="currency",
        window=dsi.Window.tumbling(dt.timedelta(hours=1), time_column="ts"),
    )
    profile = dsi.SideInput.map("customer_profiles", key="customer_id")

    def decide(name, side, windows, when=now, table=snapshot):
        return readiness.decide(SideFacts(name, side, table), windows, when)

    fresh = decide("rules", rules, None)["global"]
    assert fresh.ready, fresh
    assert "fresh: last asset event 2 hours ago" in fresh.reason
    stale = decide("rules", rules, None, when=now + dt.timedelta(hours=11))["global"]
    assert not stale.ready
    assert "stale" in stale.reason
    hour = dt.timedelta(hours=1)
    eleven = dt.datetime(2026, 5, 1, 11, tzinfo=dt.timezone.utc)
    windows = [(eleven, eleven + hour), (eleven + hour, eleven + 2 * hour)]
    decided = decide("fx", fx, windows)
    assert [d.ready for d in decided.values()] == [True, False], decided
    assert "partition 2026-05-01T12:00:00 of asset 'fx_rates' has no asset event" in str(decided)
    none = decide("profile", profile, None)["global"]
    assert not none.ready
    assert "has no asset event yet" in none.reason
    no_table = decide("rules", rules, None, table=None)["global"]
    assert not no_table.ready
    assert "no Delta table yet" in no_table.reason
