"""Spark's errors as the project's errors.

Errors raised inside Spark jobs (on executors) reach the driver as Py4J / PySpark
exceptions whose text holds the original. The operator's own checks inside Spark mark
their messages (``raise_error`` with a marker, or an encoded ``SideInputError`` raised in
a Python worker); this module recognises them and raises the matching
:class:`~dagster_sideinputs.errors.SideInputError` with its class, message and fix first.
Anything else becomes a :class:`FunctionError` (the user's code) or a
:class:`SparkJobError`, the Spark error kept as the cause.
"""

import base64
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException

from dagster_sideinputs import errors
from dagster_sideinputs.core.columns import DUPLICATE_MARK, PRE_KEYED_MARK, ROW_ERROR_MARK
from dagster_sideinputs.errors import (
    CorruptDataFileError,
    DeclarationError,
    FunctionError,
    KafkaOffsetsLostError,
    PreKeyedViolationError,
    SideInputError,
    SparkJobError,
)

if TYPE_CHECKING:
    from dagster_sideinputs.core.context import StageContext, Views

T = TypeVar("T")
_ENCODED = "dsi-encoded-error:"
NOTHING_WRITTEN = "Nothing was written; buffered records are intact."


def encode(error: SideInputError) -> str:
    """An executor-side error as text the driver can turn back into it."""
    payload = {"class": type(error).__name__, "message": error.message, "fix": error.fix}
    return _ENCODED + base64.b64encode(json.dumps(payload).encode()).decode() + ":end"


def _decode(text: str) -> SideInputError | None:
    match = re.search(re.escape(_ENCODED) + r"([A-Za-z0-9+/=]+):end", text)
    if match is None:
        return None
    payload = json.loads(base64.b64decode(match.group(1)))
    cls = getattr(errors, payload["class"], SideInputError)
    if not (isinstance(cls, type) and issubclass(cls, SideInputError)):
        cls = SideInputError
    return cls(payload["message"], fix=payload.get("fix"))


def _extract(text: str, marker: str) -> str:
    start = text.find(marker)
    line = text[start + len(marker) :] if start >= 0 else text
    return line.strip().splitlines()[0][:500] if line.strip() else text[:500]


def _function_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def translate(context: "StageContext", exc: BaseException, views: "Views | None") -> SideInputError:
    """The project's error for a Spark failure of one batch."""
    spec = context.spec
    text = str(exc)
    decoded = _decode(text)
    if decoded is not None:
        return decoded
    if DUPLICATE_MARK in text:
        name = text.split(DUPLICATE_MARK + ":", 1)[1].split()[0].strip("'\".,")
        if views is not None and name in views.joins:
            from dagster_sideinputs.core.views import duplicate_error

            data = views.data[name]
            return duplicate_error(data.bound, views.joins[name], data.version)
    if PRE_KEYED_MARK in text:
        return PreKeyedViolationError(
            f"Main input {spec.main.asset!r} is declared pre-keyed, but "
            f"{_extract(text, PRE_KEYED_MARK + ':')}. {NOTHING_WRITTEN}",
            fix="fix the key-group column at the source, or drop pre_keyed=",
        )
    if "KAFKA_DATA_LOSS" in text:
        return KafkaOffsetsLostError(
            f"Main input {spec.main.asset!r}: Kafka records of this batch were deleted while it "
            f"read them: {_extract(text, 'KAFKA_DATA_LOSS')}. {NOTHING_WRITTEN}",
            fix="rerun: a batch no table committed is planned again from the offsets the "
            "brokers hold (and fails, or skips them with on_data_loss='skip'); keep records "
            "longer (retention.ms) than the operator can fall behind",
        )
    if ROW_ERROR_MARK in text:
        return FunctionError(
            f"Operator {spec.operator_id!r}: the row function {_function_name(spec.options.fn)} "
            f"raised {_extract(text, ROW_ERROR_MARK + ':')}. {NOTHING_WRITTEN}",
            fix="fix the function (it must yield dicts, Rows or tuples in the output's schema), "
            "then rerun: the batch is replayed from its plan",
        )
    missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", text)
    if missing:
        return DeclarationError(
            f"Operator {spec.operator_id!r}: Spark's executors cannot import module "
            f"{missing.group(1)!r}, needed to run the {spec.options.mode}-mode function "
            f"{_function_name(spec.options.fn)} (executors are other Python processes, which "
            f"import it by module name). {NOTHING_WRITTEN}",
            fix=f"install the package holding {missing.group(1)!r} in the executors' Python "
            "environment (the same as the driver's), or ship it with "
            "`spark.sparkContext.addPyFile(...)` / `--py-files`",
        )
    if "not a Parquet file" in text or "FileNotFoundException" in text:
        found = re.search(r"reading file (\S+?)\.?\s", text)
        where = found.group(1) if found else _extract(text, "")
        return CorruptDataFileError(
            f"Operator {spec.operator_id!r} cannot read data file {where} of main input "
            f"{spec.main.asset!r}: it is not a readable parquet file. {NOTHING_WRITTEN}",
            fix="move the file out of the landing folder (or restore it / repair the table), "
            "then rerun",
        )
    if "PythonException" in type(exc).__name__ or "PythonException" in text:
        return FunctionError(
            f"Operator {spec.operator_id!r}: Python code running in Spark failed: "
            f"{_python_error(text)}. {NOTHING_WRITTEN}",
            fix="fix the function (see the Python traceback in the cause), then rerun",
        )
    if isinstance(exc, AnalysisException):
        return FunctionError(
            f"Operator {spec.operator_id!r}: Spark cannot plan the function's output: "
            f"{_extract(text, '')}. {NOTHING_WRITTEN}",
            fix="check the columns the function reads: main input columns, and side inputs "
            "joined as one column named after the side input",
        )
    return SparkJobError(
        f"Operator {spec.operator_id!r}: a Spark job of the batch failed: "
        f"{_extract(text, '')}. {NOTHING_WRITTEN}",
        fix="rerun: the batch is replayed from its plan; if it fails again, the cause above "
        "says why",
    )


def _python_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", line):
            return line[:500]
    return lines[-1][:500] if lines else text[:500]


def translated(
    context: "StageContext", action: Callable[[], T], *, views: "Views | None" = None
) -> T:
    """Run ``action``; Spark failures raise the project's errors (the original as cause)."""
    try:
        return action()
    except SideInputError:
        raise
    except (PySparkException, Py4JJavaError) as exc:
        raise translate(context, exc, views) from exc
