"""Helpers of the bad-input catalogue (``tests/core/test_bad_input_*.py``).

A case feeds the operator an input (or a declaration, or a function) a hostile user
would, and checks both halves of the promise:

- the failure: a :class:`~dagster_sideinputs.SideInputError` of the exact class, whose
  message names the asset / column / file and whose fix says what to do, with nothing
  committed by the failed batch;
- the accounting once the fix is applied and the operator rerun: every main-input
  record exactly once across the main output, the declared routes and the buffer.

Input tables are written with delta-rs from Arrow (no Spark job), so cases stay fast.
"""

import contextlib
import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.core.accounting import assert_accounted, placement
from tests.core.conftest import Lake

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, tzinfo=UTC)
TX = "tx_id long, customer_id long, amount double"
TXT = TX + ", ts timestamp"
PROFILES = "customer_id long, name string"
INVALID = dsi.OutputTag("invalid")
UNMATCHED = dsi.OutputTag("unmatched")
OVERFLOW = dsi.OutputTag("overflow")
ENRICHED = dsi.OutputTag(
    "enriched",
    schema=T.StructType(
        [T.StructField("tx_id", T.LongType()), T.StructField("name", T.StringType())]
    ),
)
MODES = ("frames", "rows")

_ARROW = {
    "long": pa.int64(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def hours(n: float) -> dt.timedelta:
    return dt.timedelta(hours=n)


def arrow_schema(ddl: str) -> pa.Schema:
    """``"tx_id long, `odd name` string"`` as an Arrow schema (the types the tests use;
    backticks quote names, doubled inside)."""
    fields = []
    for part in re.findall(r"\s*((?:`(?:[^`]|``)*`|[^,`])+)", ddl):
        match = re.fullmatch(r"\s*(`(?:[^`]|``)*`|\S+)\s+(\S+)\s*", part)
        assert match is not None, part
        name, kind = match.groups()
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        fields.append(pa.field(name, _ARROW[kind.lower()]))
    return pa.schema(fields)


def put(lake: Lake, name: str, rows: Iterable[tuple], ddl: str, *, mode: str = "append") -> None:
    """Append (or overwrite) rows of a Delta table under the lake, with delta-rs."""
    schema = arrow_schema(ddl)
    rows = list(rows)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    table = pa.table(
        [pa.array(list(values), type=f.type) for values, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
    options: dict[str, Any] = {"schema_mode": "overwrite"} if mode == "overwrite" else {}
    write_deltalake(lake.storage.table_uri(name), table, mode=mode, **options)


# --- the two halves of a case -------------------------------------------------------------


@contextlib.contextmanager
def refused(
    cls: type[dsi.SideInputError], *names: str, fix: str | Sequence[str] = ()
) -> Iterator[pytest.ExceptionInfo]:
    """Expect exactly ``cls`` (not a subclass, not a wrapper), naming every one of
    ``names`` in its message, with every one of ``fix`` in its fix."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 (the class is checked below)
        yield caught
    error = caught.value
    assert type(error) is cls, f"{type(error).__module__}.{type(error).__name__}: {error}"
    assert isinstance(error, dsi.SideInputError)
    for name in names:
        assert name in error.message, f"{name!r} not named in: {error.message}"
    for text in [fix] if isinstance(fix, str) else fix:
        assert error.fix is not None, f"no fix in: {error}"
        assert text in error.fix, f"fix lacks {text!r}: {error.fix}"


def versions(lake: Lake, op: dsi.SideInputOperator) -> dict[str, int | None]:
    """Every table the operator writes, at its latest version (None: not created)."""
    engine = lake.storage.delta
    found: dict[str, int | None] = {}
    for uri in op.spec.written_tables():
        found[uri] = engine.snapshot(uri).version if engine.exists(uri) else None
    return found


@contextlib.contextmanager
def nothing_committed(lake: Lake, op: dsi.SideInputOperator) -> Iterator[None]:
    """The block (a failing run) commits nothing to any table the operator writes.

    Checked also when the block raises, as it is meant to: an assertion after a bare
    ``yield`` never runs then (the error is thrown in at the ``yield``), and this helper,
    entered inside ``refused(...)``, checked nothing.
    """
    before = versions(lake, op)
    try:
        yield
    finally:
        after = versions(lake, op)
        assert after == before, f"the failing run committed: {before} -> {after}"


def accounted(lake: Lake, op: dsi.SideInputOperator, ids: Iterable[Any], **kwargs: Any) -> None:
    """Every id exactly once across the main output, the routes and the buffer."""
    assert_accounted(lake.spark, op, list(ids), **kwargs)


def placed(
    lake: Lake, op: dsi.SideInputOperator, expected: Mapping[Any, int], **kwargs: Any
) -> None:
    """Exactly ``expected[id]`` rows of each id across the main output, the routes and the
    buffer (a record released in several sliding windows has one row per window)."""
    found = placement(lake.spark, op, "tx_id", **kwargs)
    assert found == Counter(expected), f"found {dict(found)}, expected {dict(expected)}"


def rows_of(lake: Lake, name: str, *columns: str) -> list[tuple]:
    return lake.rows(name, *columns)


# --- functions, in both modes ---------------------------------------------------------------


def frames_enrich(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    """The main records' ids with the profile's name (when a profile side input is joined)."""
    name = F.col("profile.name") if "profile" in main.columns else F.lit(None).cast("string")
    return main.select("tx_id", name.alias("name"))


def rows_enrich(record: dsi.Record, ctx: Any) -> Iterator[dict[str, Any]]:
    try:
        profile = ctx.side_input("profile")
    except dsi.DeclarationError:
        profile = None
    yield {"tx_id": record["tx_id"], "name": profile["name"] if profile else None}


def operator(lake: Lake, mode: str = "frames", **kwargs: Any) -> dsi.SideInputOperator:
    """An operator over ``transactions`` (key ``customer_id``), the ``profile`` map side
    input and a main output ``enriched`` (``tx_id``, ``name``), in either mode."""
    kwargs.setdefault("main", dsi.MainInput("transactions", key="customer_id"))
    kwargs.setdefault("side_inputs", {"profile": dsi.SideInput.map("profiles", key="customer_id")})
    kwargs.setdefault("fn", frames_enrich if mode == "frames" else rows_enrich)
    kwargs.setdefault("main_output", ENRICHED)
    return lake.operator(mode=mode, **kwargs)
