"""Side inputs: :class:`SideInput` and its four view factories (:class:`AsOf`: as_of.py).

``SideInput.singleton``, ``.list``, ``.map`` and ``.multimap`` take explicit, typed
keyword arguments (completion and type checking on the main vocabulary); an option a
view does not take is a ``DeclarationError`` naming the views that do.
"""

import dataclasses
import datetime as dt
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, ParamSpec, TypeVar

from pyspark.sql import Column

from dagster_sideinputs.core.declarations import (
    DISTRIBUTIONS,
    MISSING,
    ON_EMPTY,
    ON_TIMEOUT,
    READINESS,
    Distribution,
    KeyTranslator,
    Missing,
    OnEmpty,
    OnTimeout,
    Readiness,
    View,
    asset_path,
    check_choice,
)
from dagster_sideinputs.core.sideinputs.as_of import AsOf
from dagster_sideinputs.core.sideinputs.windows import Window, WindowMapping
from dagster_sideinputs.deprecations import warn_moved
from dagster_sideinputs.errors import DeclarationError, did_you_mean

_P = ParamSpec("_P")
_R = TypeVar("_R")
_FACTORY_OPTIONS: dict[str, set[str]] = {}


@dataclass(frozen=True)
class Wait:
    """``missing=Wait(timeout)``: a main record whose key has no side row waits in the
    buffer until the row arrives, or ``timeout`` passes; then it goes ``then``: to the
    ``unmatched`` route, or on, joined with nulls (``"null"``).

    Examples:
        >>> Wait(dt.timedelta(hours=1))
        Wait(timeout=datetime.timedelta(seconds=3600), then='unmatched')
    """

    timeout: dt.timedelta
    then: OnTimeout = "unmatched"

    def __post_init__(self) -> None:
        if not isinstance(self.timeout, dt.timedelta):
            raise DeclarationError(
                f"Wait(timeout=) takes a timedelta, got {self.timeout!r}: records could "
                "wait forever.",
                fix="missing=dsi.Wait(timedelta(hours=1))",
            )
        if self.timeout <= dt.timedelta(0):
            raise DeclarationError(f"Wait: timeout must be positive, got {self.timeout}.")
        check_choice(self.then, ON_TIMEOUT, "then", "Wait(...)")


MOVED_OPTIONS: dict[str, str] = {
    "timeout": "missing=dsi.Wait(timeout, then=...)",
    "on_timeout": "missing=dsi.Wait(timeout, then=...)",
    "window_mapping": "window=dsi.Window.tumbling(..., mapping=...)",
    "grace": "window=dsi.Window.tumbling(..., grace=...) or as_of=dsi.AsOf.column(..., grace=...)",
}
"""Options of the view factories before 0.2 that are now part of a group, and their new
spelling: they still work, with a ``DeprecationWarning`` once per option and view."""


def _fold_moved(view: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the options of :data:`MOVED_OPTIONS` out of ``kwargs`` (warning once); what
    ``missing="wait"`` needs becomes its :class:`Wait`, the rest is returned, to be set
    on the side input as it was before."""
    moved = {name: kwargs.pop(name) for name in list(kwargs) if name in MOVED_OPTIONS}
    for name in moved:
        warn_moved(f"SideInput.{view}({name}=...)", MOVED_OPTIONS[name], stacklevel=3)
    timeout, on_timeout = moved.pop("timeout", None), moved.pop("on_timeout", None)
    if kwargs.get("missing") == "wait" and timeout is not None:
        kwargs["missing"] = Wait(timeout, on_timeout or "unmatched")
    return {name: value for name, value in moved.items() if value is not None}


def _given_twice(where: str, name: str) -> DeclarationError:
    return DeclarationError(
        f"{where}: {name}= is given twice, on the side input and in its window= / as_of=.",
        fix="keep the one in window= / as_of=",
    )


def _checked_options(factory: Callable[_P, _R]) -> Callable[_P, _R]:
    """Unknown keyword arguments of a view factory become a DeclarationError saying which
    views take them (Python's TypeError would not)."""
    signature = inspect.signature(factory)
    view = factory.__name__
    _FACTORY_OPTIONS[view] = set(list(signature.parameters)[2:])

    @functools.wraps(factory)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        moved = _fold_moved(view, kwargs)
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            unknown = [k for k in kwargs if k not in signature.parameters]
            if not unknown:
                raise DeclarationError(f"SideInput.{view}(...): {exc}.") from None
            name = unknown[0]
            takers = sorted(v for v, options in _FACTORY_OPTIONS.items() if name in options)
            where = f"SideInput.{view}({args[1] if len(args) > 1 else '...'!r})"
            known = sorted(_FACTORY_OPTIONS[view])
            suggested = did_you_mean(name, [*known, *MOVED_OPTIONS])
            raise DeclarationError(
                f"{where}: {name}= "
                + (
                    f"only applies to {'keyed ' if takers == ['map', 'multimap'] else ''}"
                    f"{' / '.join(takers)} views"
                    if takers
                    else "is not an option of any view"
                )
                + f" (options of {view} views: {known}).{suggested}",
                fix=f"remove {name}=, or use SideInput.{takers[0]}(...)"
                if takers
                else f"use one of {known}",
            ) from None
        declared = factory(*args, **kwargs)
        for name in moved:
            if getattr(declared, name) is not None:
                where = f"SideInput.{view}({declared.asset!r})"  # type: ignore[attr-defined]
                raise _given_twice(where, name)
        return dataclasses.replace(declared, **moved) if moved else declared  # type: ignore[type-var]

    return checked


@dataclass(frozen=True)
class SideInput:
    """An additional, usually slowly changing input, seen through a view.

    Build one with :meth:`singleton`, :meth:`list`, :meth:`map` or :meth:`multimap`.

    Attributes:
        asset: asset name of the side Delta table.
        view: how the user function sees it.
        key: the side table's key column (map / multimap).
        readiness: when it may be used; by default ``complete`` for windowed side
            inputs, ``fresh`` when it has a freshness rule (``max_age`` here, a
            FreshnessPolicy in Dagster), else ``present``.
        distribution: ``broadcast`` ships the view to every task; ``keyed`` joins it by
            key without broadcasting; ``forwarded`` joins on ``forward_column``.
        key_translator: main-record expression giving the side key (a column name, a
            Column, or a function of the main DataFrame returning a Column). Without
            one, a map / multimap joins main records on the column named like ``key``;
            when main records have no such column, the function gets the whole view.
        missing: for keyed lookups, what happens to a main record whose key has no
            side row: ``"null"`` (joined with nulls), ``"unmatched"`` (to the unmatched
            route), or :class:`Wait` (buffered until the row arrives or its timeout
            passes). Read back, a wait is ``"wait"`` with ``timeout`` and
            ``on_timeout``.
        timeout / on_timeout: a :class:`Wait`'s ``timeout`` and ``then``.
        window: side windows (a time-window partitioned side asset), with their
            ``grace`` and ``mapping`` (:class:`~dagster_sideinputs.Window`).
        window_mapping: the side windows' ``mapping`` (read back from ``window``).
        max_age: freshness without Dagster: the table's last commit must be this recent.
        grace: when a side input's data becomes final by the batch clock, even if no
            later side data comes (declared on its ``window`` or ``as_of``, read back
            here): a side window ``grace`` after its end; for an ``as_of`` map, the data
            valid at a record's time ``grace`` after that time. Records then go on
            with what the side input holds (an empty window gives the view's empty
            value, or goes to ``unmatched`` with ``on_empty``).
        on_empty: a ready side namespace (a window) holding no rows: ``release``
            records with the view's empty value (null, ``[]``, the singleton's
            ``default``), or send them to the ``unmatched`` tag.
        as_of: temporal map: each main record sees, for its key, the side row valid
            at its event time (see :class:`AsOf`).
        default: a singleton's value when its namespace is ready but empty.
        pick: for a map with duplicate keys, keep the row with the greatest value of
            this column instead of failing.
        forward_column: the shared column of a ``forwarded`` distribution.
        path: table location when it is not ``<storage root>/<asset>``.
    """

    asset: str
    view: View
    key: str | None = None
    readiness: Readiness | None = None
    distribution: Distribution | None = None
    key_translator: Any = field(default=None, compare=False, hash=False)
    missing: "Missing | Wait" = "null"
    timeout: dt.timedelta | None = None
    on_timeout: OnTimeout = "unmatched"
    window: Window | None = None
    window_mapping: WindowMapping | None = field(default=None, compare=False, hash=False)
    max_age: dt.timedelta | None = None
    default: Any = field(default=None, compare=False, hash=False)
    pick: str | None = None
    forward_column: str | None = None
    path: str | None = None
    grace: dt.timedelta | None = None
    on_empty: OnEmpty = "release"
    as_of: AsOf | None = None

    def __post_init__(self) -> None:
        if isinstance(self.as_of, str):
            object.__setattr__(self, "as_of", AsOf.column(self.as_of))
        where = f"SideInput.{self.view}({self.asset!r})"
        self._unfold_groups(where)
        asset_path(self.asset)
        check_choice(self.view, ("singleton", "list", "map", "multimap"), "view", where)
        check_choice(self.readiness, READINESS, "readiness", where)
        check_choice(self.distribution, DISTRIBUTIONS, "distribution", where)
        check_choice(self.missing, MISSING, "missing", where)
        check_choice(self.on_timeout, ON_TIMEOUT, "on_timeout", where)
        if self.view in ("map", "multimap") and not self.key:
            raise DeclarationError(f"{where} needs key=<the side table's key column>.")
        if self.missing != "null" and self.view not in ("map", "multimap"):
            raise DeclarationError(
                f"{where}: missing={self.missing!r} only applies to keyed map/multimap views."
            )
        if self.missing == "wait" and self.timeout is None:
            raise DeclarationError(
                f"{where}: missing='wait' needs a timeout, or records could wait forever.",
                fix="missing=dsi.Wait(timedelta(hours=1)) (then= decides what follows)",
            )
        if self.timeout is not None and self.timeout <= dt.timedelta(0):
            raise DeclarationError(f"{where}: timeout must be positive, got {self.timeout}.")
        if self.max_age is not None and self.max_age <= dt.timedelta(0):
            raise DeclarationError(f"{where}: max_age must be positive, got {self.max_age}.")
        if self.distribution == "forwarded" and not self.forward_column:
            raise DeclarationError(
                f"{where}: distribution='forwarded' needs forward_column=<shared column>."
            )
        if self.window is not None and self.window.time_column is None:
            raise DeclarationError(
                f"{where}: a windowed side input needs the side table's time column.",
                fix="pass window=Window.tumbling(timedelta(hours=1), time_column='ts')",
            )
        if self.window_mapping is not None and self.window is None:
            raise DeclarationError(
                f"{where}: a window mapping needs side windows.",
                fix="declare window=dsi.Window.tumbling(..., mapping=...)",
            )
        if self.window_mapping is not None and not callable(self.window_mapping):
            raise DeclarationError(
                f"{where}: window_mapping= takes a function (start, end) -> (side_start, "
                f"side_end), got {type(self.window_mapping).__name__}.",
                fix="Window.tumbling(..., mapping=lambda start, end: (start - "
                "timedelta(hours=1), start)), "
                "or drop it for the default mapping",
            )
        translator = self.key_translator
        if translator is not None and not (
            isinstance(translator, str | Column) or callable(translator)
        ):
            raise DeclarationError(
                f"{where}: key_translator= takes a main column name, a Column or a function "
                f"of the main DataFrame returning a Column, got {type(translator).__name__}.",
                fix='key_translator="currency" or key_translator=lambda main: '
                "F.upper(main.currency)",
            )
        if self.pick is not None and self.view != "map":
            raise DeclarationError(f"{where}: pick= only applies to map views.")
        check_choice(self.on_empty, ON_EMPTY, "on_empty", where)
        if self.grace is not None and self.grace < dt.timedelta(0):
            raise DeclarationError(f"{where}: grace must be >= 0, got {self.grace}.")
        if self.grace is not None and self.window is None and self.as_of is None:
            raise DeclarationError(
                f"{where}: grace= says when a side window (or an as_of map's data) becomes "
                "final; this side input has neither window= nor as_of=.",
                fix="declare grace= on window=dsi.Window.tumbling(...) or "
                "as_of=dsi.AsOf.column(...)",
            )
        if self.as_of is not None:
            self._check_as_of(where)

    def _unfold_groups(self, where: str) -> None:
        """Keep a group's options as this side input's own fields (what the operator, its
        identity and its descriptions read), and the groups without them: a
        :class:`Wait`, a window's or an as_of's ``grace`` and a window's ``mapping``."""
        if isinstance(self.missing, Wait):
            if self.timeout is not None or self.on_timeout != "unmatched":
                raise DeclarationError(
                    f"{where}: missing=dsi.Wait(...) holds the timeout; timeout= and "
                    "on_timeout= say it again.",
                    fix="drop timeout= and on_timeout=",
                )
            wait = self.missing
            object.__setattr__(self, "missing", "wait")
            object.__setattr__(self, "timeout", wait.timeout)
            object.__setattr__(self, "on_timeout", wait.then)
        moved: dict[str, Any] = {}
        if isinstance(self.window, Window):
            moved["grace"] = self.window.grace
            moved["window_mapping"] = self.window.mapping
            object.__setattr__(
                self, "window", dataclasses.replace(self.window, grace=None, mapping=None)
            )
        if isinstance(self.as_of, AsOf) and self.as_of.grace is not None:
            moved["grace"] = self.as_of.grace
            object.__setattr__(self, "as_of", dataclasses.replace(self.as_of, grace=None))
        for name, value in moved.items():
            if value is None:
                continue
            if getattr(self, name) is not None:
                raise _given_twice(where, name)
            object.__setattr__(self, name, value)

    def _check_as_of(self, where: str) -> None:
        if not isinstance(self.as_of, AsOf):
            raise DeclarationError(
                f"{where}: as_of= takes a column name or a dsi.AsOf, got "
                f"{type(self.as_of).__name__}.",
                fix='as_of="valid_from", as_of=dsi.AsOf.column("valid_from", '
                'valid_to="valid_to") or as_of=dsi.AsOf.history()',
            )
        if self.view != "map":
            raise DeclarationError(f"{where}: as_of= only applies to map views.")
        if self.window is not None:
            raise DeclarationError(
                f"{where}: as_of= and window= both say which side rows a record sees; declare one.",
                fix="drop window= (the row valid at the record's event time is used)",
            )
        if self.distribution == "forwarded":
            raise DeclarationError(
                f"{where}: an as_of map joins by key; distribution='forwarded' does not apply.",
                fix="use distribution='keyed' or 'broadcast'",
            )

    @classmethod
    @_checked_options
    def singleton(
        cls,
        asset: str,
        *,
        readiness: Readiness | None = None,
        default: Any = None,
        window: Window | None = None,
        on_empty: OnEmpty = "release",
        max_age: dt.timedelta | None = None,
        distribution: Distribution | None = None,
        forward_column: str | None = None,
        path: str | None = None,
    ) -> "SideInput":
        """One value (one row) per namespace; ``sides[name]`` is that row (or ``default``).

        Windowed: each record carries its window's row as a struct column named after
        the side input (``ctx.side_input(name)`` in rows mode). A ready window with no
        row gives ``default``, or an ``EmptySingletonError`` when there is none (or goes
        to ``unmatched`` with ``on_empty="unmatched"``); two rows are an error, checked
        before anything is written whether or not the function reads the value.
        """
        return cls(
            asset=asset, view="singleton", readiness=readiness, default=default, window=window,
            on_empty=on_empty, max_age=max_age,
            distribution=distribution, forward_column=forward_column, path=path,
        )  # fmt: skip

    @classmethod
    @_checked_options
    def list(
        cls,
        asset: str,
        *,
        readiness: Readiness | None = None,
        window: Window | None = None,
        on_empty: OnEmpty = "release",
        max_age: dt.timedelta | None = None,
        distribution: Distribution | None = None,
        forward_column: str | None = None,
        path: str | None = None,
    ) -> "SideInput":
        """All rows as a bag; ``sides[name]`` is a DataFrame of them.

        Windowed: each record carries the rows of its own side window (the operator's
        window mapping) as an array column named after the side input, sorted; in rows
        mode ``ctx.side_input(name)`` is that list.
        """
        return cls(
            asset=asset, view="list", readiness=readiness, window=window,
            on_empty=on_empty, max_age=max_age,
            distribution=distribution, forward_column=forward_column, path=path,
        )  # fmt: skip

    @classmethod
    @_checked_options
    def map(
        cls,
        asset: str,
        *,
        key: str,
        key_translator: KeyTranslator | None = None,
        missing: Literal["null", "unmatched"] | Wait = "null",
        pick: str | None = None,
        as_of: AsOf | str | None = None,
        readiness: Readiness | None = None,
        window: Window | None = None,
        on_empty: OnEmpty = "release",
        max_age: dt.timedelta | None = None,
        distribution: Distribution | None = None,
        forward_column: str | None = None,
        path: str | None = None,
    ) -> "SideInput":
        """Key -> one row; joined to each main record as a struct column.

        With ``as_of``, the row valid at the record's event time (see :class:`AsOf`).
        Windowed without a key relation: each record carries its window's whole map
        (a map column key -> row).
        """
        return cls(
            asset=asset, view="map", key=key, key_translator=key_translator, missing=missing,
            pick=pick, readiness=readiness,
            window=window, on_empty=on_empty,
            max_age=max_age, distribution=distribution, forward_column=forward_column,
            path=path, as_of=AsOf.column(as_of) if isinstance(as_of, str) else as_of,
        )  # fmt: skip

    @classmethod
    @_checked_options
    def multimap(
        cls,
        asset: str,
        *,
        key: str,
        key_translator: KeyTranslator | None = None,
        missing: Literal["null", "unmatched"] | Wait = "null",
        readiness: Readiness | None = None,
        window: Window | None = None,
        on_empty: OnEmpty = "release",
        max_age: dt.timedelta | None = None,
        distribution: Distribution | None = None,
        forward_column: str | None = None,
        path: str | None = None,
    ) -> "SideInput":
        """Key -> all rows of that key; joined to each main record as an array column.

        Windowed without a key relation: each record carries its window's whole
        multimap (a map column key -> sorted array of rows).
        """
        return cls(
            asset=asset, view="multimap", key=key, key_translator=key_translator,
            missing=missing, readiness=readiness,
            window=window, on_empty=on_empty,
            max_age=max_age, distribution=distribution, forward_column=forward_column,
            path=path,
        )  # fmt: skip

    def __repr__(self) -> str:
        extras = [f"key={self.key!r}"] if self.key else []
        for name in (
            "readiness", "distribution", "window", "pick", "forward_column", "as_of", "grace",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                extras.append(f"{name}={value!r}")
        if self.missing == "wait":
            extras.append(f"missing={Wait(self.timeout, self.on_timeout)!r}")  # type: ignore[arg-type]
        elif self.missing != "null":
            extras.append(f"missing={self.missing!r}")
        if self.max_age is not None:
            extras.append(f"max_age={self.max_age!r}")
        if self.on_empty != "release":
            extras.append(f"on_empty={self.on_empty!r}")
        return f"SideInput.{self.view}({self.asset!r}" + "".join(", " + e for e in extras) + ")"
