"""The project on a Spark standalone cluster: a master and two workers of one core each,
every one its own process on 127.0.0.1, so executors are other processes than the driver
(as on a real cluster) and nothing may rely on the driver's memory or Python objects.

Slow (minutes: two JVM daemons, executors, and the example pipeline twice), and part of
the default run and of CI. The pipeline runs in subprocesses (see ``tests/cluster.py``):
this test session already holds a ``local[2]`` SparkContext.
"""

from collections.abc import Iterator

import pytest

from resources import spark as example_spark
from tests.cluster import (
    StandaloneCluster,
    assert_demo_matches_local_run,
    check,
    run_operator_client,
    run_probe,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    work = tmp_path_factory.mktemp("standalone")
    with StandaloneCluster(work, workers=2, cores=1, memory="2g") as running:
        yield running


def test_cluster_has_two_alive_workers_of_one_core(cluster):
    state = cluster.state()
    assert state["aliveworkers"] == 2
    assert [w["cores"] for w in state["workers"]] == [1, 1]


@pytest.fixture(scope="module")
def cluster_probe(cluster, tmp_path_factory) -> dict:
    """A driver of the cluster (subprocess): where its tasks ran, its shuffle settings."""
    return run_probe(tmp_path_factory.mktemp("probe"), master=cluster.master_url)


@pytest.mark.extended  # tier 3: the default cluster run is client_report (below)
def test_tasks_run_in_executors_of_both_workers_never_in_the_driver(cluster, cluster_probe):
    report = cluster_probe
    workers = {process.pid for process in cluster.worker_processes}
    executors = set()
    for task in report["tasks"]:
        ancestors = {pid: command for pid, command in task["ancestors"]}
        assert task["pid"] != report["driver_pid"]
        assert report["driver_pid"] not in ancestors
        assert len(workers & set(ancestors)) == 1
        [executor] = [p for p, c in ancestors.items() if "CoarseGrainedExecutorBackend" in c]
        executors.add(executor)
        assert task["cwd"].startswith(str(cluster.work))
    assert len(executors) == 2


@pytest.mark.extended  # tier 3: the default cluster run is client_report (below)
def test_shuffle_partitions_follow_the_cluster_cores(cluster_probe):
    """A session built for a cluster without a partition count gets two per executor core
    (as a local master does) when the operator fits them before a batch."""
    shuffle = cluster_probe["shuffle"]
    assert shuffle["follows"] == "cores"
    assert shuffle["cores"] == 2  # two workers of one core, all registered
    assert shuffle["fitted"] == max(4, 2 * shuffle["cores"])
    assert shuffle["partitions"] == str(shuffle["fitted"])


@pytest.mark.extended  # CI's time: the contrast of the test above
def test_tasks_run_under_the_driver_process_on_a_local_master(tmp_path):
    # The control of the test above: the same probe sees the driver on local[2].
    report = run_probe(tmp_path, master="local[2]")
    assert report["shuffle"] == {"follows": None, "fitted": None, "partitions": "4", "cores": 2}
    assert report["tasks"]
    for task in report["tasks"]:
        assert report["driver_pid"] in {pid for pid, _ in task["ancestors"]}


@pytest.fixture(scope="module")
def client_report(cluster, tmp_path_factory) -> dict:
    """What ``tests/operator_client.py`` found, as a driver of the cluster."""
    return run_operator_client(tmp_path_factory.mktemp("cluster-client"), master=cluster.master_url)


def test_frames_mode_operator_on_the_cluster_enriches_and_splits(client_report):
    expected = check(client_report, "inputs")
    assert check(client_report, "frames_mode") == {
        "engine": client_report["engine"],
        "enriched": 200,
        "big": expected["big"],
        "named": expected["named"],
        "plan_recorded": True,
        "second_run_batches": 0,
    }


def test_rows_mode_ships_the_row_function_to_the_executors(client_report):
    # The function is defined in the client script (__main__): pickled by value.
    expected = check(client_report, "inputs")
    # Two outputs of the same fields, tables on the filesystem every process shares: the
    # executors write both in one pass and the driver renames the files, then commits
    # them (delta-rs, or Delta's transaction on this classic session).
    wanted = {"rows": 200, "named": expected["named"], "big": expected["big"]}
    assert check(client_report, "rows_mode") == {**wanted, "one_pass": True}
    assert check(client_report, "rows_mode_bridge") == {**wanted, "one_pass": True}


def test_row_function_executors_cannot_import_is_a_declaration_error_naming_its_module(
    client_report,
):
    outcome = client_report["rows_mode_module_function"]
    assert not outcome["ok"]
    assert outcome["error"] == "DeclarationError"
    assert "module 'tests'" in outcome["message"]
    assert "tests.operator_client.name_row" in outcome["message"]
    assert "addPyFile" in outcome["message"]


def test_pre_keyed_main_input_is_read_as_buckets_by_the_executors(client_report):
    value = check(client_report, "pre_keyed")
    assert value["rows"] == 200
    assert "pre-keyed: main files read as buckets (no shuffle)" in value["notes"]
    assert value["both_rows"] == 200
    assert "side input 'profile': read as key-group buckets (no shuffle)" in value["both_notes"]


def test_delta_source_is_read_by_the_executors_python_workers(client_report):
    assert check(client_report, "delta_source") == {"batch": 200, "stream": 200}


@pytest.mark.extended  # the Connect and Kafka demo tests compare the same local run
def test_payments_pipeline_on_the_cluster_writes_what_a_local_run_writes(
    cluster, tmp_path, tmp_path_factory
):
    assert_demo_matches_local_run(
        tmp_path / "cluster-run", tmp_path_factory, master=cluster.master_url
    )

    [app] = cluster.applications(example_spark.app_name)
    assert app["state"] == "FINISHED"
    assert app["cores"] == 2
    per_worker = [
        [e for e in worker["finishedexecutors"] if e["appid"] == app["id"]]
        for worker in cluster.worker_states()
    ]
    # Both workers ran executors of the app (a lost executor is replaced by Spark, and
    # the outputs above stay equal: on a loaded machine one worker may run two).
    assert all(per_worker), [len(executors) for executors in per_worker]
    for index in range(cluster.workers):
        logs = sorted((cluster.worker_dir(index) / app["id"]).glob("*/stderr"))
        assert any("Finished task" in log.read_text(errors="replace") for log in logs), index
