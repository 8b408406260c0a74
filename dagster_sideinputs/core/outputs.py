"""Outputs: output tags, what the user function receives (side input views) and
what it returns (tagged outputs)."""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from dagster_sideinputs.core.declarations import asset_path
from dagster_sideinputs.errors import DeclarationError, UndeclaredOutputTagError, did_you_mean


@dataclass(frozen=True)
class OutputTag:
    """The name of one output of the operator: one Dagster asset, one Delta table.

    Two tags are equal when their names are equal (the schema does not count).

    Args:
        name: asset name of the output (``"suspicious_transactions"`` or
            ``"payments/suspicious"``).
        schema: output schema; required in rows mode, where records are built in Python;
            in frames mode the function's DataFrame for this tag must have it (same
            columns and types, in any order).
        description: shown on the Dagster asset.

    Examples:
        >>> OutputTag("suspicious_transactions")
        OutputTag('suspicious_transactions')
    """

    name: str
    schema: T.StructType | None = field(default=None, compare=False, hash=False)
    description: str | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise DeclarationError(
                f"OutputTag names are strings, got {self.name!r}.", fix='OutputTag("name")'
            )
        asset_path(self.name)
        if self.schema is not None and not isinstance(self.schema, T.StructType):
            raise DeclarationError(
                f"OutputTag {self.name!r}: schema must be a pyspark StructType, "
                f"got {type(self.schema).__name__}.",
                fix='pass e.g. T.StructType([T.StructField("id", T.LongType())])',
            )

    def __repr__(self) -> str:
        return "MAIN" if self.name == _MAIN_NAME else f"OutputTag({self.name!r})"


@dataclass(frozen=True)
class Routes:
    """Where the records the operator routes itself go: each route a side output.

    A route left ``None`` does what the declaration says instead (a late record is
    processed with the windows it falls in, an unmatched one is what ``missing=`` says,
    a full buffer fails the batch, an invalid record fails it too).

    Args:
        late: records behind the watermark (windowed operators).
        unmatched: records whose side row did not come in time
            (``missing=Wait(..., then="unmatched")``, ``missing="unmatched"``,
            ``on_empty="unmatched"``).
        overflow: records pushed out of a full buffer (``BufferLimits(on_exceed="overflow")``).
        invalid: records the operator cannot process (a null or NaN key, a null event time,
            a corrupt line, a value that cannot be decoded).

    Examples:
        >>> Routes(unmatched=OutputTag("unmatched_transactions")).declared()
        {'unmatched': OutputTag('unmatched_transactions')}
    """

    late: OutputTag | None = None
    unmatched: OutputTag | None = None
    overflow: OutputTag | None = None
    invalid: OutputTag | None = None

    def __post_init__(self) -> None:
        for route, tag in self.declared().items():
            if isinstance(tag, str):
                object.__setattr__(self, route, OutputTag(tag))
            elif not isinstance(tag, OutputTag):
                raise DeclarationError(
                    f"Routes({route}=...) takes an OutputTag (or its name), got {tag!r}.",
                    fix=f'Routes({route}=dsi.OutputTag("{route}_records"))',
                )

    def declared(self) -> dict[str, OutputTag]:
        """The declared routes, by route name."""
        routes = {f.name: getattr(self, f.name) for f in fields(self)}
        return {route: tag for route, tag in routes.items() if tag is not None}


_MAIN_NAME = "__main__"
MAIN = OutputTag(_MAIN_NAME, description="The untagged main output of the operator.")
"""The main output. Use it as a key of the mapping a function returns: ``{MAIN: df}``."""

Outputs: TypeAlias = DataFrame | Mapping[OutputTag | str, DataFrame]
"""A frames-mode function returns the main output, or ``{MAIN: df, tag: df, ...}``."""


class SideInputs(Mapping[str, Any]):
    """The side inputs of a micro-batch, by name, as the function sees them.

    ``sides["rules"]`` is a singleton's row (or its default); any other view is a
    DataFrame of the side rows at the batch's pinned version (with a ``_dsi_side_ns``
    column for windowed side inputs). Keyed views are also already joined to the main
    records as a column named after the side input. Values are computed on first use.
    """

    def __init__(self, getters: Mapping[str, Callable[[], Any]]) -> None:
        self._getters = dict(getters)
        self._values: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._getters:
            raise DeclarationError(
                f"No side input named {name!r}; declared: {sorted(self._getters)}."
                + did_you_mean(name, self._getters),
                fix="use one of the names given in side_inputs={...}",
            )
        if name not in self._values:
            self._values[name] = self._getters[name]()
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._getters)

    def __len__(self) -> int:
        return len(self._getters)

    def __repr__(self) -> str:
        return f"SideInputs({sorted(self._getters)})"


def undeclared_tag_error(name: str, declared: Sequence[str]) -> UndeclaredOutputTagError:
    shown = sorted(n for n in declared if n != MAIN.name)
    return UndeclaredOutputTagError(
        f"The function emitted to output tag {name!r}, which is not declared. Declared side "
        f"outputs: {shown} (and MAIN).{did_you_mean(name, shown)} Nothing was written.",
        fix=f'add dsi.OutputTag("{name}") to side_outputs=[...], or emit to a declared tag',
    )


def resolve_tag(key: Any, declared: Mapping[str, OutputTag]) -> OutputTag:
    """The declared tag a mapping key refers to (a tag, MAIN, or a tag name)."""
    if isinstance(key, OutputTag):
        name = key.name
    elif isinstance(key, str):
        name = key
    else:
        raise DeclarationError(
            f"Output keys must be OutputTag objects or tag names, got {key!r}.",
            fix="return {dsi.MAIN: df, my_tag: other_df}",
        )
    if name not in declared:
        raise undeclared_tag_error(name, list(declared))
    return declared[name]


def normalize_outputs(result: Any, declared: Mapping[str, OutputTag]) -> dict[OutputTag, DataFrame]:
    """A function's return value as ``{tag: DataFrame}``, validated against the declared tags."""
    if isinstance(result, DataFrame):
        return {declared[MAIN.name]: result}
    if not isinstance(result, Mapping):
        raise DeclarationError(
            f"The function returned {_type_name(result)}; expected a Spark DataFrame (the "
            "main output) or a mapping {dsi.MAIN: df, tag: df}.",
            fix="return the main output as a Spark DataFrame (a pandas one: "
            "spark.createDataFrame(pdf)), or a dict of Spark DataFrames keyed by output tags",
        )
    outputs: dict[OutputTag, DataFrame] = {}
    for key, value in result.items():
        tag = resolve_tag(key, declared)
        if not isinstance(value, DataFrame):
            raise DeclarationError(
                f"Output {tag!r} is a {_type_name(value)}, not a Spark DataFrame.",
                fix="return Spark DataFrames for every tag",
            )
        outputs[tag] = value
    return outputs


def _type_name(value: Any) -> str:
    """``pandas.core.frame.DataFrame`` rather than a bare ``DataFrame``."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
