"""Readiness: when a side input may be used for a namespace.

The operator asks a :class:`ReadinessProvider` once per micro-batch, for every side
input and every side namespace in play, and records the answers in the batch plan
(so a replay decides exactly the same). Without Dagster, :class:`DeltaReadiness`
decides from the side Delta tables themselves; the Dagster layer supplies a provider
that reads materializations, partitions and freshness policies from the instance.

Whatever the provider, a windowed side input declaring ``grace`` makes a side window
final ``grace`` after its end by the batch clock (:func:`apply_grace`): its records go
on with what the window holds, the view's empty value when nothing.

No rule makes a side input whose table does not exist ready (:func:`never_ready`): not
a provider's answer, not ``grace``, not an as-of horizon. Its records wait (a table
that existed and is gone is an error instead, raised by the planner).
"""

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

from dagster_sideinputs.core.callbacks import callable_name, short
from dagster_sideinputs.core.declarations import Readiness
from dagster_sideinputs.core.metrics import human_duration
from dagster_sideinputs.core.sideinputs.declaration import SideInput
from dagster_sideinputs.core.sideinputs.windows import GLOBAL, as_utc, namespace_id
from dagster_sideinputs.delta.engine import TableSnapshot
from dagster_sideinputs.delta.store.errors import is_store_error
from dagster_sideinputs.errors import DeclarationError, SideInputError

WindowSpan = tuple[dt.datetime, dt.datetime]


@dataclass(frozen=True)
class Decision:
    """Whether one side input is ready for one namespace, and why (shown to users)."""

    ready: bool
    reason: str


@dataclass
class SideFacts:
    """What a provider may look at for one side input at the batch's pinned version.

    Attributes:
        name: the side input's name in the operator.
        side: its declaration.
        snapshot: the pinned table version, or None when the table does not exist.
        window_row_counts: rows per side window for the given windows (a small Spark
            job on the side table); only for windowed side inputs.
        max_event_time: largest value of the side's time column, exact to the
            microsecond (file statistics, rounded to milliseconds, only choose the files
            read: core/sideinputs/time_stats.py).
    """

    name: str
    side: SideInput
    snapshot: TableSnapshot | None
    window_row_counts: Callable[[Sequence[WindowSpan]], Mapping[str, int]] = field(
        default=lambda windows: {}
    )
    max_event_time: Callable[[], dt.datetime | None] = field(default=lambda: None)


def effective_readiness(side: SideInput, *, has_freshness_policy: bool = False) -> Readiness:
    """The rule a side input follows when it does not name one."""
    if side.readiness is not None:
        return side.readiness
    if side.window is not None:
        return "complete"
    if side.max_age is not None or has_freshness_policy:
        return "fresh"
    return "present"


class ReadinessProvider(Protocol):
    """Decides readiness of one side input for the side namespaces a batch needs.

    ``windows`` is None for a non-windowed side input (decide for ``global``);
    otherwise the side windows in play. Returns a decision per namespace id.
    """

    def decide(
        self, facts: SideFacts, windows: Sequence[WindowSpan] | None, now: dt.datetime
    ) -> dict[str, Decision]: ...


def _age(now: dt.datetime, then: dt.datetime) -> str:
    seconds = int((as_utc(now) - as_utc(then)).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


class DeltaReadiness:
    """Readiness from the side Delta tables alone (no orchestrator).

    - ``present``: the table (or the window) holds at least one row; a window is also
      ready once final (below), then possibly empty.
    - ``complete``: non-windowed: the table exists (one committed version);
      windowed: the window is final: the side input's watermark (the greatest event
      time of the side table minus the side window's ``watermark``, its allowed
      lateness) has reached the window's end, i.e. a later window has started and no
      late row is expected, so this one will not change.
    - ``fresh``: the table's last commit is at most ``max_age`` old.
    """

    def decide(
        self, facts: SideFacts, windows: Sequence[WindowSpan] | None, now: dt.datetime
    ) -> dict[str, Decision]:
        snapshot = facts.snapshot
        keys = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
        if snapshot is None:
            reason = f"side table {facts.side.asset!r} does not exist yet"
            return {key: Decision(False, reason) for key in keys}
        rule = effective_readiness(facts.side)
        if rule == "fresh":
            return {key: self._fresh(facts, snapshot, now) for key in keys}
        if windows is None:
            return {GLOBAL: self._global(rule, snapshot)}
        latest = facts.max_event_time()
        lateness = facts.side.window.watermark if facts.side.window is not None else None
        watermark = None if latest is None else as_utc(latest) - (lateness or dt.timedelta(0))
        reach = (
            f"side data reaches {as_utc(latest).isoformat()}"
            + (f" (watermark {watermark.isoformat()})" if lateness else "")
            if latest is not None and watermark is not None
            else "no side data"
        )
        decisions: dict[str, Decision] = {}
        counts = facts.window_row_counts(windows) if rule == "present" else {}
        for start, end in windows:
            key = namespace_id(start)
            final = watermark is not None and watermark >= as_utc(end)
            where = f"{reach}; window ends {as_utc(end).isoformat()}"
            if rule == "present":
                rows = counts.get(key, 0)
                decisions[key] = Decision(
                    rows > 0 or final,
                    f"{rows} row(s) in the window"
                    + ("; final: " if final else "; ")
                    + where
                    + (" (empty)" if final and not rows else ""),
                )
            else:
                decisions[key] = Decision(final, ("final: " if final else "") + where)
        return decisions

    @staticmethod
    def _global(rule: Readiness, snapshot: TableSnapshot) -> Decision:
        if rule == "complete":
            return Decision(True, f"materialized (version {snapshot.version})")
        rows = snapshot.num_records
        has_rows = bool(snapshot.files) if rows is None else rows > 0
        return Decision(
            has_rows,
            f"{rows if rows is not None else 'some'} row(s) at version {snapshot.version}"
            if has_rows
            else f"no rows yet (version {snapshot.version})",
        )

    @staticmethod
    def _fresh(facts: SideFacts, snapshot: TableSnapshot, now: dt.datetime) -> Decision:
        max_age = facts.side.max_age
        assert max_age is not None  # the operator checks this at construction
        age = as_utc(now) - as_utc(snapshot.commit_timestamp)
        verdict = "fresh" if age <= max_age else "stale"
        return Decision(
            age <= max_age,
            f"{verdict}: last commit {_age(now, snapshot.commit_timestamp)} ago "
            f"(version {snapshot.version}), max age {human_duration(max_age)}",
        )


def decide_readiness(
    provider: ReadinessProvider,
    label: str,
    facts: SideFacts,
    windows: Sequence[WindowSpan] | None,
    now: dt.datetime,
) -> dict[str, Decision]:
    """``provider.decide(...)``, its errors and its answer checked: what it raises (other
    than the project's errors, Spark's and the storage's, which keep their own
    translation) and an answer that is not a mapping of namespace ids to
    :class:`Decision` are a :class:`DeclarationError` naming the provider and the side
    input (``label``). Namespaces it leaves out are not ready (the caller's rule)."""
    name = callable_name(provider)
    try:
        answer = provider.decide(facts, windows, now)
    except (SideInputError, PySparkException, Py4JError):
        raise
    except Exception as exc:
        if is_store_error(exc):  # the store's failure (obstore's, delta-rs's): a StorageError
            raise
        raise DeclarationError(
            f"The readiness provider {name} raised {type(exc).__name__}: {exc} deciding "
            f"{label} ({_asked(windows)}). Nothing was written; buffered records are intact.",
            fix="fix the provider's decide(facts, windows, now); it must return "
            "{namespace id: dsi.Decision(ready, reason)}",
        ) from exc
    problem = None
    if not isinstance(answer, Mapping):
        problem = f"returned {short(answer)}, not a mapping"
    else:
        for key, value in answer.items():
            if not isinstance(key, str):
                problem = f"returned the key {short(key)}, not a namespace id (str)"
            elif not isinstance(value, Decision):
                problem = f"returned {short(value)} for {key!r}, not a Decision"
            elif not isinstance(value.ready, bool) or not isinstance(value.reason, str):
                problem = f"returned {value!r} for {key!r}: ready must be a bool, reason a str"
            if problem is not None:
                break
    if problem is not None:
        raise DeclarationError(
            f"The readiness provider {name}, deciding {label} ({_asked(windows)}), {problem}. "
            "Nothing was written; buffered records are intact.",
            fix="return {namespace id: dsi.Decision(ready: bool, reason: str)}, keyed by "
            "'global' for a non-windowed side input, else by the namespace id of each "
            "window's start, e.g. '2024-05-01T10:00:00Z'",
        )
    return dict(answer)


def _asked(windows: Sequence[WindowSpan] | None) -> str:
    if windows is None:
        return "namespace 'global'"
    return f"windows {[namespace_id(start) for start, _ in windows][:5]}"


def apply_grace(
    side: SideInput,
    windows: Sequence[WindowSpan],
    decided: Mapping[str, Decision],
    now: dt.datetime,
) -> dict[str, Decision]:
    """A side window not ready by its provider's rule is final ``grace`` after its end
    by the batch clock (pinned in the plan, so a replay decides the same); windows
    still waiting say when that will be (or that only side data will end the wait)."""
    result = dict(decided)
    grace = side.grace
    if side.window is None:
        return result
    for start, end in windows:
        key = namespace_id(start)
        current = result.get(key, Decision(False, "no readiness decision"))
        if current.ready:
            continue
        if grace is None:
            # Say what ends the wait: nothing but side data (or the buffer's max_age).
            result[key] = Decision(
                False, f"{current.reason}; no grace= declared: waits for the side data"
            )
            continue
        due = as_utc(end) + grace
        if as_utc(now) >= due:
            result[key] = Decision(
                True,
                f"final by grace: the window ended {as_utc(end).isoformat()} and its grace "
                f"of {human_duration(grace)} passed at {due.isoformat()} (batch clock "
                f"{as_utc(now).isoformat()}); before: {current.reason}",
            )
        else:
            result[key] = Decision(False, f"{current.reason}; final by grace at {due.isoformat()}")
    return result


def never_ready(
    side: SideInput,
    windows: Sequence[WindowSpan] | None,
    decided: Mapping[str, Decision],
) -> dict[str, Decision]:
    """The decisions for a side input whose table does not exist: none ready, whatever
    the provider decided (and before ``grace``, which finalizes windows of a table, not
    of one never written), each saying why and what ends the wait."""
    keys = [GLOBAL] if windows is None else [namespace_id(start) for start, _ in windows]
    reason = (
        f"side table {side.asset!r} does not exist yet: records wait for its first commit"
        + (" (grace= counts only once it exists)" if side.grace is not None else "")
        + "; materialize the side input asset"
    )
    result: dict[str, Decision] = {}
    for key in [*keys, *(k for k in decided if k not in keys)]:
        before = decided.get(key)
        said = f" (the readiness provider said: {before.reason})" if before and before.ready else ""
        result[key] = Decision(False, reason + said)
    return result
