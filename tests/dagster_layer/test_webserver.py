"""The example code location behind a real ``dagster-webserver``, driven as the UI drives it.

The story (tests/dagster_layer/conftest.py) is what a new user does: materialize the
inputs, run the operator, let the missing side data arrive and run it again, run it with
nothing to do, replay, execute the checks on their own, and a continuous run terminated
from the UI. The tests read back what the UI shows: lineage, tags and kinds, asset
metadata, materializations and observations, check executions and run logs.
"""

import time
from pathlib import Path

import pytest

from dagster_sideinputs.dagster_layer.figures import GLOSSARY, ROUTES
from tests.dagster_layer.conftest import MAIN_OUTPUT, Story, transactions_config
from tests.dagster_layer.webserver import ASSET_JOB, ASSET_NODES, TERMINATE, Webserver

pytestmark = [pytest.mark.webserver, pytest.mark.slow]

OUTPUTS = [
    "enriched_transactions",
    "suspicious_transactions",
    "unmatched_transactions",
    "late_transactions",
]
SIDE_INPUTS = ["customer_profiles", "fx_rates", "fraud_rules"]
INPUTS = ["transactions", *SIDE_INPUTS]
RECORD_FIGURES = ["new_records", "from_buffer", "records_processed", *ROUTES]
STOP_TIMEOUT_S = 90
# Dagster's own labels, documented by Dagster.
DAGSTER_LABELS = {"dagster/uri", "dagster/column_schema"}


def nodes(server: Webserver) -> dict[str, dict]:
    return {n["assetKey"]["path"][-1]: n for n in server.query(ASSET_NODES)["assetNodes"]}


def definition_metadata(node: dict) -> dict[str, str]:
    return {e["label"]: e.get("text") or e.get("mdStr") for e in node["metadataEntries"]}


def figures(values: dict) -> dict[str, int]:
    return {name: values[name] for name in RECORD_FIGURES}


def test_lineage_shows_every_output_depending_on_the_main_and_the_side_inputs(webserver):
    graph = nodes(webserver)
    for output in OUTPUTS:
        assert {k["path"][-1] for k in graph[output]["dependencyKeys"]} == set(INPUTS), output
    for source in INPUTS:
        assert {k["path"][-1] for k in graph[source]["dependedByKeys"]} == set(OUTPUTS), source


def test_roles_are_visible_as_kinds_tags_and_readable_side_input_descriptions(webserver):
    graph = nodes(webserver)
    roles = {
        name: {t["key"]: t["value"] for t in graph[name]["tags"]}["dsi/role"] for name in graph
    }
    assert roles == {
        "transactions": "main_input",
        "customer_profiles": "side_input",
        "fx_rates": "side_input",
        "fraud_rules": "side_input",
        "enriched_transactions": "main_output",
        "suspicious_transactions": "side_output",
        "unmatched_transactions": "unmatched_output",
        "late_transactions": "late_output",
    }
    assert "main_input" in graph["transactions"]["kinds"]
    for side in SIDE_INPUTS:
        assert "side_input" in graph[side]["kinds"], side

    for output in OUTPUTS:
        meta = definition_metadata(graph[output])
        assert meta["dsi/main_input"].startswith("transactions: new Delta versions")
        assert meta["dsi/side_input/profile"] == (
            "profile: map of customer_profiles (one row per key); key customer_id joined on "
            "transactions.customer_id; ready once materialized, and while its asset's "
            "FreshnessPolicy passes (if any); a record whose key has no row waits up to "
            "30 minutes, then is sent to unmatched_transactions"
        )
        assert "ready per window" in meta["dsi/side_input/fx"]
        assert "tumbling windows of 1 hour on ts" in meta["dsi/side_input/fx"]
        assert "| fx | side input | fx_rates |" in meta["dsi/inputs"]
        for text in meta.values():
            assert "datetime." not in text, text
            assert "SideInput." not in text, text
        assert "Main input: transactions." in graph[output]["description"]


def test_checks_are_listed_and_the_state_checks_can_be_executed_alone(webserver):
    checks = {
        c["name"]: c["canExecuteIndividually"]
        for c in nodes(webserver)[MAIN_OUTPUT]["assetChecksOrError"]["checks"]
    }
    assert checks == {
        "buffer_within_limits": "CAN_EXECUTE",
        "side_inputs_ready": "CAN_EXECUTE",
        # It checks what a run of the operator did: it runs with the operator.
        "records_accounted_for": "REQUIRES_MATERIALIZATION",
    }


def test_first_run_figures_agree_in_materialization_check_and_log(story: Story):
    server, run_id = story.server, story.runs["first"]
    [materialization] = server.materializations(MAIN_OUTPUT, run_id)
    meta = materialization["values"]
    check = server.check_execution(MAIN_OUTPUT, "records_accounted_for", run_id)
    assert check["success"]
    assert figures(check["values"]) == figures(meta)
    # 500 of this hour and 200 of the previous one, whose FX partition is missing.
    assert meta["new_records"] == 700
    assert meta["from_buffer"] == 0
    assert meta["records_processed"] == sum(meta[route] for route in ROUTES) == 700
    assert meta["buffered"] >= 200  # the previous hour, and unknown customers
    assert meta["buffered_rows"] == meta["buffered"]
    assert meta["rows_written"] == meta["released"] == meta["dagster/row_count"]
    assert meta["throughput_records_per_s"] > 0
    buffer = server.check_execution(MAIN_OUTPUT, "buffer_within_limits", run_id)
    assert buffer["values"]["buffered_rows"] == meta["buffered_rows"]
    ready = server.check_execution(MAIN_OUTPUT, "side_inputs_ready", run_id)
    assert not ready["success"]
    assert "not materialized yet" in ready["description"]
    messages = [e.get("message") or "" for e in server.logs(run_id)]
    line = (
        f"new_records={meta['new_records']} from_buffer=0 -> released={meta['released']} "
        f"buffered={meta['buffered']} late=0 unmatched=0; buffered_rows={meta['buffered_rows']}"
    )
    assert any(line in message for message in messages), messages
    # Every label is defined once, in the glossary docs/operations.md repeats.
    assert set(meta) - DAGSTER_LABELS <= set(GLOSSARY)
    assert set(check["values"]) <= set(GLOSSARY)
    # The main input's appends: what each added, next to the table's total.
    appends = [m["values"] for m in server.materializations("transactions")]
    totals = {(a["rows_written"], a["dagster/row_count"]) for a in appends}
    assert {(500, 500), (200, 700)} <= totals


def test_run_releasing_buffered_records_reports_them_alike_everywhere(story: Story):
    server = story.server
    first = server.materializations(MAIN_OUTPUT, story.runs["first"])[0]["values"]
    run_id = story.runs["release"]
    [materialization] = server.materializations(MAIN_OUTPUT, run_id)
    meta = materialization["values"]
    check = server.check_execution(MAIN_OUTPUT, "records_accounted_for", run_id)
    assert figures(check["values"]) == figures(meta)
    assert meta["new_records"] == 0
    assert meta["from_buffer"] == meta["released"] == meta["records_processed"]
    assert meta["from_buffer"] == first["buffered_rows"]
    assert meta["buffered_rows"] == 0
    assert meta["throughput_records_per_s"] > 0  # released records count
    assert meta["dagster/row_count"] == first["dagster/row_count"] + meta["rows_written"]
    for output in ("late_transactions", "unmatched_transactions"):
        assert server.materializations(output, run_id) == [], output
        [observation] = server.observations(output, run_id)
        assert observation["values"]["rows_written"] == 0
        assert figures(observation["values"]) == figures(meta)


def test_run_with_nothing_to_do_materializes_nothing(story: Story):
    server, run_id = story.server, story.runs["idle"]
    for output in OUTPUTS:
        assert server.materializations(output, run_id) == [], output
        [observation] = server.observations(output, run_id)
        assert observation["values"]["batches"] == 0
        assert "nothing written" in observation["description"]
    check = server.check_execution(MAIN_OUTPUT, "records_accounted_for", run_id)
    assert check["success"]
    assert check["values"]["records_processed"] == 0


def test_replay_materializes_only_what_it_writes(story: Story):
    server, run_id = story.server, story.runs["replay"]
    for output in ("late_transactions", "unmatched_transactions"):
        assert server.materializations(output, run_id) == [], output
        assert server.observations(output, run_id), output


def test_state_checks_executed_alone_run_without_the_operator(story: Story):
    server, run_id = story.server, story.runs["checks"]
    for output in OUTPUTS:
        assert server.materializations(output, run_id) == [], output
    ready = server.check_execution(MAIN_OUTPUT, "side_inputs_ready", run_id)
    assert ready["success"], ready["description"]
    buffer = server.check_execution(MAIN_OUTPUT, "buffer_within_limits", run_id)
    assert buffer["success"]
    assert buffer["values"]["buffered_rows"] == 0
    accounted = server.check_executions(MAIN_OUTPUT, "records_accounted_for")
    assert run_id not in {e["runId"] for e in accounted}  # only the two selected ran


def test_terminate_button_stops_continuous_run_cleanly_after_a_complete_micro_batch(story: Story):
    server = story.server
    state = server.lake / "_sideinputs" / MAIN_OUTPUT
    before = _batch_ids(state / "commits")
    # New main input, so the continuous run has a micro-batch to do whatever ran before.
    server.run(ASSET_JOB, ["transactions"], run_config=transactions_config(100, unknown=0))
    run_id = server.launch("payments_enrichment_continuous_job")
    server.wait_for_micro_batch(run_id, MAIN_OUTPUT)
    # More main input, and the stop asked for while the run works on it: the batch in
    # flight commits, and must reach Dagster too (before: committed, never reported).
    planned = _batch_ids(state / "plans")
    server.run(ASSET_JOB, ["transactions"], run_config=transactions_config(100, unknown=0))
    deadline = time.monotonic() + 60
    while _batch_ids(state / "plans") == planned and time.monotonic() < deadline:
        time.sleep(0.05)

    answer = server.query(TERMINATE, runIds=[run_id], terminatePolicy="SAFE_TERMINATE")
    [result] = answer["terminateRuns"]["terminateRunResults"]
    assert result["__typename"] == "TerminateRunSuccess", result
    # A requested stop is a clean stop: the step and the run succeed.
    server.wait_for_run(run_id, "SUCCESS", STOP_TIMEOUT_S)

    committed = _batch_ids(state / "commits") - before
    assert len(committed) >= 2
    assert _files(state / "plans") == _files(state / "commits")
    reported = {
        int(m["description"].split()[1].rstrip(":"))
        for m in server.materializations(MAIN_OUTPUT, run_id)
        if (m["description"] or "").startswith("micro-batch ")
    }
    assert reported == committed
    # Each micro-batch materialized only what it wrote: late and unmatched got nothing.
    for output in ("late_transactions", "unmatched_transactions"):
        assert server.materializations(output, run_id) == [], output
    # No failed step, no interrupt's stack trace (before: a red STEP_FAILURE
    # KeyboardInterrupt from PySpark's signal handler); the log names the last batch.
    events = server.logs(run_id)
    assert not [e for e in events if e["__typename"] == "ExecutionStepFailureEvent"]
    assert not [e for e in events if e.get("error")], server.run_errors(run_id)
    messages = [e.get("message") or "" for e in events]
    assert f"Stopped after micro-batch {max(committed)}." in messages


def _batch_ids(folder: Path) -> set[int]:
    """The batch ids of a state folder's records (``<batch id>.json``)."""
    if not folder.exists():
        return set()
    return {int(p.stem) for p in folder.iterdir() if p.suffix == ".json" and p.stem.isdigit()}


def _files(folder: Path) -> int:
    return len(list(folder.iterdir())) if folder.exists() else 0
