"""Binding an operator declaration to its storage: :func:`build_spec` turns
:class:`~dagster_sideinputs.core.options.OperatorOptions`, a storage and a readiness
provider into an :class:`~dagster_sideinputs.core.spec.OperatorSpec` once: table
locations, the effective main window, the declared output tags, and every
cross-declaration check (a route needs its tag, a freshness rule needs a max age, row
mode needs schemas, an operator must not write its own inputs, names must be usable as
paths...). Every inconsistency is a ``DeclarationError`` raised here, where the
declaration was written.
"""

import re
from collections.abc import Sequence

from dagster_sideinputs.core.declarations import MainInput, asset_path
from dagster_sideinputs.core.options import OperatorOptions
from dagster_sideinputs.core.outputs import OutputTag
from dagster_sideinputs.core.sideinputs.readiness import DeltaReadiness, ReadinessProvider
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.core.spec import BoundSide, OperatorSpec
from dagster_sideinputs.delta.storage import DeltaStorage
from dagster_sideinputs.delta.store.files import normalize_uri, unsafe_characters
from dagster_sideinputs.errors import DeclarationError

_OPERATOR_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


def build_spec(
    options: OperatorOptions, storage: DeltaStorage, readiness: ReadinessProvider | None = None
) -> OperatorSpec:
    """Resolve and check an operator declaration; every inconsistency is a DeclarationError."""
    if options.mode not in ("frames", "rows"):
        raise DeclarationError(f"mode={options.mode!r} is not 'frames' or 'rows'.")
    if options.cache not in ("auto", "always", "never"):
        raise DeclarationError(f"cache={options.cache!r} is not 'auto', 'always' or 'never'.")
    if options.schema_mode not in (None, "merge"):
        raise DeclarationError(f"schema_mode={options.schema_mode!r} is not None or 'merge'.")
    if not callable(options.fn):
        raise DeclarationError(f"fn must be callable, got {type(options.fn).__name__}.")
    main = options.main
    operator_id = options.operator_id or default_operator_id(options.tag)
    tags = _tags(options)
    sides = tuple(
        BoundSide(name, side, side.path or storage.table_uri(asset_path(side.asset)))
        for name, side in options.side_inputs.items()
    )
    main_uri = kafka_uri(main) or main.path or storage.table_uri(asset_path(main.asset))
    spec = OperatorSpec(
        options=options,
        operator_id=operator_id,
        main_uri=main_uri,
        sides=sides,
        window=_effective_window(options.window, main, sides),
        side_tags=tags,
        storage=storage,
        readiness=readiness or DeltaReadiness(),
    )
    _check_tables(spec)
    if not _OPERATOR_ID.match(operator_id):
        raise DeclarationError(
            f"operator_id {operator_id!r} must use letters, digits, '_', '-' and '.' only (it "
            "names a folder and the Delta application transactions of the operator).",
            fix=f"pass operator_id={re.sub(r'[^A-Za-z0-9_.-]', '_', operator_id)!r}",
        )
    if readiness is not None and not callable(getattr(readiness, "decide", None)):
        raise DeclarationError(
            f"readiness= takes a readiness provider (an object with a method decide(facts, "
            f"windows, now)), got {type(readiness).__name__}.",
            fix="pass readiness=dsi.DeltaReadiness() (the default) or an object whose "
            "decide(...) returns {namespace id: dsi.Decision(ready, reason)}",
        )
    for bound in sides:
        _check_side(bound, options, readiness)
    if options.buffer.on_exceed == "overflow" and options.routes.overflow is None:
        raise DeclarationError(
            "BufferLimits(on_exceed='overflow') needs an overflow tag.",
            fix='pass routes=dsi.Routes(overflow=dsi.OutputTag("<name>")) to the operator',
        )
    if options.mode == "rows":
        missing = [
            t
            for t in spec.all_tags
            if t.schema is None and t not in options.routes.declared().values()
        ]
        if missing:
            raise DeclarationError(
                f"Row mode builds records in Python, so every output needs a schema; "
                f"missing for {missing}.",
                fix='use OutputTag("name", schema=T.StructType([...])) for main_output and '
                "side_outputs",
            )
    return spec


def default_operator_id(main_output: OutputTag) -> str:
    """The operator id of an operator that does not name one: its main output's name."""
    return "__".join(asset_path(main_output.name))


def check_location(uri: str, *, what: str) -> None:
    """Refuse table locations Spark or object stores would read as something else
    (:data:`~dagster_sideinputs.delta.store.files.UNSAFE_PATH_CHARACTERS`): checked for every
    table before anything is written, so a bad name never leaves a half-written batch."""
    found = unsafe_characters(uri)
    if found:
        raise DeclarationError(
            f"{what} is located at {uri!r}, whose characters {found} Spark's file system "
            "reads as glob patterns, URI delimiters or escapes (or cannot hold at all): it "
            "would read or write another path.",
            fix="use letters, digits, '_', '-', '.' and '/' in asset names and paths",
        )


def _effective_window(
    window: Window | None, main: MainInput, sides: Sequence[BoundSide]
) -> Window | None:
    """The main window: the declared one, or the finest window of a windowed side input."""
    if window is None:
        windowed = [b.side.window for b in sides if b.side.window is not None]
        if not windowed:
            return None
        finest = min(windowed, key=lambda w: w.size)
        window = Window.tumbling(finest.size, offset=finest.offset)
    column = window.time_column or main.event_time
    if column is None:
        raise DeclarationError(
            f"Main input {main.asset!r} is processed in windows but has no event-time column.",
            fix='pass MainInput(..., event_time="ts") or window=Window...(time_column="ts")',
        )
    return window.with_time_column(column)


def _tags(options: OperatorOptions) -> tuple[OutputTag, ...]:
    tags: list[OutputTag] = list(options.side_outputs)
    for tag in options.routes.declared().values():
        if tag not in tags:
            tags.append(tag)
    names = [options.tag.name, *[t.name for t in tags]]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DeclarationError(
            f"Output names must be unique; {duplicates} appear more than once (main output "
            f"{options.tag.name!r}, side outputs {[t.name for t in tags]}).",
        )
    return tuple(tags)


def kafka_uri(main: MainInput) -> str | None:
    """What a Kafka main input's position refers to: ``kafka:<topics>`` or
    ``kafka:pattern=<regex>`` (no servers: brokers may move; topic ids guard the rest)."""
    kafka = main.kafka_input
    if kafka is None:
        return None
    if kafka.pattern is not None:
        return f"kafka:pattern={kafka.pattern}"
    return "kafka:" + ",".join(kafka.topics)


def _check_tables(spec: OperatorSpec) -> None:
    """Names usable as paths, and no output that is also an input of the operator."""
    if spec.main.kind != "kafka":
        check_location(spec.main_uri, what=f"Main input {spec.main.asset!r}")
    inputs = {normalize_uri(spec.main_uri): f"main input {spec.main.asset!r}"}
    for bound in spec.sides:
        check_location(bound.uri, what=bound.label)
        inputs.setdefault(normalize_uri(bound.uri), bound.label)
    for tag in spec.all_tags:
        uri = spec.table_uri(tag)
        check_location(uri, what=f"Output {tag.name!r}")
        if normalize_uri(uri) in inputs:
            raise DeclarationError(
                f"Output {tag.name!r} of operator {spec.operator_id!r} is also its "
                f"{inputs[normalize_uri(uri)]} ({uri}): every batch would read what it wrote, "
                "duplicating records and never catching up.",
                fix="write the output to another asset; to reprocess an output's records, use "
                "dsi.build_replay_job(...) (replays read a route's table once)",
            )


def _check_side(
    bound: BoundSide, options: OperatorOptions, readiness: ReadinessProvider | None
) -> None:
    side = bound.side
    needs_unmatched = side.missing == "unmatched" or (
        side.missing == "wait" and side.on_timeout == "unmatched"
    )
    if needs_unmatched and options.routes.unmatched is None:
        raise DeclarationError(
            f"{bound.label} sends records without a side row to the unmatched tag, but the "
            "operator declares none.",
            fix='pass routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched_...")) to the '
            'operator, or missing=dsi.Wait(..., then="null") to join them with nulls',
        )
    if side.on_empty == "unmatched" and options.routes.unmatched is None:
        raise DeclarationError(
            f"{bound.label} sends records whose side namespace holds no rows to the "
            "unmatched tag (on_empty='unmatched'), but the operator declares none.",
            fix='pass routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched_...")) to the '
            "operator, or on_empty='release' to release them with the view's empty value",
        )
    if side.as_of is not None:
        as_of = side.as_of
        time = options.window.time_column if options.window is not None else None
        if (time or options.main.event_time) is None:
            raise DeclarationError(
                f"{bound.label} is joined as of each record's event time, but main input "
                f"{options.main.asset!r} declares none.",
                fix='pass MainInput(..., event_time="ts")',
            )
        if side.pick is not None and (as_of.is_history or as_of.valid_to is not None):
            raise DeclarationError(
                f"{bound.label}: pick= breaks ties between rows of one key starting at the "
                f"same valid_from; it does not apply to {as_of!r}.",
                fix="drop pick=, or use AsOf.column(valid_from) without valid_to",
            )
    if side.readiness == "fresh" and side.max_age is None and readiness is None:
        raise DeclarationError(
            f"{bound.label} has readiness='fresh' but no max_age; without Dagster the "
            "operator judges freshness from the table's last commit time.",
            fix="pass max_age=timedelta(hours=...) (Dagster supplies the asset's "
            "FreshnessPolicy instead)",
        )
    if bound.name.startswith("_dsi_"):
        raise DeclarationError(
            f"Side input name {bound.name!r} starts with '_dsi_', which the operator reserves "
            "for its own columns.",
            fix="rename the side input in side_inputs={...}",
        )
