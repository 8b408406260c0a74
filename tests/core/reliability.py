"""Helpers of the issue-10 tests (recovery, state identity, declaration changes).

Input tables are written with delta-rs from Arrow (no Spark job: these tests make many
small tables), and every expected failure is checked the same way: its class, the names
it must mention, and the fix it suggests.
"""

import contextlib
import datetime as dt
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import dagster_sideinputs as dsi
from tests.core.conftest import Lake

UTC = dt.timezone.utc
_TYPES = {
    "long": pa.int64(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


def arrow_schema(ddl: str) -> pa.Schema:
    """``"tx_id long, name string"`` as an Arrow schema (the few types the tests use)."""
    fields = []
    for part in ddl.split(","):
        name, kind = part.split()
        fields.append(pa.field(name, _TYPES[kind.lower()]))
    return pa.schema(fields)


def put(
    lake: Lake,
    name: str,
    rows: Iterable[tuple],
    ddl: str,
    *,
    mode: str = "append",
    **options: Any,
) -> None:
    """Append (or overwrite) rows of a Delta table under the lake with delta-rs."""
    schema = arrow_schema(ddl)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    table = pa.table(
        [pa.array(list(values), type=f.type) for values, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
    if mode == "overwrite":
        options.setdefault("schema_mode", "overwrite")
    write_deltalake(lake.storage.table_uri(name), table, mode=mode, **options)


@contextlib.contextmanager
def refused(
    cls: type[dsi.SideInputError], *names: str, fix: str | Sequence[str] = ()
) -> Iterator[pytest.ExceptionInfo]:
    """Expect ``cls`` (exactly, not a subclass) whose message names every one of ``names``
    and whose fix contains every one of ``fix``."""
    with pytest.raises(dsi.SideInputError) as caught:
        yield caught
    error = caught.value
    assert type(error) is cls, f"{type(error).__name__} instead of {cls.__name__}: {error}"
    for name in names:
        assert name in error.message, f"{name!r} not named in: {error.message}"
    wanted = [fix] if isinstance(fix, str) else list(fix)
    for text in wanted:
        assert error.fix is not None, f"no fix in: {error}"
        assert text in error.fix, f"fix lacks {text!r}: {error.fix}"


def fix_of(error: BaseException) -> str:
    assert isinstance(error, dsi.SideInputError)
    return error.fix or ""


def mentions(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.S) is not None
