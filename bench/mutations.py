"""Mutation check: deliberate bugs in the code that carries the guarantees, and which
test catches each one (issue 39, "Prove nothing was lost").

    python bench/mutations.py --list                      # the mutations
    python bench/mutations.py --check                     # every patch applies (no tests)
    python bench/mutations.py --rev HEAD --out after.json --compare bench/mutations-before.json
    python bench/mutations.py --rev f6fb2ad --only null_key_check_dropped,local_lock_shared

Each mutation is a small exact-text patch of one file (its old text must occur there
exactly once) with the guarantee it breaks and hints: test paths (globs, optionally with
``::test_name``) likely to catch it. For a revision of the repository (``--repo``,
default the one holding this script; ``--rev``, default HEAD) the runner exports a
scratch copy (``git archive`` into /tmp/dsi-mutations/<rev>/base), first runs every hint
on the unmutated copy (the baseline: a hint failing there is a pre-existing failure or a
flake, and is not used), then, one mutation at a time, copies the base, applies the patch,
checks the patched module still imports, and runs ``pytest -x`` on the hints that exist in
that copy (PYTHONPATH and cwd = the copy, this interpreter). With ``--full``, a mutation
the hints miss is run against the whole default suite (``-x``). The result per mutation
(caught, by which test, seconds) goes to ``--out`` as JSON and to a table.

After a change to the suite, rerun on the new revision and compare with the committed
list of the suite before it: ``--compare bench/mutations-before.json`` exits 1 unless
the same mutations are caught (``--load OLD.json --compare OTHER.json`` compares two
saved runs without running anything). ``--only A,B --update OLD.json --out NEW.json``
reruns a few mutations (e.g. after adding a test that catches one) and keeps the others'
results, each result naming its revision. Hints that no longer exist after a restructure
are skipped; pass ``--full`` so such a mutation still meets the whole suite.
"""

import argparse
import datetime as dt
import fnmatch
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = Path("/tmp/dsi-mutations")
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
"""Our own options: the project's addopts (``--durations=40``, ``-ra``) are replaced, but
its marker filter is kept (:data:`MARKERS`)."""
MARKERS = ["-rfE", "--strict-markers", "-m", "not extended"]
WORK = f"work-{os.getpid()}"
"""This process's mutated copy: runs with disjoint ``--only`` lists may share a revision
(e.g. two halves of the list at once, one per core)."""


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: ``old`` (exactly once in ``file``) becomes ``new``.
    ``moved_from``: the paths ``file`` had in older revisions (core/ before its folders),
    so that the same patch runs on the suite before a restructure."""

    name: str
    file: str
    old: str
    new: str
    breaks: str
    hints: tuple[str, ...]
    moved_from: tuple[str, ...] = ()

    def path_in(self, tree: Path) -> str:
        """The mutated file's path in ``tree``: ``file``, else where it was before."""
        for candidate in (self.file, *self.moved_from):
            if (tree / candidate).exists():
                return candidate
        return self.file


S = "tests/core/test_semantics.py::"
MUTATIONS: tuple[Mutation, ...] = (
    # --- exactly once: transactions, staging, recovery --------------------------------
    Mutation(
        "commit_without_app_transaction",
        "dagster_sideinputs/core/batch/write.py",
        "        app_transaction=txn,\n        remove_files=removed if target.removes_released",
        "        app_transaction=None,\n        remove_files=removed if target.removes_released",
        "every table commits with the batch's application transaction, so a replay skips "
        "the tables that hold it",
        (
            "tests/core/test_crash_safety.py::"
            "test_crash_after_any_write_then_rerun_gives_the_reference_tables[rs-1-1]",
        ),
    ),
    Mutation(
        "bridge_records_the_table_version_as_txn",
        "dagster_sideinputs/delta/bridge/log_commit.py",
        '"version": app_transaction.version,',
        '"version": state.version,',
        "the bridge's direct commit records the batch's application transaction (batch id)",
        (
            "tests/core/test_crash_safety.py::"
            "test_crash_after_any_write_then_rerun_gives_the_reference_tables[rs-1-1]",
        ),
    ),
    Mutation(
        "txn_check_spark_skipped",
        "dagster_sideinputs/delta/spark/commit.py",
        "return committed is not None and committed >= app_transaction.version",
        "return committed is not None and committed > app_transaction.version",
        "delta-spark commits nothing for an application transaction the table holds",
        (
            "tests/delta/test_delta_engines.py::test_a_commit_whose_transaction_the_table_holds_is_skipped_by_delta_spark",
        ),
    ),
    Mutation(
        "commit_before_staging_all",
        "dagster_sideinputs/core/batch/write.py",
        "        for target in pending:\n            staged.append(\n",
        "        for target in pending:\n"
        "            if staged and staged[-1][1] is not None:  # commit as we go\n"
        "                _commit(context, staged[-1][0], staged[-1][1], txn, {}, removed)\n"
        "            staged.append(\n",
        "a batch commits nothing until every table is staged (an error staging a later "
        "table leaves no table committed)",
        (
            "tests/core/test_bad_input_halfway.py::test_an_error_only_a_later_outputs_job_meets_commits_nothing",
        ),
    ),
    Mutation(
        "partly_committed_batch_planned_again",
        "dagster_sideinputs/core/state/recovery.py",
        "if version is not None and version >= batch_id:",
        "if version is not None and version > batch_id:",
        "a batch some table committed is replayed from its plan, not planned again",
        (
            "tests/core/test_state_identity.py::"
            "test_truncated_plan_of_a_batch_written_in_part_is_refused_then_restored",
        ),
    ),
    Mutation(
        "stale_side_version_on_replay",
        "dagster_sideinputs/core/batch/route.py",
        "else spec.engine.snapshot(bound.uri, version=version, name=bound.side.asset)",
        "else spec.engine.snapshot(bound.uri, name=bound.side.asset)",
        "a batch (and its replay) reads the side versions pinned in its plan",
        (
            "tests/core/test_state_identity.py::"
            "test_a_batch_written_in_part_is_replayed_with_the_side_version_it_planned_with",
        ),
    ),
    # --- invalid records, pre-keyed inputs --------------------------------------------
    Mutation(
        "null_key_check_dropped",
        "dagster_sideinputs/core/batch/invalid_records.py",
        '        checks.append((F.col(quoted(key)).isNull(), f"null key {key!r}"))\n',
        "",
        "a record with a null key is invalid (its own route or an error), never joined",
        (
            # the suite's null-key tests after issue 39 (test_semantics' was a duplicate)
            "tests/core/test_bad_input.py::test_null_key_without_a_tag_is_an_error_naming_the_column",
            "tests/core/test_recovery.py::test_null_key_in_a_delta_main_input_then_an_invalid_tag",
        ),
    ),
    Mutation(
        "no_field_record_not_corrupt",
        "dagster_sideinputs/core/decoded.py",
        "return parsed.withColumn(CORRUPT, F.coalesce(F.col(CORRUPT), nothing))",
        "return parsed.withColumn(CORRUPT, F.col(CORRUPT))",
        "a landed record holding no field of the schema is invalid, not a row of nulls",
        (
            "tests/core/test_bad_input_decode.py::test_landed_json_lines_of_no_object_of_the_schema_are_invalid",
        ),
    ),
    Mutation(
        "pre_keyed_topic_unchecked",
        "dagster_sideinputs/core/batch/route.py",
        "checked = with_pre_keyed_check(spec, classified, plan)",
        "checked = classified",
        "a pre-keyed topic's record in another partition than Kafka's partitioner gives its "
        "key stops the batch before any write",
        (
            "tests/core/test_kafka_keyed.py::test_a_record_on_another_partition_than_its_keys_is_an_error_before_any_write",
        ),
    ),
    Mutation(
        "pre_keyed_topic_checked_in_writes",
        "dagster_sideinputs/core/batch/route.py",
        "counts = translated(context, lambda: count_routes(spec, checked), views=views)\n",
        "counts = translated(context, lambda: count_routes(spec, checked), views=views)\n"
        "        classified = checked\n",
        "a pre-keyed topic's records are joined and written without being shuffled",
        (
            "tests/core/test_kafka_keyed.py::test_keyed_side_input_is_joined_without_shuffling_the_main_records",
        ),
    ),
    Mutation(
        "pre_keyed_rows_unchecked",
        "dagster_sideinputs/core/batch/read.py",
        "table=spec.main.asset)\n    _check_rows(context, raw)\n",
        "table=spec.main.asset)\n",
        "a pre-keyed main input whose key-group column lies stops the batch before any write",
        (
            "tests/core/test_keyed.py::test_a_key_group_column_that_lies_fails_the_batch_before_writing",
        ),
    ),
    Mutation(
        "pre_keyed_file_groups_unchecked",
        "dagster_sideinputs/core/keyed.py",
        "        elif low != high:\n",
        "        elif low > high:\n",
        "a pre-keyed file holding several key groups breaks the promise and stops the batch",
        (
            "tests/core/test_keyed.py::test_input_breaking_the_pre_keyed_promise_is_refused_before_anything_is_written",
        ),
    ),
    # --- windows ------------------------------------------------------------------------
    Mutation(
        "main_window_to_wrong_side_window",
        "dagster_sideinputs/core/sideinputs/windows.py",
        "last = window_start_containing(side_window, as_utc(main_end) - LAST_INSTANT)",
        "last = window_start_containing(side_window, as_utc(main_start))",
        "a main window reads the side window holding its last instant (Beam's default mapping)",
        (
            "tests/core/test_pure_logic.py::test_the_default_mapping_takes_the_side_window_holding_the_main_windows_last_instant",
        ),
    ),
    Mutation(
        "beam_sliding_side_window_latest",
        "dagster_sideinputs/core/sideinputs/windows.py",
        "    start = last - back * side_window.slide\n",
        "    start = last\n",
        "with sliding side windows a main window reads Beam's earliest-starting one",
        (
            "tests/core/test_pure_logic.py::test_the_default_mapping_of_sliding_side_windows_is_beams_earliest_starting",
        ),
    ),
    Mutation(
        "sliding_main_window_dropped",
        "dagster_sideinputs/core/sideinputs/windows.py",
        "starts = F.array(*[last - F.lit(i * slide) for i in range(count - 1, -1, -1)])",
        "starts = F.array(*[last - F.lit(i * slide) for i in range(count - 2, -1, -1)])",
        "a record is processed once per sliding main window holding it",
        (S + "test_sliding_main_windows_process_a_record_once_per_window",),
    ),
    Mutation(
        "window_mapping_size_unchecked",
        "dagster_sideinputs/core/callbacks.py",
        "if not is_window_start(side_window, start) or end - start != side_window.size:",
        "if not is_window_start(side_window, start):",
        "a custom window mapping returning no side window is refused naming it",
        (
            "tests/core/test_bad_input_callbacks.py::test_a_window_mapping_that_fails_or_returns_no_side_window_is_refused",
        ),
    ),
    Mutation(
        "late_from_window_start",
        "dagster_sideinputs/core/batch/planner.py",
        "and as_utc(end) <= watermark",
        "and as_utc(start) <= watermark",
        "a main window is late only once its end is behind the watermark",
        (S + "test_late_records_go_to_the_late_tag",),
    ),
    Mutation(
        "grace_from_window_start",
        "dagster_sideinputs/core/sideinputs/readiness.py",
        "        due = as_utc(end) + grace\n",
        "        due = as_utc(start) + grace\n",
        "a side window is final by grace only grace after its end (by the batch clock)",
        (
            "tests/core/test_windowed_views.py::test_newest_side_window_becomes_final_after_its_grace_by_the_batch_clock",
        ),
    ),
    # --- the buffer -----------------------------------------------------------------------
    Mutation(
        "buffer_never_released",
        "dagster_sideinputs/core/batch/buffer.py",
        "chosen = [namespace_slot(ns) for ns in ready if namespace_slot(ns) in slots]",
        "chosen = [namespace_slot(ns) for ns in ready if keywait_slot(ns) in slots]",
        "buffered records are released once their namespace is ready",
        (S + "test_main_records_wait_for_the_first_side_data",),
    ),
    Mutation(
        "released_left_in_buffer",
        "dagster_sideinputs/core/batch/buffer.py",
        "    return state.files(plan.read_slots) if plan.read_slots else []",
        "    return state.files(plan.read_slots) if plan.buffer_rewrite else []",
        "released records leave the buffer in the batch that releases them (exactly once)",
        (S + "test_buffered_records_are_released_exactly_once",),
    ),
    Mutation(
        "max_age_measured_forward",
        "dagster_sideinputs/core/batch/buffer.py",
        "and after.oldest < shifted(plan.now, limits.max_age, back=True)",
        "and after.oldest < shifted(plan.now, limits.max_age)",
        "the buffer's max_age counts from the batch clock back",
        ("tests/core/test_inputs_and_limits.py::test_buffer_older_than_its_age_limit_fails",),
    ),
    Mutation(
        "buffer_rows_count_released",
        "dagster_sideinputs/core/batch/buffer.py",
        "return AfterBatch(state.rows(unread) + incoming, min(stamps, default=None))",
        "return AfterBatch(state.rows() + incoming, min(stamps, default=None))",
        "the buffered figures (buffer_rows) leave out the records the batch released",
        (
            "tests/core/test_inputs_and_limits.py::test_buffer_size_and_oldest_age_are_reported",
            S + "test_main_records_wait_for_the_first_side_data",
        ),
    ),
    Mutation(
        "released_counted_from_statistics_with_buffer",
        "dagster_sideinputs/core/batch/route.py",
        "        not plan.read_slots\n        and spec.window is None\n",
        "        spec.window is None\n",
        "a batch reading buffered records counts its routes with a job (released figures)",
        (S + "test_buffered_records_are_released_exactly_once",),
    ),
    Mutation(
        "field_ids_matched_by_name",
        "dagster_sideinputs/core/batch/buffer_schema.py",
        "target = by_id.get(then)  # the field with that id now (None: dropped)",
        "target = column.name if column.name in names else by_id.get(then)",
        "buffered rows follow a column-mapped column by its field id (a column dropped and "
        "added again is another column)",
        (
            "tests/core/test_bad_input_schema.py::test_a_column_dropped_and_added_again_under_column_mapping_is_another_column",
        ),
    ),
    # --- routes and side views ----------------------------------------------------------
    Mutation(
        "timeout_deadline_forward",
        "dagster_sideinputs/core/batch/route_rules.py",
        'deadline = F.lit(shifted(plan.now, bound.side.timeout, back=True)).cast("timestamp")',
        'deadline = F.lit(shifted(plan.now, bound.side.timeout)).cast("timestamp")',
        "a record waiting for its key goes to unmatched only after the timeout",
        (S + "test_per_key_wait_then_timeout_goes_to_unmatched",),
    ),
    Mutation(
        "key_wait_predicate_ignores_match",
        "dagster_sideinputs/core/batch/route_rules.py",
        'route = route.when(unmatched & ~timed_out, F.lit("key_wait"))',
        'route = route.when(~timed_out, F.lit("key_wait"))',
        "only records whose key has no side row wait (route predicates)",
        (S + "test_per_key_wait_then_timeout_goes_to_unmatched",),
    ),
    Mutation(
        "duplicate_map_keys_silent",
        "dagster_sideinputs/core/sideinputs/views.py",
        "        guarded = F.when(\n"
        '            F.col("_dsi_count") > 1, '
        'F.raise_error(F.lit(f"{DUPLICATE_MARK}:{data.bound.name}"))\n'
        '        ).otherwise(F.col("_dsi_value"))\n',
        '        guarded = F.col("_dsi_value")\n',
        "a map or singleton with several rows for one key is an error naming the keys "
        "(the guard inside Spark of a view aggregated per key: the second line behind the "
        "check before staging, below; the suite before issue 39 never reached it, a test "
        "now bypasses the check; a map of ready side data is joined unaggregated, checked "
        "before any job reads it)",
        (
            "tests/core/test_windowed_views.py::"
            "test_a_windowed_maps_view_refuses_duplicate_keys_inside_spark_when_the_check_is_"
            "bypassed",
        ),
    ),
    Mutation(
        "duplicate_keys_unchecked_before_staging",
        "dagster_sideinputs/core/batch/one_per_key.py",
        "            raise duplicate_error(data.bound, join, data.version)\n",
        "            pass\n",
        "a map with several rows for one key is refused before anything is staged, naming "
        "the keys (the check that carries the guarantee; the guard above is its second line)",
        (
            # the view's guard refuses the same batch wherever an output reads the side
            # input: only a function that reads none shows the check is gone
            "tests/core/test_bad_input.py::"
            "test_a_map_with_duplicate_keys_is_refused_when_no_output_reads_it",
            "tests/core/test_bad_input.py::"
            "test_a_map_with_duplicate_keys_is_refused_before_any_job_reads_its_join",
        ),
        moved_from=(
            "dagster_sideinputs/core/compute.py",
            "dagster_sideinputs/core/batch/compute.py",
        ),
    ),
    Mutation(
        "float_keys_counted_on_the_driver",
        "dagster_sideinputs/core/batch/one_per_key.py",
        "T.DateType, T.TimestampType, T.TimestampNTZType, T.BinaryType,\n",
        "T.DateType, T.TimestampType, T.TimestampNTZType, T.BinaryType, T.DoubleType,\n",
        "a map's keys are counted on the driver only when Arrow groups them as Spark "
        "does (-0.0 and 0.0 are one key to Spark's join)",
        ("tests/core/test_bad_input.py::test_float_keys_spark_makes_one_are_duplicates",),
    ),
    Mutation(
        "driver_count_ignores_duplicates",
        "dagster_sideinputs/core/batch/one_per_key.py",
        "aggregate([]).num_rows == table.num_rows",
        "aggregate([]).num_rows <= table.num_rows",
        "a duplicated key found on the driver refuses the batch",
        ("tests/core/test_bad_input.py::test_a_small_maps_keys_are_counted_on_the_driver",),
    ),
    Mutation(
        "pick_keeps_the_least",
        "dagster_sideinputs/core/sideinputs/views.py",
        "F.max_by(value, order)",
        "F.min_by(value, order)",
        "pick= keeps the row with the greatest pick column",
        (S + "test_map_with_duplicate_keys_and_pick_keeps_the_greatest",),
    ),
    Mutation(
        "as_of_valid_from_exclusive",
        "dagster_sideinputs/core/sideinputs/joins.py",
        "condition.append((start <= at) & (end.isNull() | (at < end)))",
        "condition.append((start < at) & (end.isNull() | (at < end)))",
        "an as-of row is valid from its valid_from instant included",
        (
            "tests/core/test_temporal.py::test_as_of_map_gives_each_record_the_row_valid_at_its_event_time",
        ),
    ),
    Mutation(
        "time_stats_upper_bound_tight",
        "dagster_sideinputs/core/sideinputs/time_stats.py",
        "    return lower, value + slack\n",
        "    return lower, value\n",
        "statistics' maximum times are bounds to the millisecond (exact to the microsecond)",
        (
            "tests/core/test_stat_bounds.py::test_the_exact_maximum_reads_only_the_files_that_may_hold_it",
        ),
    ),
    # --- readiness -------------------------------------------------------------------
    Mutation(
        "empty_side_input_ready",
        "dagster_sideinputs/core/sideinputs/readiness.py",
        "has_rows = bool(snapshot.files) if rows is None else rows > 0",
        "has_rows = bool(snapshot.files) if rows is None else rows >= 0",
        "a present side input with no rows is not ready",
        (S + "test_present_side_input_with_no_rows_is_not_ready",),
    ),
    Mutation(
        "freshness_age_reversed",
        "dagster_sideinputs/core/sideinputs/readiness.py",
        "age = as_utc(now) - as_utc(snapshot.commit_timestamp)",
        "age = as_utc(snapshot.commit_timestamp) - as_utc(now)",
        "a side input older than max_age is stale: its records wait",
        (S + "test_a_stale_side_input_stops_releasing_until_refreshed",),
    ),
    Mutation(
        "cron_freshness_ignores_lower_bound",
        "dagster_sideinputs/dagster_layer/readiness.py",
        "ok = as_utc(last) >= lower_bound",
        "ok = as_utc(last) >= deadline",
        "a cron freshness policy passes with a materialization after deadline - lower bound",
        (
            "tests/dagster_layer/test_readiness.py::test_cron_policy_wants_a_materialization_after_the_last_deadline_minus_the_lower_bound",
        ),
    ),
    # --- one run at a time --------------------------------------------------------------
    Mutation(
        "local_lock_shared",
        "dagster_sideinputs/core/state/lock.py",
        "fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)",
        "a second run of an operator is refused while one holds its lock",
        (
            "tests/core/test_inputs_and_limits.py::test_a_second_run_of_the_same_operator_is_refused_while_one_holds_it",
        ),
    ),
    Mutation(
        "lease_expiry_inverted",
        "dagster_sideinputs/delta/store/lease.py",
        "if time.time() > record.expires_at + self.clock_skew_s:",
        "if time.time() < record.expires_at + self.clock_skew_s:",
        "an object-store lease is taken over only once it expired or was released",
        ("tests/delta/test_object_store.py::test_lease_is_exclusive_and_passes_on_when_released",),
    ),
    # --- Kafka ---------------------------------------------------------------------------
    Mutation(
        "kafka_capped_range_lost",
        "dagster_sideinputs/core/sources/kafka/offsets.py",
        "known = {(r.topic, r.partition): r.end for r in last.offsets} if last else {}",
        "known = {(r.topic, r.partition): r.log_end for r in last.offsets} if last else {}",
        "each Kafka record is read once across capped batches (no offset range lost)",
        ("tests/core/test_kafka.py::test_each_record_is_read_once_across_capped_batches",),
    ),
    Mutation(
        "kafka_new_partition_from_end",
        "dagster_sideinputs/core/sources/kafka/offsets.py",
        "        else:  # a partition or topic that appeared: everything it holds is new\n"
        "            start = low\n",
        "        else:  # a partition or topic that appeared: everything it holds is new\n"
        "            start = high\n",
        "a partition that appears is read from its first offset",
        ("tests/core/test_kafka.py::test_new_partitions_are_read_from_their_first_offset",),
    ),
    Mutation(
        "kafka_keep_jumps_to_log_end",
        "dagster_sideinputs/core/sources/kafka/offsets.py",
        "offsets.append(OffsetRange(r.topic, r.partition, at, at, high))",
        "offsets.append(OffsetRange(r.topic, r.partition, high, high, high))",
        "reset(main_from='keep') keeps every partition's position (skips only deleted offsets)",
        (
            "tests/core/test_bad_input_resets.py::test_offsets_deleted_unread_are_skipped_once_by_keep_and_nothing_else",
        ),
    ),
    # --- errors, callbacks, Dagster ---------------------------------------------------
    Mutation(
        "local_store_error_unmapped",
        "dagster_sideinputs/delta/store/errors.py",
        "    if isinstance(exc, OSError | ObstoreError):\n        return True\n",
        "    if isinstance(exc, ObstoreError):\n        return True\n",
        "a failing filesystem is a StorageError naming the table, not a raw OSError",
        (
            "tests/core/test_storage_failures.py::"
            "test_a_file_where_a_new_output_table_goes_fails_the_batch_before_any_commit",
        ),
    ),
    Mutation(
        "on_batch_error_unwrapped",
        "dagster_sideinputs/core/callbacks.py",
        "        on_batch(metrics)\n    except SideInputError:\n        raise\n"
        "    except Exception as exc:\n",
        "        on_batch(metrics)\n    except SideInputError:\n        raise\n"
        "    except (TypeError, AttributeError, KeyError) as exc:\n",
        "an on_batch callback's error is a FunctionError saying the batch is committed",
        (
            "tests/core/test_bad_input_callbacks.py::test_an_on_batch_callback_that_raises_stops_the_run_with_its_batch_committed",
        ),
    ),
    Mutation(
        "io_manager_loads_unpartitioned_table",
        "dagster_sideinputs/dagster_layer/io_manager.py",
        "    if not columns:\n        raise SchemaMismatchError(\n",
        "    if not columns and writing:\n        raise SchemaMismatchError(\n",
        "the IO manager refuses to load a partition from a table that cannot hold it",
        (
            "tests/dagster_layer/test_io_manager_partitioning.py::test_a_table_written_unpartitioned_refuses_loads_and_writes_of_a_day",
        ),
    ),
)


# --- running ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one mutation met."""

    name: str
    file: str
    breaks: str
    status: str  # caught | survived | does-not-apply | import-error | timeout | no-tests
    caught: bool
    by: str | None
    stage: str | None  # hints | full
    seconds: float
    hints_run: list[str] = field(default_factory=list)
    detail: str = ""


def _resolve(rev: str, repo: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short=10", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def export(repo: Path, rev: str) -> Path:
    """``git archive`` of ``rev`` into /tmp/dsi-mutations/<rev>/base (reused when there).

    Exported into a folder of this process's own, then renamed into place: two runs of
    the same revision started together (two halves of the list) each export, and the
    first rename wins."""
    base = SCRATCH / rev / "base"
    if (base / "pyproject.toml").exists():
        return base
    mine = SCRATCH / rev / f"base-{os.getpid()}"
    shutil.rmtree(mine, ignore_errors=True)
    mine.mkdir(parents=True)
    archive = SCRATCH / rev / f"tree-{os.getpid()}.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(repo), "archive", rev], check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(mine, filter="data")
    archive.unlink()
    try:
        mine.rename(base)
    except OSError:  # another run's export is in place
        shutil.rmtree(mine, ignore_errors=True)
    return base


def apply(mutation: Mutation, tree: Path) -> str | None:
    """Patch ``tree``; the problem when the old text is not there exactly once."""
    file = mutation.path_in(tree)
    path = tree / file
    if not path.exists():
        return f"{file} does not exist"
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        return f"old text found {count} times in {file}"
    path.write_text(text.replace(mutation.old, mutation.new))
    return None


def existing_hints(hints: Sequence[str], tree: Path) -> list[str]:
    """The hints as pytest node ids, for the files that exist in ``tree``."""
    found: list[str] = []
    for hint in hints:
        pattern, sep, test = hint.partition("::")
        for match in sorted(glob.glob(str(tree / pattern), recursive=True)):
            relative = os.path.relpath(match, tree)
            name = test.split("::")[-1].split("[")[0]
            if name and not re.search(rf"def {re.escape(name)}\(", Path(match).read_text()):
                continue  # a test that is not (or no longer) there
            node = relative + (sep + test if sep else "")
            if node not in found:
                found.append(node)
    return found


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def pytest(
    tree: Path, args: Sequence[str], timeout: float, log: Path
) -> tuple[int | None, str, float]:
    """Run pytest in ``tree`` (its own process group, killed whole on timeout):
    (return code or None on timeout, output, seconds)."""
    started = time.monotonic()
    command = [sys.executable, *PYTEST, *MARKERS, *args]
    with log.open("w") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(
            command,
            cwd=tree,
            env=_env(tree),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    return code, log.read_text(errors="replace"), time.monotonic() - started


CAUGHT = ("caught", "timeout")
"""A hint that hangs on the mutation (its baseline run finished) fails the suite too, by
pytest-timeout: caught, though slowly (lower ``--timeout`` to find out sooner)."""

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def failures(output: str) -> list[str]:
    """The failed or erroring test ids of a pytest run (its short summary)."""
    return list(dict.fromkeys(m.group(1) for m in _FAILED.finditer(output)))


def imports(mutation: Mutation, tree: Path) -> str | None:
    """The patched module still imports (a mutation is a wrong program, not a crash)."""
    file = mutation.path_in(tree)
    if not file.endswith(".py"):
        return None
    module = file[: -len(".py")].replace("/", ".")
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return None if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def baseline(
    tree: Path, mutations: Sequence[Mutation], timeout: float, logs: Path
) -> dict[str, Any]:
    """Every hint on the unmutated copy, in one pytest run: the hints that fail there."""
    hints = list(dict.fromkeys(h for m in mutations for h in existing_hints(m.hints, tree)))
    code, output, seconds = pytest(tree, hints, timeout, logs / f"baseline-{os.getpid()}.log")
    failed = failures(output)
    bad = [h for h in hints if any(_covers(h, f) for f in failed)]
    if code is None:
        bad = hints  # nothing known: trust no hint
    print(f"baseline: {len(hints)} hints, {seconds:.0f}s, failing: {bad or 'none'}", flush=True)
    return {
        "hints": hints,
        "failing": bad,
        "failed_tests": failed,
        "seconds": round(seconds, 1),
        "code": code,
    }


def _covers(hint: str, test_id: str) -> bool:
    """Whether a failed test id belongs to a hint (a file, or a test with its parameters)."""
    return test_id == hint or test_id.startswith(hint + "::") or test_id.startswith(hint + "[")


def run_one(
    mutation: Mutation,
    base: Path,
    rev_dir: Path,
    *,
    unusable: Sequence[str],
    timeout: float,
    full: bool,
) -> Outcome:
    started = time.monotonic()
    tree = rev_dir / WORK
    logs = rev_dir / "logs"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(base, tree, symlinks=True)

    def outcome(status: str, **kw: Any) -> Outcome:
        return Outcome(
            mutation.name,
            mutation.file,
            mutation.breaks,
            status,
            status in CAUGHT,
            seconds=round(time.monotonic() - started, 1),
            **{"by": None, "stage": None, **kw},
        )

    problem = apply(mutation, tree)
    if problem is not None:
        return outcome("does-not-apply", detail=problem)
    broken = imports(mutation, tree)
    if broken is not None:
        return outcome("import-error", detail=broken)
    hints = [h for h in existing_hints(mutation.hints, tree) if h not in unusable]
    stages: list[tuple[str, list[str]]] = [("hints", hints)] if hints else []
    if full:
        stages.append(("full", []))
    if not stages:
        return outcome("no-tests", detail="no hint exists here (try --full)")
    for stage, args in stages:
        code, output, _ = pytest(
            tree, ["-x", *args], timeout, logs / f"{mutation.name}.{stage}.log"
        )
        if code is None:
            return outcome(
                "timeout",
                by=f"no result in {timeout:.0f}s (a hang: pytest-timeout fails it in the suite)",
                stage=stage,
                hints_run=hints,
            )
        failed = failures(output)
        if code == 4:  # pytest's usage error: a hint that names no test here
            return outcome("hint-error", detail=output.strip().splitlines()[-1], stage=stage)
        if code not in (0, 5):
            by = failed[0] if failed else f"pytest exit {code}"
            return outcome("caught", by=by, stage=stage, hints_run=hints)
    return outcome("survived", hints_run=hints)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chosen mutations; ``--out`` is written after each one (a partial report
    survives an interrupted run)."""
    repo = Path(args.repo).resolve()
    rev = _resolve(args.rev, repo)
    chosen = select(args.only)
    rev_dir = SCRATCH / rev
    (rev_dir / "logs").mkdir(parents=True, exist_ok=True)
    base = export(repo, rev)
    started = time.monotonic()
    print(f"revision {rev} of {repo}: {len(chosen)} mutation(s); scratch {rev_dir}", flush=True)
    checked = baseline(base, chosen, args.timeout * 3, rev_dir / "logs")
    results: list[Outcome] = []

    def report() -> dict[str, Any]:
        return {
            "rev": rev,
            "repo": str(repo),
            "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "python": sys.executable,
            "seconds": round(time.monotonic() - started, 1),
            "baseline": checked,
            "caught": sorted(r.name for r in results if r.caught),
            "results": [{**asdict(r), "rev": rev} for r in results],
        }

    for mutation in chosen:
        result = run_one(
            mutation,
            base,
            rev_dir,
            unusable=checked["failing"],
            timeout=args.timeout,
            full=args.full,
        )
        results.append(result)
        print(
            f"  {result.name:45} {result.status:14} {result.seconds:6.0f}s  "
            f"{result.by or result.detail}",
            flush=True,
        )
        if args.out and not args.update:
            Path(args.out).write_text(json.dumps(report(), indent=1) + "\n")
    shutil.rmtree(rev_dir / WORK, ignore_errors=True)
    return report()


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the mutations ``new`` ran replaced by its results (``--update``: rerun a
    few mutations after adding a test, keep the rest; each result names its revision)."""
    rerun = {r["name"] for r in new["results"]}
    results = {
        r["name"]: {"rev": old["rev"], **r, "caught": r["status"] in CAUGHT} for r in old["results"]
    }
    results.update({r["name"]: r for r in new["results"]})
    ordered = [results[m.name] for m in MUTATIONS if m.name in results]
    dropped = sorted(set(results) - {m.name for m in MUTATIONS})  # replaced since
    return {
        **new,
        "rev": new["rev"],
        "updated": {
            "from": old["rev"],
            "rerun": sorted(rerun),
            "dropped": dropped,
            "baseline_before": old["baseline"],
        },
        "seconds": round(old["seconds"] + new["seconds"], 1),
        "caught": sorted(r["name"] for r in ordered if r["caught"]),
        "results": ordered,
    }


def select(only: str | None) -> list[Mutation]:
    if not only:
        return list(MUTATIONS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {m.name: m for m in MUTATIONS}
    chosen = [m for n in names for m in MUTATIONS if fnmatch.fnmatch(m.name, n)]
    unknown = [n for n in names if not any(fnmatch.fnmatch(k, n) for k in known)]
    if unknown:
        raise SystemExit(f"unknown mutation(s): {', '.join(unknown)}")
    return list(dict.fromkeys(chosen))


def table(report: dict[str, Any]) -> str:
    rows = [f"{'mutation':45} {'status':14} {'seconds':>7}  caught by / detail"]
    for r in report["results"]:
        rows.append(
            f"{r['name']:45} {r['status']:14} {r['seconds']:7.0f}  "
            f"{(r['stage'] + ': ' + r['by']) if r['by'] else r['detail']}"
        )
    total = len(report["results"])
    rows.append(
        f"{len(report['caught'])}/{total} caught on {report['rev']} in {report['seconds']:.0f}s "
        f"(baseline {report['baseline']['seconds']:.0f}s, failing hints: "
        f"{report['baseline']['failing'] or 'none'})"
    )
    return "\n".join(rows)


def compare(mine: dict[str, Any], other_path: Path) -> bool:
    other = json.loads(other_path.read_text())
    a, b = set(mine["caught"]), set(other["caught"])
    ran_a = {r["name"] for r in mine["results"]}
    ran_b = {r["name"] for r in other["results"]}
    print(f"catch list {mine['rev']}: {len(a)} caught; {other['rev']} ({other_path}): {len(b)}")
    if ran_a != ran_b:
        print(f"  not run in both: {sorted(ran_a ^ ran_b)}")
    if a == b and ran_a == ran_b:
        print("  identical")
        return True
    if a - b:
        print(f"  caught only on {mine['rev']}: {sorted(a - b)}")
    if b - a:
        print(f"  caught only on {other['rev']}: {sorted(b - a)}")
    return False


def check(base: Path) -> int:
    """Every patch applies to ``base`` (no tests run)."""
    bad = 0
    for mutation in MUTATIONS:
        tree = base.parent / "check"
        shutil.rmtree(tree, ignore_errors=True)
        file = mutation.path_in(base)
        (tree / Path(file).parent).mkdir(parents=True)
        shutil.copy(base / file, tree / file)
        problem = apply(mutation, tree)
        hints = existing_hints(mutation.hints, base)
        missing = [h for h in mutation.hints if not existing_hints([h], base)]
        note = problem or ("hints missing: " + ", ".join(missing) if missing else "ok")
        bad += problem is not None
        print(f"{mutation.name:45} {len(hints)} hint(s)  {note}")
        shutil.rmtree(tree)
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join((__doc__ or "").splitlines()[1:]),
    )
    parser.add_argument("--repo", default=str(ROOT), help="git repository (default: this one)")
    parser.add_argument("--rev", default="HEAD", help="revision to test (default HEAD)")
    parser.add_argument("--only", help="comma-separated mutation names (globs) to run")
    parser.add_argument("--full", action="store_true", help="run the whole suite when hints miss")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    parser.add_argument("--out", help="write the results here (JSON)")
    parser.add_argument("--compare", help="a results JSON whose catch list must be the same")
    parser.add_argument("--load", help="compare this saved results JSON instead of running")
    parser.add_argument(
        "--update", help="a results JSON to update with this run's mutations (with --only)"
    )
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="check the patches apply, run nothing")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:45} {m.file}\n    breaks: {m.breaks}\n    hints: {', '.join(m.hints)}")
        return 0
    if args.check:
        repo = Path(args.repo).resolve()
        return check(export(repo, _resolve(args.rev, repo)))
    if args.load:
        report = json.loads(Path(args.load).read_text())
    else:
        report = run(args)
        if args.update:
            report = merged(json.loads(Path(args.update).read_text()), report)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    if args.compare:
        return 0 if compare(report, Path(args.compare)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
