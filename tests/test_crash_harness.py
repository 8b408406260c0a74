"""The example pipeline killed with SIGKILL at random points and rerun gives exactly the
tables of a run without faults (the CI-sized version of ``bench/crash_harness.py``), with
its lake on the local filesystem and on the S3 test server.

Workers are subprocesses with their own Dagster instance, lake and JVM; event times are
fixed and the side inputs are materialized when the template is made, so nothing here
depends on the hour of the wall clock.

On S3 the workers run the example code location as a deployment would: ``DSI_LAKE_ROOT``
is an ``s3a://`` prefix and the store's endpoint and credentials are ``AWS_*``
environment variables (known fake ones, with a session token), which the example's
resources pass to the IO manager as ``dg.EnvVar``. The reference run is then the example
pipeline end to end through Dagster on S3, and the secrets test greps everything it left
behind for those credentials.
"""

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import crash_harness as harness
from tests.servers.s3 import REGION, S3Server

pytestmark = [pytest.mark.slow, pytest.mark.crash_harness]

SEEDS = (11,)  # CI-sized: `make crash` runs 30 trials at every kill point
S3_SEED = 21

# Known fake credentials (moto accepts any): nothing the pipeline leaves may contain them.
FAKE_ACCESS_KEY = f"AKIAFAKE{uuid.uuid4().hex[:12].upper()}"
FAKE_SECRET_KEY = f"fake-secret-{uuid.uuid4().hex}"
FAKE_SESSION_TOKEN = f"fake-session-token-{uuid.uuid4().hex}"
SECRETS = (FAKE_ACCESS_KEY, FAKE_SECRET_KEY, FAKE_SESSION_TOKEN)

Prepared = tuple[harness.Template, harness.Reference, Path]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[harness.Template, Path]:
    root = tmp_path_factory.mktemp("crash")
    return harness.prepare_template(root / "template", script="short"), root


@pytest.fixture(scope="module")
def prepared(template) -> tuple[harness.Template, harness.Reference, Path]:
    made, root = template
    return made, harness.reference_tables(made, root / "reference"), root


@pytest.fixture(scope="module")
def s3_environment(s3_server: S3Server) -> Iterator[None]:
    """The workers' (and the harness's own) view of the S3 server: AWS_* variables."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            "AWS_ENDPOINT_URL": s3_server.endpoint_url,
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
            "AWS_SESSION_TOKEN": FAKE_SESSION_TOKEN,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def prepared_s3(s3_server, s3_environment, tmp_path_factory) -> Prepared:
    root = tmp_path_factory.mktemp("crash-s3")
    lake = s3_server.fresh_prefix("crash").replace("s3://", "s3a://", 1)
    template = harness.prepare_template(root / "template", script="short", lake=lake)
    reference = harness.reference_tables(template, root / "reference")
    return template, reference, root


def check_reference(reference: harness.Reference) -> None:
    counts = {name: len(rows or []) for name, rows in reference.tables.items()}
    assert counts["transactions"] == 800
    for name in (
        "enriched_transactions",
        "suspicious_transactions",
        "buffer:enriched_transactions",
    ):
        assert counts[name] > 0, counts
    assert reference.batches == {"enriched_transactions": 2}


# The default suite's crash-harness run (tier 3: one per suite): the example pipeline on a
# local lake under the engine users get (delta-spark: the workers' ``auto``), killed after
# batch 0's first table commit. The random kills, the bridge's kill points and the S3 runs
# are ``make test-extended``'s (and ``make crash``'s).
def test_reference_run_fills_every_output_and_the_buffer(prepared):
    check_reference(prepared[1])


def killed_after_the_first_table_under_delta_spark(
    template: harness.Template, reference: harness.Reference, path: Path, number: int
) -> None:
    """A trial killed after batch 0's first table committed through delta-spark, then run
    again: the tables equal the reference run's, and every commit is delta-spark's."""
    result = harness.run_targeted_trial(
        template, reference, "after-first-table-spark", path, number=number
    )
    assert result.ok, result.line()
    assert result.kills, result.line()
    engines = {
        action["commitInfo"].get("engineInfo", "")
        for action in harness.lake_of(path).log_actions("enriched_transactions")
        if "commitInfo" in action
    }
    assert engines
    assert all("Delta-Lake/" in engine for engine in engines), engines


def test_sigkill_after_the_first_table_under_delta_spark_then_rerun_is_exact(prepared):
    """Killed (SIGKILL of the worker's process group) after batch 0's first table
    committed through delta-spark, then run again."""
    template, reference, root = prepared
    path = root / "trial-spark"
    killed_after_the_first_table_under_delta_spark(template, reference, path, number=1)


@pytest.mark.extended
def test_sigkill_at_random_points_then_rerun_loses_and_duplicates_nothing(prepared):
    template, reference, root = prepared
    results = [
        harness.run_trial(template, reference, seed, root / f"trial-{seed}", number=n, max_kills=1)
        for n, seed in enumerate(SEEDS, start=1)
    ]
    report = "\n".join(result.line() for result in results)
    print(report)  # where the kills landed (shown with -rP)
    assert all(result.ok for result in results), report
    assert sum(len(result.kills) for result in results) >= 1, report


# Extended (CI's time): the in-process crash points of tests/core/test_crash_safety.py
# stop after each write, the moves into a new table included.
@pytest.mark.extended
def test_sigkill_after_files_moved_into_a_new_table_before_its_commit_then_rerun_recovers(prepared):
    """A kill point of the bridge's writer: the trial runs under the bridge."""
    template, reference, root = prepared
    result = harness.run_targeted_trial(
        template, reference, "before-create-enriched", root / "trial-create"
    )
    assert result.ok, result.line()


# --- the same on the S3 test server ---------------------------------------------------------


@pytest.mark.s3
@pytest.mark.extended
def test_on_s3_the_example_pipeline_fills_every_output_and_the_buffer(prepared_s3):
    check_reference(prepared_s3[1])
    assert harness.lake_of(prepared_s3[0].path).root.startswith("s3://")


@pytest.mark.s3
@pytest.mark.extended
def test_on_s3_the_example_pipeline_gives_the_tables_of_a_local_run(prepared, prepared_s3):
    """The example end to end through Dagster on S3 (the reference run) writes exactly
    the rows a local run writes."""
    _, reference_s3, _ = prepared_s3
    check_reference(reference_s3)
    assert reference_s3.tables == prepared[1].tables
    assert harness.lake_of(prepared_s3[0].path).root.startswith("s3://")


@pytest.mark.s3
@pytest.mark.extended
def test_on_s3_sigkill_while_files_move_then_rerun_loses_and_duplicates_nothing(prepared_s3):
    """A kill while a write moves its staged files into the table: on S3 a move is a copy
    and a delete per file, so the kill can leave some moved. (Random kills run on the
    local lake above; they take the same code paths on S3 but the moves.)"""
    template, reference, root = prepared_s3
    result = harness.run_targeted_trial(
        template, reference, "before-publish-1", root / "trial-publish", number=1
    )
    assert result.ok, result.line()
    assert result.kills, result.line()


@pytest.mark.s3
@pytest.mark.extended
def test_on_s3_under_delta_spark_sigkill_after_the_first_table_then_rerun_is_exact(
    prepared_s3,
):
    """The same pipeline on S3 with delta-spark as the workers' engine (Spark commits
    through s3a, the operator's plans, claims and lock on the same store): killed after
    batch 0's first table commit, rerun, equal to the reference run, and no trace of the
    fake credentials (delta-spark had them as s3a settings) in its output, Dagster
    instance or lake. The template and the reference are those of the tests above, so
    only this trial is added."""
    template, reference, root = prepared_s3
    path = root / "trial-spark"
    killed_after_the_first_table_under_delta_spark(template, reference, path, number=2)
    # delta-spark got the store's keys as s3a settings: none of them was left behind.
    found, searched, objects = secrets_left(path)
    assert not found, found
    assert searched["local"] > 0
    assert searched["s3"] == len(objects) > 0


def secrets_left(trial: Path, *more: Path) -> tuple[list[str], dict[str, int], list[str]]:
    """Where the fake credentials occur in a trial's folders (worker output, Dagster
    instance) and in every object of its lake: (findings, files searched per place, the
    lake's objects)."""
    searched: dict[str, int] = {}
    found: list[str] = []

    def search(where: str, data: bytes) -> None:
        searched[where.split(":", 1)[0]] = searched.get(where.split(":", 1)[0], 0) + 1
        found.extend(f"{where} holds {s[:12]}..." for s in SECRETS if s.encode() in data)

    for folder in (trial, *more):
        for directory, _, names in os.walk(folder):
            for name in names:
                path = Path(directory, name)
                search(f"local:{path}", path.read_bytes())
    lake = harness.lake_of(trial)
    files = lake.files()
    entries = lake.entries()
    for entry in entries:
        search(f"s3:{entry.path}", files.read_bytes(entry.path))
    return found, searched, [entry.path for entry in entries]


@pytest.mark.s3
@pytest.mark.extended
def test_on_s3_no_credential_reaches_logs_state_tables_or_dagster(prepared_s3, s3_server):
    """After the reference run with known fake credentials: no trace of them in the
    workers' output (Spark, py4j, Dagster logs), the Dagster instance (runs, event logs
    with every metadata value, compute logs), or any object of the lake (plans, commit
    records, operator.json, the lock, Delta logs and their commit metadata, data)."""
    template, _, root = prepared_s3
    reference = root / "reference"
    found, searched, objects = secrets_left(reference, template.path)
    assert not found, found
    # The search covered what it claims to: outputs, Dagster's storage, the lake's state.
    assert any(p.endswith("/_delta_log/00000000000000000000.json") for p in objects)
    assert any("/plans/" in p for p in objects)
    assert any("/commits/" in p for p in objects)
    assert any(p.endswith("/lock") for p in objects)
    assert searched["local"] > 0
    assert searched["s3"] == len(objects)
    outputs = list(reference.glob("worker-*.out"))
    assert outputs
    assert any(b"payments_enrichment_job" in p.read_bytes() for p in outputs)
    assert any(reference.glob("dagster_home/**/*.db"))


# Extended (CI's time: its own reference run and a killed trial, ~2 minutes): a replayed
# batch keeping the side versions of its plan is tested in process by
# tests/core/test_semantics.py::test_replayed_batch_plan_pins_side_versions.
@pytest.mark.extended
@pytest.mark.parametrize(
    ("kill_point", "script", "replanned"),
    [
        # The kill comes after the plan's claim (made before the first commit): the
        # batch is replayed with the side versions it planned with. A plan given up
        # before its claim is planned again (tests/core/test_recovery.py); a kill
        # before any table is tested above (files moved, before its commit).
        ("after-first-table", "short-change-after", False),
    ],
    ids=["replayed"],
)
def test_sigkill_then_a_side_input_changed_before_the_rerun_is_exact(
    template, kill_point, script, replanned
):
    """Killed after batch 0's plan (before any table, or after the first one), then 25
    customer profiles added, then rerun: a batch no table committed is planned again and
    sees the new profiles (equal to a run that changed them before the job); one some
    table committed is replayed with the profiles it planned with, and the next batch
    sees the change (equal to a run that changed them after the job)."""
    made, root = template
    reference = harness.reference_tables(made, root / f"reference-{script}", script)
    result, how = harness.run_side_change_trial(
        made, reference, kill_point, root / f"trial-change-{kill_point}"
    )
    print(result.line())
    assert result.ok, result.line()
    assert how is not None
    assert how.replanned == replanned, how
    expected = harness.plan_path(root / f"reference-{script}").profiles_version
    assert how.profiles_version == expected, how
    if replanned:
        assert how.template_version is not None
        assert how.profiles_version > how.template_version, how


def test_each_kill_point_runs_under_the_engine_whose_code_holds_it():
    """A kill point in the staging both engines share lands under either on a local lake;
    on an object store only the bridge moves staged files (delta-spark writes through
    Delta's writer there), so its trials run under the bridge."""
    assert harness.kill_point_engine("before-publish-1") is None
    assert harness.kill_point_engine("before-publish-1", local=False) == "delta-rs"
    assert harness.kill_point_engine("after-first-table") == "delta-rs"
    assert harness.kill_point_engine("after-first-table-spark", local=False) == "delta-spark"
    assert harness.kill_point_engine("before-first-plan", local=False) is None
