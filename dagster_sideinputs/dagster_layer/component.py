"""``SideInputPipeline``: one side-input operator declared in a ``defs.yaml``.

The component is a YAML spelling of ``@side_input_assets`` plus the jobs, checks and
sensor built around it: ``build_defs`` reads the attributes into the same declaration
values (``MainInput``, ``SideInput``, ``Window``, ``OutputTag``) and calls
``side_input_assets``, ``build_side_input_checks``, ``build_side_input_job``,
``build_replay_job`` and ``build_side_input_sensor``; nothing here runs the operator.
"""

import dataclasses
import datetime as dt
import importlib
import re
from collections.abc import Callable
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from dagster_sideinputs.core.declarations import BufferLimits, MainInput
from dagster_sideinputs.core.outputs import OutputTag, Routes
from dagster_sideinputs.core.sideinputs.as_of import AsOf
from dagster_sideinputs.core.sideinputs.declaration import SideInput, Wait
from dagster_sideinputs.core.sideinputs.windows import Window
from dagster_sideinputs.dagster_layer.assets import AssetsArguments, side_input_assets
from dagster_sideinputs.dagster_layer.checks import build_side_input_checks
from dagster_sideinputs.dagster_layer.declaration import declaration_of
from dagster_sideinputs.dagster_layer.io_manager import DeltaIOManager
from dagster_sideinputs.dagster_layer.job import build_replay_job, build_side_input_job
from dagster_sideinputs.dagster_layer.resources import SparkResource
from dagster_sideinputs.dagster_layer.scaffold import SideInputPipelineScaffolder
from dagster_sideinputs.dagster_layer.sensor import build_side_input_sensor
from dagster_sideinputs.deprecations import warn_moved
from dagster_sideinputs.errors import DeclarationError

Duration = str | float
"""A duration in YAML: ``"90s"``, ``"30m"``, ``"1h"``, ``"1d"``, ``"1h30m"``, or seconds."""

_UNITS = {"w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|w|d|h|m|s)")


def parse_duration(value: Duration, where: str) -> dt.timedelta:
    """A ``datetime.timedelta`` from a YAML duration; ``where`` names the field in errors."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dt.timedelta(seconds=float(value))
    text = str(value).replace(" ", "").lower()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise DeclarationError(
            f"SideInputPipeline: {where} is {value!r}, not a duration.",
            fix=f'write e.g. {where}: "90s", "30m", "1h", "1d" or "1h30m" (or a number of seconds)',
        )
    return dt.timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def _optional_duration(value: Duration | None, where: str) -> dt.timedelta | None:
    return None if value is None else parse_duration(value, where)


class OutputModel(dg.Model):
    """An output (one asset, one Delta table): its name, and what the UI says of it."""

    name: str = Field(description="Asset name of the output (``a/b`` for a key path).")
    description: str | None = Field(default=None, description="Shown on the asset.")


Output = str | OutputModel


def _tag(output: Output | None) -> OutputTag | None:
    if output is None or isinstance(output, str):
        return OutputTag(output) if output else None
    return OutputTag(output.name, description=output.description)


class WindowModel(dg.Resolvable, dg.Model):
    """Event-time windows: tumbling (``size`` only) or sliding (``size`` and ``slide``)."""

    size: Duration = Field(description='Window length, e.g. "1h".')
    slide: Duration | None = Field(default=None, description="Sliding windows: their step.")
    time_column: str | None = Field(
        default=None, description="Timestamp column (default: the main input's event_time)."
    )
    watermark: Duration | None = Field(default=None, description="Allowed lateness.")
    offset: Duration | None = Field(default=None, description="Shift of window starts.")
    grace: Duration | None = Field(
        default=None, description="Side windows: final this long after their end."
    )

    def window(self, where: str) -> Window:
        size = parse_duration(self.size, f"{where}.size")
        return Window(
            size=size,
            slide=parse_duration(self.slide, f"{where}.slide") if self.slide else size,
            time_column=self.time_column,
            watermark=_optional_duration(self.watermark, f"{where}.watermark"),
            offset=parse_duration(self.offset or 0, f"{where}.offset"),
            grace=_optional_duration(self.grace, f"{where}.grace"),
        )


class WaitModel(dg.Resolvable, dg.Model):
    """``missing: {wait: 1h, then: unmatched}``: :class:`~dagster_sideinputs.Wait`."""

    wait: Duration = Field(description='How long a record may wait, e.g. "1h".')
    then: Literal["unmatched", "null"] = Field(
        default="unmatched", description="After that: the unmatched route, or a null join."
    )


class MainInputModel(dg.Resolvable, dg.Model):
    """The main input: a Delta table asset that grows by appends."""

    asset: str = Field(description="Asset name of the main input's Delta table.")
    key: str | None = Field(default=None, description="Key column (keyed side inputs).")
    event_time: str | None = Field(default=None, description="Event-time column (windows).")
    path: str | None = Field(
        default=None, description="Table location when it is not <storage root>/<asset>."
    )


class SideInputModel(dg.Resolvable, dg.Model):
    """A side input: a Delta table asset seen through a view (``SideInput.<view>``)."""

    view: Literal["singleton", "list", "map", "multimap"] = Field(
        description="How the function sees it: one row, all rows, key -> row, key -> rows."
    )
    asset: str = Field(description="Asset name of the side input's Delta table.")
    key: str | None = Field(default=None, description="map / multimap: the side key column.")
    key_translator: str | None = Field(
        default=None, description="map / multimap: main column giving the side key."
    )
    readiness: Literal["present", "complete", "fresh"] | None = Field(
        default=None,
        description="When it may be used (default: complete when windowed, fresh with a "
        "FreshnessPolicy or max_age, else present).",
    )
    distribution: Literal["broadcast", "keyed", "forwarded"] | None = Field(
        default=None, description="How it reaches the main records."
    )
    missing: Literal["null", "unmatched", "wait"] | WaitModel | None = Field(
        default=None,
        description="map / multimap: a main record whose key has no side row: null, "
        "unmatched, or {wait: 1h, then: unmatched}.",
    )
    timeout: Duration | None = Field(
        default=None, description="Before 0.2, with missing: wait; now missing: {wait: ...}."
    )
    on_timeout: Literal["unmatched", "null"] | None = Field(
        default=None, description="Before 0.2; now missing: {wait: ..., then: ...}."
    )
    window: WindowModel | None = Field(default=None, description="Side windows.")
    grace: Duration | None = Field(
        default=None,
        description="as_of: when the data valid at a record's time is final (before 0.2, "
        "also a window's grace; now window: {grace: ...}).",
    )
    on_empty: Literal["release", "unmatched"] | None = Field(
        default=None, description="A ready side window holding no rows."
    )
    max_age: Duration | None = Field(default=None, description="Freshness without Dagster.")
    pick: str | None = Field(default=None, description="map: keep the greatest of this column.")
    as_of: str | None = Field(default=None, description="map: the side row's validity column.")
    forward_column: str | None = Field(default=None, description="distribution: forwarded.")
    path: str | None = Field(default=None, description="Table location, if not the default.")

    def side_input(self, name: str) -> SideInput:
        where = f"side_inputs.{name}"
        read_below = {"view", "asset", "grace", "timeout", "on_timeout"}
        given = {
            field: value
            for field, value in self.model_dump(exclude=read_below).items()
            if value is not None
        }
        if "max_age" in given:
            given["max_age"] = parse_duration(given["max_age"], f"{where}.max_age")
        if isinstance(self.missing, WaitModel):
            given["missing"] = Wait(
                parse_duration(self.missing.wait, f"{where}.missing.wait"), self.missing.then
            )
        elif self.missing == "wait" and self.timeout is not None:  # the spelling before 0.2
            old = f"SideInputPipeline {where}: missing: wait with timeout:"
            warn_moved(old, "missing: {wait: ..., then: ...}", stacklevel=2)
            timeout = parse_duration(self.timeout, f"{where}.timeout")
            given["missing"] = Wait(timeout, self.on_timeout or "unmatched")
        grace = _optional_duration(self.grace, f"{where}.grace")
        if self.window is not None:
            window = self.window.window(f"{where}.window")
            if grace is not None and window.grace is None:  # the spelling before 0.2
                old = f"SideInputPipeline {where}: grace: beside window:"
                warn_moved(old, "window: {grace: ...}", stacklevel=2)
                window = dataclasses.replace(window, grace=grace)
                grace = None
            given["window"] = window
        if grace is not None:
            if self.as_of is None:
                raise DeclarationError(
                    f"SideInputPipeline {where}: grace: is an as_of map's; a side window "
                    "takes its own (window: {grace: ...}).",
                    fix=f"move grace: into {where}.window, or declare as_of:",
                )
            given["as_of"] = AsOf.column(self.as_of, grace=grace)
        factory: Callable[..., SideInput] = getattr(SideInput, self.view)
        try:
            return factory(self.asset, **given)
        except DeclarationError as exc:  # the same error, placed in the defs.yaml
            raise DeclarationError(
                f"SideInputPipeline {where}: {exc.message}", fix=exc.fix
            ) from exc


class RoutesModel(dg.Resolvable, dg.Model):
    """The operator's built-in routes, each an output of its own."""

    late: Output | None = Field(default=None, description="Records behind the watermark.")
    unmatched: Output | None = Field(default=None, description="No side row after waiting.")
    overflow: Output | None = Field(default=None, description="Pushed out of a full buffer.")
    invalid: Output | None = Field(default=None, description="Null key, unreadable record.")


_BUFFER = BufferLimits()  # the defaults are BufferLimits', declared there only
_DEFAULT: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(AssetsArguments)}
"""The Dagster factory's defaults, declared there only (core/options.py and assets.py)."""


class BufferModel(dg.Resolvable, dg.Model):
    """Bounds on the records waiting in the buffer (``BufferLimits``)."""

    max_rows: int | None = Field(default=_BUFFER.max_rows, description="Most buffered records.")
    max_age: Duration | None = Field(
        default=None if _BUFFER.max_age is None else _BUFFER.max_age.total_seconds(),
        description='Oldest a record may get (seconds, or e.g. "7d").',
    )
    on_exceed: Literal["fail", "overflow"] = Field(
        default=_BUFFER.on_exceed, description="Then what."
    )


class JobModel(dg.Resolvable, dg.Model):
    """The job that runs the operator (``build_side_input_job``)."""

    name: str | None = Field(default=None, description="Default: <name>_job.")
    trigger: Literal["available_now", "continuous"] = Field(
        default="available_now", description="Default trigger of its runs."
    )
    replay: list[str] = Field(
        default_factory=list,
        description="Routes to replay, each a job of its own (build_replay_job), e.g. "
        "[unmatched_payments].",
    )


class SensorModel(dg.Resolvable, dg.Model):
    """The sensor that requests a run when there is work (``build_side_input_sensor``)."""

    enabled: bool = Field(default=True, description="Build the sensor.")
    name: str | None = Field(default=None, description="Default: <name>_sensor.")
    minimum_interval_seconds: int = Field(default=30, description="Evaluation interval.")
    running: bool = Field(default=False, description="Start running when deployed.")


class ResourcesModel(dg.Resolvable, dg.Model):
    """The Spark session and where the tables live, when the project does not define
    them elsewhere (pipelines giving the same settings share one resource)."""

    spark: dict[str, Any] = Field(
        default_factory=dict, description="SparkResource fields, e.g. {master: local[2]}."
    )
    io_manager: dict[str, Any] = Field(
        description="DeltaIOManager fields but spark, e.g. {root: /data/lake}."
    )


@dg.scaffold_with(SideInputPipelineScaffolder)
class SideInputPipeline(dg.Component, dg.Resolvable, dg.Model):
    """A side-input operator over Delta tables: its outputs, checks, job and sensor.

    The same definitions ``@dsi.side_input_assets`` builds, declared in ``defs.yaml``:
    a multi-asset with one asset per output (each depending on the main input and every
    side input), its ``records_accounted_for`` check, the ``buffer_within_limits`` and
    ``side_inputs_ready`` checks (``build_side_input_checks``), a job
    (``build_side_input_job``), replay jobs of routes (``build_replay_job``) and a
    sensor (``build_side_input_sensor``). The function is the operator's
    (``fn(main, sides)``; ``fn(record, ctx)`` with ``mode: rows``), named as
    ``module:function``, or ``.module:function`` for a module in this component's
    folder. Durations are ``"90s"``, ``"30m"``, ``"1h"``, ``"1d"`` or seconds.

    The runs need a ``SparkResource`` (key ``spark``) and a ``DeltaIOManager`` (key
    ``io_manager``): give them under ``resources:``, or define them once for the project
    (``dg scaffold defs dagster.resources resources.py``).

    Examples:
        .. code-block:: yaml

            type: dagster_sideinputs.SideInputPipeline
            attributes:
              fn: .pipeline:enrich_payments
              main: {asset: payments, key: customer_id, event_time: ts}
              side_inputs:
                profile:
                  view: map
                  asset: profiles
                  key: customer_id
                  missing: {wait: 1h}
                rules: {view: singleton, asset: rules, readiness: fresh}
              main_output: enriched_payments
              side_outputs: [suspicious_payments]
              routes: {unmatched: unmatched_payments}
              job: {replay: [unmatched_payments]}
              resources:
                spark: {master: "local[2]"}
                io_manager: {root: "{{ context.project_root }}/data"}
    """

    fn: str = Field(
        description="The operator's function: module:function, or .module:function for a "
        "module next to this defs.yaml."
    )
    main: MainInputModel = Field(description="The main input.")
    side_inputs: dict[str, SideInputModel] = Field(
        default_factory=dict, description="Side inputs by the name the function uses."
    )
    main_output: Output = Field(description="The main output's asset.")
    side_outputs: list[Output] = Field(
        default_factory=list, description="Tagged outputs the function returns."
    )
    routes: RoutesModel = Field(default_factory=RoutesModel, description="Built-in routes.")
    window: WindowModel | None = Field(default=None, description="Main-input windows.")
    buffer: BufferModel = Field(default_factory=BufferModel, description="Buffer limits.")
    mode: Literal["frames", "rows"] = Field(default=_DEFAULT["mode"], description="Function mode.")
    name: str | None = Field(default=None, description="Op name (default: the function's).")
    group_name: str | None = Field(default=None, description="Asset group of the outputs.")
    description: str | None = Field(default=None, description="Shown on every output.")
    tags: dict[str, str] = Field(default_factory=dict, description="Tags of the outputs.")
    pool: str | None = Field(default=None, description="Dagster concurrency pool.")
    spark_resource_key: str = Field(
        default=_DEFAULT["spark_resource_key"], description="The SparkResource's key."
    )
    io_manager_key: str = Field(
        default=_DEFAULT["io_manager_key"], description="The DeltaIOManager's key."
    )
    job: JobModel = Field(default_factory=JobModel, description="The operator's job.")
    sensor: SensorModel = Field(default_factory=SensorModel, description="Its sensor.")
    resources: ResourcesModel | None = Field(
        default=None,
        description="SparkResource and DeltaIOManager settings, if not defined "
        "elsewhere in the project.",
    )

    def function(self, context: dg.ComponentLoadContext | None = None) -> Callable[..., Any]:
        """The operator's function, imported from its ``module:function`` reference."""
        module_name, _, attr = self.fn.partition(":")
        if not attr or not module_name:
            raise DeclarationError(
                f"SideInputPipeline: fn is {self.fn!r}, not a module:function reference.",
                fix="fn: my_project.pipelines:enrich, or fn: .pipeline:enrich for a "
                "pipeline.py next to defs.yaml",
            )
        if module_name.startswith("."):
            if context is None:
                raise DeclarationError(
                    f"SideInputPipeline: fn {self.fn!r} is relative to a defs folder, and "
                    "there is none here.",
                    fix="name the module in full: fn: my_project.defs.pipeline:enrich",
                )
            module_name = context.defs_relative_module_name(context.path) + module_name
        fn = getattr(importlib.import_module(module_name), attr, None)
        if not callable(fn):
            raise DeclarationError(
                f"SideInputPipeline: module {module_name!r} has no function {attr!r}.",
                fix=f"define def {attr}(main, sides) in {module_name}, or correct fn",
            )
        return fn

    def assets_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``side_input_assets`` this declaration spells."""
        main = MainInput(
            self.main.asset, key=self.main.key, event_time=self.main.event_time,
            path=self.main.path,
        )  # fmt: skip
        routes = {route: _tag(getattr(self.routes, route)) for route in RoutesModel.model_fields}
        return {
            "main": main,
            "side_inputs": {name: s.side_input(name) for name, s in self.side_inputs.items()},
            "main_output": _tag(self.main_output),
            "side_outputs": [_tag(output) for output in self.side_outputs],
            "window": self.window.window("window") if self.window else None,
            "buffer": BufferLimits(
                max_rows=self.buffer.max_rows,
                max_age=_optional_duration(self.buffer.max_age, "buffer.max_age"),
                on_exceed=self.buffer.on_exceed,
            ),
            "mode": self.mode,
            "name": self.name,
            "group_name": self.group_name,
            "description": self.description,
            "tags": self.tags,
            "pool": self.pool,
            "spark_resource_key": self.spark_resource_key,
            "io_manager_key": self.io_manager_key,
            "routes": Routes(**routes),
        }

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return self.definitions(self.function(context))

    def definitions(self, fn: Callable[..., Any]) -> dg.Definitions:
        """The assets, checks, jobs and sensor of this declaration around ``fn``."""
        assets_def = side_input_assets(**self.assets_kwargs())(fn)
        decl = declaration_of(assets_def)
        job = build_side_input_job(assets_def, name=self.job.name, trigger=self.job.trigger)
        replays = [build_replay_job(assets_def, route) for route in self.job.replay]
        sensors = []
        if self.sensor.enabled:
            sensors.append(
                build_side_input_sensor(
                    assets_def,
                    job=job,
                    name=self.sensor.name,
                    minimum_interval_seconds=self.sensor.minimum_interval_seconds,
                    default_status=dg.DefaultSensorStatus.RUNNING
                    if self.sensor.running
                    else dg.DefaultSensorStatus.STOPPED,
                )
            )
        return dg.Definitions(
            assets=[assets_def],
            asset_checks=[build_side_input_checks(assets_def)],
            jobs=[job, *replays],
            sensors=sensors,
            resources=self._resources(decl.spark_resource_key, decl.io_manager_key),
        )

    def _resources(self, spark_key: str, io_key: str) -> dict[str, Any]:
        if self.resources is None:
            return {}
        spark = _shared(SparkResource, self.resources.spark)
        io_manager = _shared(DeltaIOManager, {**self.resources.io_manager, "spark": spark})
        return {spark_key: spark, io_key: io_manager}


_SHARED: dict[str, Any] = {}


def _shared(kind: type, settings: dict[str, Any]) -> Any:
    """One resource object per kind and settings: Dagster refuses two different objects
    under one key, and pipelines of a project give the same ``resources:`` block."""
    key = f"{kind.__name__}:{sorted((k, repr(v)) for k, v in settings.items())}"
    if key not in _SHARED:
        _SHARED[key] = kind(**settings)
    return _SHARED[key]
