"""Executing one planned micro-batch.

1. Read the new main records of the plan's range and the buffered records of the
   slots the plan releases (``ingest``); attach the joined views (``views``); give
   every record a route (``routing``).
2. Count the routes in one Spark job (or from the new files' Delta statistics when
   every record is plainly released): the counts are the batch's metrics, and they
   are checked (invalid records without a tag, buffer limits) before anything is
   written.
3. Declare the user function's outputs over the released records; validate every
   output against its table.
4. Write the outputs, main first (a rows-mode function runs inside that write, once),
   then the buffer (removing the released slots' files in the same commit), each with
   the Delta application transaction (operator, batch), and finally the commit record.
"""

import contextlib
import dataclasses
import datetime as dt
import io
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Transaction, write_deltalake
from deltalake.transaction import CommitProperties
from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from dagster_sideinputs.core.buffer import (
    REASON,
    SLOT,
    BufferState,
    to_buffer_rows,
)
from dagster_sideinputs.core.declarations import OutputTag
from dagster_sideinputs.core.ingest import CORRUPT, PRE_KEYED_MARK, BatchReader
from dagster_sideinputs.core.keyed import (
    drop_bucketed_scan,
)
from dagster_sideinputs.core.metrics import BatchMetrics, TableWrite
from dagster_sideinputs.core.outputs import SideInputs, normalize_outputs
from dagster_sideinputs.core.plan import BatchPlan, PlanLog
from dagster_sideinputs.core.planner import Planned
from dagster_sideinputs.core.routing import BUFFER_ROUTES, ROUTE, ROUTES, Router, lookup
from dagster_sideinputs.core.rows import (
    Lookup,
    LookupTable,
    Record,
    TaggedLayout,
    run_row_function,
)
from dagster_sideinputs.core.spec import OperatorSpec
from dagster_sideinputs.core.views import (
    DUPLICATE_MARK,
    SIDE_NS,
    BoundSide,
    JoinSpec,
    SideData,
    apply_join,
    build_join,
    duplicate_error,
)
from dagster_sideinputs.core.windows import (
    GLOBAL,
    NS_END,
    NS_ID,
    NS_START,
    as_utc,
    map_to_side_window,
    namespace_id_column,
)
from dagster_sideinputs.delta.files import normalize_uri
from dagster_sideinputs.delta.table import TableSnapshot
from dagster_sideinputs.delta.writer import AppTransaction, validate_append
from dagster_sideinputs.errors import (
    CorruptDataFileError,
    DeclarationError,
    DuplicateKeyError,
    PreKeyedViolationError,
    SideInputError,
    UndeclaredOutputTagError,
    preview,
)

VACUUM_EVERY = 25
LOOKUP_PREFIX = "_dsi_lookup_"
log = logging.getLogger("dagster_sideinputs")


@dataclass
class _Views:
    """Side data and joins of one batch."""

    data: dict[str, SideData] = field(default_factory=dict)
    joins: dict[str, JoinSpec] = field(default_factory=dict)


class BatchRunner:
    """Runs planned batches of one operator; keeps per-side-version caches between them."""

    def __init__(self, spec: OperatorSpec, spark: SparkSession, plans: PlanLog) -> None:
        self.spec = spec
        self.spark = spark
        self.plans = plans
        self.engine = spec.storage.delta
        self.reader = BatchReader(spec, spark)
        self.router = Router(spec)
        self.explain = False
        self._views_of_batch = _Views()
        self._files_of_batch: list[Any] = []
        self._function_tags: set[OutputTag] = set()
        self._lookup_tables: dict[tuple[str, int | None], LookupTable] = {}
        self._unique_checked: set[tuple[str, int | None, Any]] = set()

    # --- reading -------------------------------------------------------------------------

    # --- views -------------------------------------------------------------------------------

    def _side_snapshot(
        self, bound: BoundSide, plan: BatchPlan, planned: Planned | None
    ) -> TableSnapshot | None:
        if planned is not None and bound.name in planned.side_snapshots:
            return planned.side_snapshots[bound.name]
        version = plan.side_versions.get(bound.name)
        if version is None:
            return None
        return self.engine.snapshot(bound.uri, version=version, name=bound.side.asset)

    def _side_windows(
        self, bound: BoundSide, plan: BatchPlan
    ) -> list[tuple[dt.datetime, dt.datetime]] | None:
        """The side windows that released records of this batch read."""
        if bound.side.window is None:
            return None
        return sorted(
            {
                map_to_side_window(bound.side, p.start, p.end)
                for p in plan.namespaces.values()
                if p.ready and p.start is not None and p.end is not None
            }
        )

    def _views(self, plan: BatchPlan, planned: Planned | None, sample: DataFrame) -> _Views:
        views = _Views()
        spec = self.spec
        for bound in spec.sides:
            snapshot = self._side_snapshot(bound, plan, planned)
            data = SideData(bound, snapshot, self.spark, self.engine)
            views.data[bound.name] = data
            if snapshot is None:
                continue
            windows = self._side_windows(bound, plan)
            if windows == []:
                continue  # no released record reads this windowed side input
            mapping = {ns: p.side_namespaces[bound.name] for ns, p in plan.namespaces.items()}
            main_side_ns = (
                lookup(mapping, F.col(NS_ID)) if bound.side.window is not None else F.lit(GLOBAL)
            )
            spec_ = build_join(data, sample, windows=windows, main_side_ns=main_side_ns)
            if spec_ is not None:
                views.joins[bound.name] = spec_
        return views

    def _should_cache(self, views: _Views) -> bool:
        """Cache the classified records when a side input is joined by shuffle."""
        if self.spec.cache != "auto":
            return self.spec.cache == "always"
        threshold = _broadcast_threshold(self.spark)
        for name, join in views.joins.items():
            snapshot = views.data[name].snapshot
            size = sum(f.size for f in snapshot.files) if snapshot is not None else 0
            if not join.broadcast and (threshold < 0 or size > threshold):
                return True
        return False

    # --- classification ----------------------------------------------------------------------

    def classify(
        self, plan: BatchPlan, planned: Planned | None
    ) -> tuple[DataFrame, list[str], _Views, BufferState, list[str]]:
        """Every record looked at, with its route (persisted)."""
        if planned is not None:
            files, snapshot = planned.main_files, planned.main_snapshot
        else:
            files, snapshot = self.reader.main_files(plan.main)
        notes: list[str] = []
        temp_tables: list[str] = []
        raw = self.reader.raw_main(plan.main, files, snapshot)
        if self.spec.main.pre_keyed is not None and files:
            raw, note, temp = self.reader.pre_keyed(raw, files, snapshot)
            notes.append(note)
            if temp:
                temp_tables.append(temp)
        main_columns = [c for c in raw.columns if c != CORRUPT]
        new = self.reader.bookkeeping(raw, plan, main_columns)
        buffered, state = self.reader.buffered(plan)
        views = self._views(plan, planned, new.withColumn(NS_ID, F.lit(GLOBAL)))
        self._views_of_batch = views
        self._files_of_batch = files
        parts = [new] + ([buffered] if buffered is not None else [])
        enriched = []
        for part in parts:
            part = part.withColumn(NS_ID, namespace_id_column(F.col(NS_START)))
            for name, join in views.joins.items():
                part = apply_join(part, join, name)
            enriched.append(part)
        classified = enriched[0]
        for part in enriched[1:]:
            classified = classified.unionByName(part, allowMissingColumns=True)
        classified = self.router.route(classified, plan, views.joins)
        self._temp_tables = temp_tables
        return classified, main_columns, views, state, notes

    # --- limits ---------------------------------------------------------------------------------

    # --- outputs -------------------------------------------------------------------------------

    def _function_input(
        self,
        classified: DataFrame,
        main_columns: list[str],
        views: _Views,
        lookups: Mapping[str, Lookup] | None = None,
    ) -> DataFrame:
        released = classified.filter(F.col(ROUTE) == "released")
        columns = [F.col(f"`{c}`") for c in main_columns]
        local = lookups or {}
        columns += [F.col(f"`{name}`") for name in views.joins if name not in local]
        columns += [
            views.joins[name].main_keys[-1].alias(lookup.column) for name, lookup in local.items()
        ]
        if self.spec.window is not None:
            if "window" in main_columns:
                raise DeclarationError(
                    f"Main input {self.spec.main.asset!r} has a column named 'window', which "
                    "the operator uses for the main window of each released record.",
                    fix="rename that column upstream",
                )
            columns.append(
                F.struct(F.col(NS_START).alias("start"), F.col(NS_END).alias("end")).alias("window")
            )
        return released.select(*columns)

    def _side_inputs(self, plan: BatchPlan, views: _Views) -> SideInputs:
        getters: dict[str, Callable[[], Any]] = {}
        for bound in self.spec.sides:
            data = views.data[bound.name]
            windows = self._side_windows(bound, plan)
            if bound.side.view == "singleton" and bound.side.window is None:
                getters[bound.name] = data.singleton_value
            else:

                def frame(
                    data: SideData = data, windows: Any = windows, bound: BoundSide = bound
                ) -> DataFrame:
                    rows = data.rows(windows)
                    if bound.side.window is None:
                        rows = rows.drop(SIDE_NS)
                    return F.broadcast(rows) if bound.side.distribution == "broadcast" else rows

                getters[bound.name] = frame
        return SideInputs(getters)

    def _local_lookups(self, views: _Views) -> dict[str, Lookup]:
        """Keyed side inputs a row function can look up in Python instead of Spark joining
        them: broadcast maps / multimaps read whole on every task anyway, whose records do
        not wait for their key (converting a joined struct per record costs more than a
        dict lookup)."""
        lookups: dict[str, Lookup] = {}
        for name, join in views.joins.items():
            side = views.data[name].side
            eligible = (
                join.broadcast
                and side.view in ("map", "multimap")
                and side.window is None
                and side.distribution != "forwarded"
                and side.missing == "null"
            )
            if eligible:
                data = views.data[name]
                version = data.snapshot.version if data.snapshot else None
                cache_key = (name, version)
                if cache_key not in self._lookup_tables:
                    # Keep one version per side input: older ones are not read again.
                    self._lookup_tables = {
                        key: table for key, table in self._lookup_tables.items() if key[0] != name
                    }
                    self._lookup_tables[cache_key] = _lookup_table(data)
                lookups[name] = Lookup(
                    f"{LOOKUP_PREFIX}{name}",
                    self._lookup_tables[cache_key],
                    [] if side.view == "multimap" else None,
                )
        return lookups

    def _row_broadcasts(self, plan: BatchPlan, views: _Views) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for bound in self.spec.sides:
            if bound.name in views.joins:
                continue
            if bound.side.window is not None:
                raise DeclarationError(
                    f"Row mode cannot hand {bound.label} to functions as a whole: it is windowed "
                    "and not joined by key.",
                    fix="use mode='frames', or give it a key relation to the main records",
                )
            data = views.data[bound.name]
            if bound.side.view == "singleton":
                row = data.singleton_value()
                values[bound.name] = (
                    Record(row.asDict(recursive=True)) if hasattr(row, "asDict") else row
                )
                continue
            rows = [
                Record(r.asDict(recursive=True)) for r in data.rows(None).drop(SIDE_NS).collect()
            ]
            if bound.side.view == "list":
                values[bound.name] = rows
            elif bound.side.view == "map":
                values[bound.name] = {r[bound.side.key]: r for r in rows}
            else:
                grouped: dict[Any, list[Record]] = {}
                for r in rows:
                    grouped.setdefault(r[bound.side.key], []).append(r)
                values[bound.name] = grouped
        return values

    def outputs(
        self,
        plan: BatchPlan,
        classified: DataFrame,
        main_columns: list[str],
        views: _Views,
        released: int,
    ) -> tuple[dict[OutputTag, DataFrame], list[DataFrame]]:
        """The function's outputs and the operator's own routes; the function runs only
        when the batch releases records (so side inputs it reads are ready)."""
        spec = self.spec
        function_input = self._function_input(classified, main_columns, views)
        persisted: list[DataFrame] = []
        outputs: dict[OutputTag, DataFrame] = {}
        lookups: dict[str, Lookup] = {}
        if not released:
            pass
        elif spec.mode == "frames":
            result = spec.fn(function_input, self._side_inputs(plan, views))
            outputs = normalize_outputs(result, spec.declared)
        else:
            user_tags = [
                t for t in spec.all_tags if t not in spec.routes.declared() or t.schema is not None
            ]
            lookups = self._local_lookups(views)
            joined = [name for name in views.joins if name not in lookups]
            function_input = self._function_input(classified, main_columns, views, lookups=lookups)
            layout = TaggedLayout(user_tags)
            tagged = run_row_function(
                function_input,
                spec.fn,
                layout=layout,
                broadcast_values=self._row_broadcasts(plan, views),
                joined_columns=joined,
                record_columns=[
                    c
                    for c in function_input.columns
                    if c not in joined and not c.startswith(LOOKUP_PREFIX)
                ],
                lookups=lookups,
            )
            if len(user_tags) > 1:  # several writes read it: run the function once for all
                tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK)
                persisted.append(tagged)
            # No job of its own: the function runs inside the main output's write (the
            # first), so an error in it leaves nothing committed and Spark writes while
            # Python computes.
            outputs = layout.split(tagged)
        if released:
            self._check_one_row_per_key(plan, views, skip=lookups)
        self._function_tags = set(outputs)
        for route, tag in spec.routes.by_route().items():
            columns = [F.col(f"`{c}`") for c in main_columns]
            if route != "late":
                columns.append(F.col(REASON).alias("reason"))
            routed = classified.filter(F.col(ROUTE) == route).select(*columns)
            outputs[tag] = (
                outputs[tag].unionByName(routed, allowMissingColumns=True)
                if tag in outputs
                else routed
            )
        for tag, frame in outputs.items():
            validate_append(
                frame.schema,
                spec.table_uri(tag),
                schema_mode=spec.schema_mode,
                storage_options=spec.storage.storage_options,
                name=tag.name,
            )
        return outputs, persisted

    def _check_one_row_per_key(
        self, plan: BatchPlan, views: _Views, *, skip: Mapping[str, Any]
    ) -> None:
        """Maps and singletons promise one row per key (per window): checked before
        anything is written, once per side version and set of windows. (Their joins also
        fail on a duplicate, but only in a job that reads the side value, which may be a
        later write.) ``skip``: side inputs checked on the driver (row-mode lookups)."""
        for name, join in views.joins.items():
            if join.duplicates is None or name in skip:
                continue
            data = views.data[name]
            version = data.snapshot.version if data.snapshot else None
            windows = self._side_windows(data.bound, plan)
            checked = (name, version, tuple(windows) if windows is not None else None)
            if checked in self._unique_checked:
                continue
            if join.duplicates.take(1):
                raise duplicate_error(data.bound, join, version)
            self._unique_checked.add(checked)

    # --- writing -------------------------------------------------------------------------------

    def write(
        self,
        plan: BatchPlan,
        outputs: Mapping[OutputTag, DataFrame],
        classified: DataFrame,
        main_columns: list[str],
        state: BufferState,
        counts: Mapping[tuple[str, str], Any],
    ) -> dict[str, TableWrite]:
        spec = self.spec
        txn = AppTransaction(spec.operator_id, plan.batch_id)
        meta = {"dsi.operator": spec.operator_id, "dsi.batch": plan.batch_id}
        writes: dict[str, TableWrite] = {}
        routed = {
            route: sum(v["n"] for (r, _), v in counts.items() if r == route) for route in ROUTES
        }
        builtin = {t: r for r, t in spec.routes.by_route().items()}
        # The main output comes first; in rows mode it is always the function's, so its
        # write runs the function before anything else is committed.
        for tag in spec.all_tags:
            frame = outputs.get(tag)
            if frame is None:
                continue
            route = builtin.get(tag)
            nothing_routed = route is not None and not routed[route]
            if (
                nothing_routed
                and tag not in self._function_tags
                and self.engine.exists(spec.table_uri(tag))
            ):
                continue  # nothing to add: its Spark job would find nothing
            result = self.engine.write(
                frame,
                spec.table_uri(tag),
                mode="append",
                app_transaction=txn,
                schema_mode=spec.schema_mode,
                name=tag.name,
                commit_metadata=meta,
                skip_empty_commit=True,
            )
            writes[tag.name] = TableWrite(
                tag.name,
                result.uri,
                result.version,
                result.num_rows,
                result.skipped,
                result.duration_s,
            )
            log.info(
                "batch %s: %s %s (%s rows, version %s, %.1fs)",
                plan.batch_id,
                "skipped" if result.skipped else "wrote",
                tag.name,
                result.num_rows,
                result.version,
                result.duration_s,
            )
        waiting = classified.filter(F.col(ROUTE).isin(*BUFFER_ROUTES)).withColumn(
            SLOT,
            F.concat(
                F.when(F.col(ROUTE) == "key_wait", F.lit("key=")).otherwise(F.lit("ns=")),
                F.col(NS_ID),
            ),
        )
        removed = state.files(plan.read_slots)
        to_buffer = routed["buffered"] + routed["key_wait"]
        if removed and not to_buffer:
            result = self.engine.commit_removals(
                spec.buffer_uri,
                removed,
                app_transaction=txn,
                name=f"{spec.operator_id} buffer",
                commit_metadata=meta,
            )
            writes["buffer"] = TableWrite(
                "buffer", result.uri, result.version, 0, result.skipped, result.duration_s
            )
        elif to_buffer:
            result = self.engine.write(
                to_buffer_rows(waiting, main_columns, F.col(REASON)),
                spec.buffer_uri,
                mode="append",
                partition_by=[SLOT],
                remove_files=removed,
                app_transaction=txn,
                schema_mode="merge",
                name=f"{spec.operator_id} buffer",
                commit_metadata=meta,
                skip_empty_commit=True,
            )
            writes["buffer"] = TableWrite(
                "buffer",
                result.uri,
                result.version,
                result.num_rows,
                result.skipped,
                result.duration_s,
            )
        if plan.main.kind == "files" and plan.main.files:
            self._record_files(plan, txn)
        return writes

    def _record_files(self, plan: BatchPlan, txn: AppTransaction) -> None:
        uri = normalize_uri(self.spec.files_seen_uri)
        options = dict(self.spec.storage.storage_options) or None
        if DeltaTable.is_deltatable(uri, options):
            done = DeltaTable(uri, storage_options=options).transaction_version(txn.app_id)
            if done is not None and done >= txn.version:
                return
        table = pa.table(
            {
                "path": [f["path"] for f in plan.main.files],
                "size": pa.array([f["size"] for f in plan.main.files], pa.int64()),
                "batch_id": pa.array([plan.batch_id] * len(plan.main.files), pa.int64()),
            }
        )
        write_deltalake(
            uri,
            table,
            mode="append",
            storage_options=options,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(txn.app_id, txn.version)]
            ),
        )

    # --- the whole batch ---------------------------------------------------------------------

    def execute(self, plan: BatchPlan, planned: Planned | None, *, replayed: bool) -> BatchMetrics:
        started = time.perf_counter()
        durations: dict[str, float] = {}
        persisted: list[DataFrame] = []
        self._temp_tables = []
        try:
            classified, main_columns, views, state, notes = self.classify(plan, planned)
            physical_plan = _explain(classified) if self.explain else None
            if self._should_cache(views):
                # A shuffle join: build the classified records once for all writes.
                classified = classified.persist(StorageLevel.MEMORY_AND_DISK)
                persisted.append(classified)
                notes.append("classified records cached (a side input is joined by shuffle)")
            counts = self.router.counts_from_statistics(plan, self._files_of_batch, views.joins)
            if counts is None:
                counts = self._translate(lambda: self.router.counts(classified))
            else:
                notes.append("every record released: routes counted from Delta statistics")
            durations["classify"] = time.perf_counter() - started
            log.info(
                "batch %s: %s in %.1fs",
                plan.batch_id,
                ", ".join(
                    f"{route}/{origin}={v['n']}" for (route, origin), v in sorted(counts.items())
                ),
                durations["classify"],
            )
            self.router.check_invalid(classified, counts)
            limited, counts = self.router.limits(plan, classified, counts, state)
            if limited is not classified:
                persisted.append(limited)
                classified = limited
            mark = time.perf_counter()
            released = sum(v["n"] for (r, _), v in counts.items() if r == "released")
            outputs, extra = self._translate(
                lambda: self.outputs(plan, classified, main_columns, views, released)
            )
            persisted.extend(extra)
            durations["function"] = time.perf_counter() - mark
            mark = time.perf_counter()
            writes = self._translate(
                lambda: self.write(plan, outputs, classified, main_columns, state, counts)
            )
            durations["write"] = time.perf_counter() - mark
        finally:
            for frame in persisted:
                frame.unpersist()
            for table in self._temp_tables:
                drop_bucketed_scan(self.spark, table)
        durations["total"] = time.perf_counter() - started
        metrics = self._metrics(plan, counts, writes, state, durations, replayed, notes)
        metrics = dataclasses.replace(metrics, physical_plan=physical_plan)
        max_seen = [t for t in (plan.max_event_time, _max_time(counts)) if t is not None]
        self.plans.commit(
            plan.batch_id,
            {
                **metrics.as_dict(),
                "max_event_time": max(max_seen).isoformat() if max_seen else None,
            },
        )
        if plan.batch_id % VACUUM_EVERY == VACUUM_EVERY - 1 and self.engine.exists(
            self.spec.buffer_uri
        ):
            DeltaTable(normalize_uri(self.spec.buffer_uri)).vacuum(
                retention_hours=0, enforce_retention_duration=False, dry_run=False
            )
        return metrics

    def _translate(self, action: Callable[[], Any]) -> Any:
        """Spark errors caused by user data or code, as the project's clear errors."""
        try:
            return action()
        except SideInputError:
            raise
        except (PySparkException, Py4JJavaError) as exc:
            text = str(exc)
            if "UndeclaredOutputTagError" in text:
                raise UndeclaredOutputTagError(_extract(text, "UndeclaredOutputTagError:")) from exc
            if DUPLICATE_MARK in text:
                name = text.split(DUPLICATE_MARK + ":", 1)[1].split()[0].strip("'\".,")
                if name in self._views_of_batch.joins:
                    data = self._views_of_batch.data[name]
                    version = data.snapshot.version if data.snapshot else None
                    raise duplicate_error(
                        data.bound, self._views_of_batch.joins[name], version
                    ) from exc
            if PRE_KEYED_MARK in text:
                raise PreKeyedViolationError(
                    f"Main input {self.spec.main.asset!r} is declared pre-keyed, but "
                    f"{_extract(text, PRE_KEYED_MARK + ':')}. Nothing was written.",
                    fix="fix the key-group column at the source, or drop pre_keyed=",
                ) from exc
            missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
            if missing:
                fn = self.spec.fn
                name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
                raise DeclarationError(
                    f"Operator {self.spec.operator_id!r}: Spark's executors cannot import "
                    f"module {missing.group(1)!r}, needed to run the {self.spec.mode}-mode "
                    f"function {name} (executors are other Python processes, which import "
                    "it by module name). Nothing was written; buffered records are intact.",
                    fix=f"install the package holding {missing.group(1)!r} in the executors' "
                    "Python environment (the same as the driver's), or ship it with "
                    "`spark.sparkContext.addPyFile(...)` / `--py-files`",
                ) from exc
            if "not a Parquet file" in text or "FileNotFoundException" in text:
                found = re.search(r"reading file (\S+?)\.?\s", text)
                where = found.group(1) if found else _extract(text, "")
                raise CorruptDataFileError(
                    f"Operator {self.spec.operator_id!r} cannot read data file {where} of main "
                    f"input {self.spec.main.asset!r}: it is not a readable parquet file. "
                    "Nothing was written; buffered records are intact.",
                    fix="move the file out of the landing folder (or restore it / repair the "
                    "table), then rerun",
                ) from exc
            raise

    def _metrics(
        self,
        plan: BatchPlan,
        counts: Mapping[tuple[str, str], Any],
        writes: dict[str, TableWrite],
        state: BufferState,
        durations: dict[str, float],
        replayed: bool,
        notes: list[str],
    ) -> BatchMetrics:
        routes = {route: 0 for route in ROUTES}
        rows_in = from_buffer = 0
        for (route, origin), values in counts.items():
            routes[route] = routes.get(route, 0) + values["n"]
            if origin == "new":
                rows_in += values["n"]
            else:
                from_buffer += values["n"]
        unread = [s for s in state.slots() if s not in plan.read_slots]
        buffer_rows = state.rows(unread) + routes["buffered"] + routes["key_wait"]
        stamps = [
            v["oldest"]
            for (route, _), v in counts.items()
            if route in BUFFER_ROUTES and v["oldest"]
        ]
        if state.oldest(unread) is not None:
            stamps.append(state.oldest(unread))
        oldest = min((as_utc(s) for s in stamps), default=None)
        return BatchMetrics(
            operator_id=self.spec.operator_id,
            batch_id=plan.batch_id,
            replayed=replayed,
            main_range=plan.main.describe(),
            rows_in=rows_in,
            released_from_buffer=from_buffer,
            routes=routes,
            writes=writes,
            side_versions=dict(plan.side_versions),
            readiness={
                side: {ns: {"ready": d.ready, "reason": d.reason} for ns, d in per_ns.items()}
                for side, per_ns in plan.decisions.items()
            },
            buffer_rows=buffer_rows,
            buffer_oldest_age_s=None
            if oldest is None
            else (as_utc(plan.now) - oldest).total_seconds(),
            watermark=plan.watermark,
            max_event_time=_max_time(counts),
            durations={k: round(v, 4) for k, v in durations.items()},
            notes=notes,
        )


def _explain(frame: DataFrame) -> str:
    """Spark's physical plan of a DataFrame, as ``explain()`` prints it."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        frame.explain()
    return buffer.getvalue()


def _lookup_table(data: SideData) -> LookupTable:
    """A keyed side input as a :class:`LookupTable` (map: one row per key, a duplicate key
    is an error unless the side declares ``pick``; multimap: every row, in a stable order)."""
    side = data.side
    assert side.key is not None
    arrow = data.rows(None).drop(SIDE_NS).toArrow()
    multimap = side.view == "multimap"
    if not multimap and pc.count_distinct(arrow[side.key], mode="all").as_py() == len(arrow):
        return LookupTable(arrow, side.key, multimap=False)  # one row per key: ship as is
    rows = arrow.to_pylist()
    if multimap:
        chosen = sorted(rows, key=repr)
    else:
        table: dict[Any, dict[str, Any]] = {}
        duplicates: list[Any] = []
        for row in rows:
            if row[side.key] in table:
                duplicates.append(row[side.key])
            table[row[side.key]] = row
        if duplicates and side.pick is None:
            raise DuplicateKeyError(
                f"{data.bound.label} is a map but holds several rows for key(s) "
                f"{preview(sorted(set(duplicates), key=repr))}. Nothing was written.",
                fix="deduplicate the side asset, declare SideInput.multimap(...), or pick one "
                "row per key with SideInput.map(..., pick='<column, greatest wins>')",
            )
        if duplicates:
            pick = side.pick
            assert pick is not None
            table = {}
            for row in sorted(rows, key=lambda r: (r[pick] is not None, r[pick], repr(r))):
                table[row[side.key]] = row
        chosen = list(table.values())
    chosen_table = pa.Table.from_pylist(chosen, schema=arrow.schema)
    return LookupTable(chosen_table, side.key, multimap=multimap)


def _broadcast_threshold(spark: SparkSession) -> int:
    """``spark.sql.autoBroadcastJoinThreshold`` in bytes (-1: never broadcast)."""
    text = str(spark.conf.get("spark.sql.autoBroadcastJoinThreshold", "10485760")).strip().lower()
    match = re.fullmatch(r"(-?\d+)\s*([kmgt]?)b?", text)
    if match is None:
        return 10 * 2**20
    unit = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2)]
    return int(match.group(1)) * unit


def _max_time(counts: Mapping[tuple[str, str], Any]) -> dt.datetime | None:
    """Latest event time of the batch's valid records (invalid ones must not move time)."""
    values = [
        as_utc(v["max_time"])
        for (route, _), v in counts.items()
        if route != "invalid" and v.get("max_time") is not None
    ]
    return max(values) if values else None


def _extract(text: str, marker: str) -> str:
    start = text.find(marker)
    line = text[start + len(marker) :] if start >= 0 else text
    return line.strip().splitlines()[0][:500] if line.strip() else text[:500]
