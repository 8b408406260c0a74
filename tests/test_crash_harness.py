"""The example pipeline killed with SIGKILL at random points and rerun gives exactly the
tables of a run without faults (the CI-sized version of ``bench/crash_harness.py``).

Workers are subprocesses with their own Dagster instance, lake and JVM; event times are
fixed and the side inputs are materialized when the template is made, so nothing here
depends on the hour of the wall clock.
"""

from pathlib import Path

import pytest

from bench import crash_harness as harness

pytestmark = pytest.mark.slow

SEEDS = (11, 12, 13)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[harness.Template, Path]:
    root = tmp_path_factory.mktemp("crash")
    return harness.prepare_template(root / "template", script="short"), root


@pytest.fixture(scope="module")
def prepared(template) -> tuple[harness.Template, harness.Reference, Path]:
    made, root = template
    return made, harness.reference_tables(made, root / "reference"), root


def test_reference_run_fills_every_output_and_the_buffer(prepared):
    _, reference, _ = prepared
    counts = {name: len(rows or []) for name, rows in reference.tables.items()}
    assert counts["transactions"] == 800
    for name in (
        "enriched_transactions",
        "suspicious_transactions",
        "buffer:enriched_transactions",
    ):
        assert counts[name] > 0, counts
    assert reference.batches == {"enriched_transactions": 2}


def test_sigkill_at_random_points_then_rerun_loses_and_duplicates_nothing(prepared):
    template, reference, root = prepared
    results = [
        harness.run_trial(template, reference, seed, root / f"trial-{seed}", number=n, max_kills=1)
        for n, seed in enumerate(SEEDS, start=1)
    ]
    report = "\n".join(result.line() for result in results)
    print(report)  # where the kills landed (shown with -rP)
    assert all(result.ok for result in results), report
    assert sum(len(result.kills) for result in results) >= 2, report


def test_sigkill_after_files_moved_into_a_new_table_before_its_commit_then_rerun_recovers(prepared):
    template, reference, root = prepared
    result = harness.run_targeted_trial(
        template, reference, "before-create-enriched", root / "trial-create"
    )
    assert result.ok, result.line()


@pytest.mark.parametrize(
    ("kill_point", "script", "replanned"),
    [
        ("before-create-enriched", "short-change-first", True),
        ("after-first-table", "short-change-after", False),
    ],
    ids=["planned-again", "replayed"],
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
