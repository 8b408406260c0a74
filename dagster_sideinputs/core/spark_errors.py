"""Spark's errors, and the storage's, as the project's errors.

Errors raised inside Spark jobs (on executors) reach the driver as Py4J / PySpark
exceptions whose text holds the original. The operator's own checks inside Spark mark
their messages (``raise_error`` with a marker, or an encoded ``SideInputError`` raised in
a Python worker); this module recognises them and raises the matching
:class:`~dagster_sideinputs.errors.SideInputError` with its class, message and fix first.
A ``SideInputError`` raised by Python code inside a Spark job (a UDF calling the
project's code) is recognised in the Python traceback and raised again with its class.
Spark's own data errors (ANSI mode's bad casts, overflows, division by zero, and
``raise_error``) are the user's expressions failing on some record: a
:class:`FunctionError` naming what was being computed. Anything else becomes a
:class:`FunctionError` (the user's code) or a :class:`SparkJobError`, the Spark error
kept as the cause.

A filesystem or object-store failure outside Spark (an ``OSError`` of the operator's own
file access, an ``obstore`` error of the lease or a conditional write, delta-rs's store
errors) becomes a :class:`StorageError` naming the store, the operation and the path,
with a fix for its kind of fault (credentials refused, store unreachable, a path). A
commit that fails after other tables of the batch committed says which tables hold the
batch and which the next run's replay completes, instead of "nothing was written".
"""

import base64
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException

from dagster_sideinputs import errors
from dagster_sideinputs.core.columns import DUPLICATE_MARK, PRE_KEYED_MARK, ROW_ERROR_MARK
from dagster_sideinputs.core.sideinputs.joins import duplicate_error
from dagster_sideinputs.delta.store.errors import describe as describe_store_fault
from dagster_sideinputs.delta.store.errors import is_store_error
from dagster_sideinputs.delta.store.s3 import store_label
from dagster_sideinputs.errors import (
    CorruptDataFileError,
    DeclarationError,
    FunctionError,
    KafkaOffsetsLostError,
    PreKeyedViolationError,
    SideInputDataError,
    SideInputError,
    SparkJobError,
    StorageError,
)

if TYPE_CHECKING:
    from dagster_sideinputs.core.batch.context import StageContext, Views
    from dagster_sideinputs.core.spec import OperatorSpec

T = TypeVar("T")
_ENCODED = "dsi-encoded-error:"
NOTHING_WRITTEN = "Nothing was written; buffered records are intact."
NOTHING_LOST = (
    "Nothing is lost: what some table committed stays committed and is not written twice, "
    "and the batch's plan is kept, so the next run resumes exactly there."
)


def encode(error: SideInputError) -> str:
    """An executor-side error as text the driver can turn back into it."""
    payload = {"class": type(error).__name__, "message": error.message, "fix": error.fix}
    return _ENCODED + base64.b64encode(json.dumps(payload).encode()).decode() + ":end"


def _error_class(name: str) -> type[SideInputError]:
    cls = getattr(errors, name, SideInputError)
    if not (isinstance(cls, type) and issubclass(cls, SideInputError)):
        return SideInputError
    return cls


def _decode(text: str) -> SideInputError | None:
    match = re.search(re.escape(_ENCODED) + r"([A-Za-z0-9+/=]+):end", text)
    if match is None:
        return None
    payload = json.loads(base64.b64decode(match.group(1)))
    return _error_class(payload["class"])(payload["message"], fix=payload.get("fix"))


_RAISED_IN_PYTHON = re.compile(
    r"^dagster_sideinputs\.errors\.(\w+): (.*?)(?:\nFix: (.*?))?$", re.MULTILINE | re.DOTALL
)


def _raised_in_python(text: str) -> SideInputError | None:
    """One of the project's errors raised by Python code in a Spark job (its traceback's
    last line is ``dagster_sideinputs.errors.<Class>: <message>``, then ``Fix: ...``)."""
    found = None
    for line_start in re.finditer(r"^dagster_sideinputs\.errors\.\w+: ", text, re.MULTILINE):
        found = line_start.start()
    if found is None:
        return None
    tail = text[found:].split("\n\tat ", 1)[0].split("\n\n", 1)[0].rstrip()
    match = _RAISED_IN_PYTHON.match(tail)
    if match is None:
        return None
    name, message, fix = match.groups()
    return _error_class(name)(message.strip(), fix=fix.strip() if fix else None)


# Spark's errors of data, not of the job: SQLSTATE class 22 (ANSI mode's invalid casts,
# overflows, division by zero...) and raise_error's P0001.
_DATA_ERROR = re.compile(r"\[([A-Z_]+(?:\.[A-Z_]+)?)\][^\n]*?SQLSTATE: (22\w{3}|P0001)")
_FIELD_NOT_FOUND = re.compile(
    r"\[FIELD_NOT_FOUND\] No such struct field `([^`]*)` in (.*?)\.? SQLSTATE"
)


def _summary(text: str) -> str:
    """The informative part of a Spark error text: its error class line (or first
    exception line), and the root cause."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    head = next((line for line in lines if re.search(r"\[[A-Z_]+(\.[A-Z_]+)?\]", line)), None)
    if head is None:
        head = next((line for line in lines if "Exception: " in line), lines[0] if lines else "")
    head = re.sub(r"^(: )?[\w.$]+(Exception|Error): ", "", head)[:400]
    causes = [line for line in lines if line.startswith("Caused by: ")]
    if causes:
        root = re.sub(r"^Caused by: [\w.$]+: ", "", causes[-1])[:300]
        if root and root not in head:
            head += f" (cause: {root})"
    return head


def _extract(text: str, marker: str) -> str:
    start = text.find(marker)
    line = text[start + len(marker) :] if start >= 0 else text
    if not line.strip():
        return text[:500]
    # raise_error's message as Spark prints it, without the SQL state it appends
    return re.sub(r"\s*SQLSTATE: \w+\s*$", "", line.strip().splitlines()[0])[:500]


def _function_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def translate(
    context: "StageContext",
    exc: BaseException,
    views: "Views | None",
    *,
    what: str | None = None,
) -> SideInputError:
    """The project's error for a Spark failure of one batch (``what``: what the failed
    job was doing, e.g. ``"computing output 'alerts'"``)."""
    spec = context.spec
    text = str(exc)
    decoded = _decode(text) or _raised_in_python(text)
    if decoded is not None:
        return decoded
    doing = f" while {what}" if what else ""
    if DUPLICATE_MARK in text:
        name = text.split(DUPLICATE_MARK + ":", 1)[1].split()[0].strip("'\".,")
        if views is not None and name in views.joins:
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
            f"Operator {spec.operator_id!r}: Python code running in Spark failed{doing}: "
            f"{_python_error(text)}. {NOTHING_WRITTEN}",
            fix="fix the function (see the Python traceback in the cause), then rerun",
        )
    missing_field = _FIELD_NOT_FOUND.search(text)
    side = _side_lacking(views, missing_field) if missing_field else None
    if side is not None:
        return side
    data_error = _DATA_ERROR.search(text)
    if data_error is not None:
        return FunctionError(
            f"Operator {spec.operator_id!r}: a Spark expression failed on a record{doing}: "
            f"{_summary(text)}. {NOTHING_WRITTEN}",
            fix="fix the expression for the records it fails on (the function's, or a "
            "key_translator's): under Spark's ANSI mode bad casts, overflows and divisions "
            "by zero raise (try_cast / try_divide return null instead), then rerun",
        )
    if isinstance(exc, AnalysisException):
        return FunctionError(
            f"Operator {spec.operator_id!r}: Spark cannot plan the function's output: "
            f"{_summary(text)}. {NOTHING_WRITTEN}",
            fix="check the columns the function reads: main input columns, and side inputs "
            "joined as one column named after the side input",
        )
    return SparkJobError(
        f"Operator {spec.operator_id!r}: a Spark job of the batch failed{doing}: "
        f"{_summary(text)}. {NOTHING_WRITTEN}",
        fix="rerun: the batch is replayed from its plan; if it fails again, the cause above "
        "says why",
    )


def _side_lacking(views: "Views | None", found: re.Match[str]) -> SideInputError | None:
    """The error for a function reading a field its side input's table no longer has: the
    side input whose value columns are the struct's fields Spark lists."""
    if views is None:
        return None
    field, listed = found.group(1), found.group(2)
    fields = re.findall(r"`([^`]*)`", listed)
    for name in views.joins:
        data = views.data[name]
        if data.snapshot is None:
            continue
        columns = [c for c in data.snapshot.schema.fieldNames() if not c.startswith("_dsi_")]
        if columns == fields:
            return SideInputDataError(
                f"The function reads column {field!r} of {data.bound.label}, which its table "
                f"({data.bound.uri}) does not have at version {data.version} (columns: "
                f"{columns}). {NOTHING_WRITTEN}",
                fix=f"restore column {field!r} in the side asset, or change the function to "
                "read the columns it has",
            )
    return None


def _python_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", line):
            return line[:500]
    return lines[-1][:500] if lines else text[:500]


def translated(
    context: "StageContext",
    action: Callable[[], T],
    *,
    views: "Views | None" = None,
    what: str | None = None,
) -> T:
    """Run ``action``; Spark failures raise the project's errors (the original as cause)."""
    try:
        return action()
    except SideInputError:
        raise
    except (PySparkException, Py4JJavaError) as exc:
        raise translate(context, exc, views, what=what) from exc
    except Exception as exc:
        if not is_store_error(exc):
            raise
        raise store_failure(context, exc, what or "running a batch") from exc


def store_failure(context: "StageContext", exc: BaseException, doing: str) -> StorageError:
    """:func:`storage_error` for a store failure of one batch, naming the lake's store."""
    return storage_error(context.spec.operator_id, exc, doing, store=_store(context))


def _store(context: "StageContext") -> str:
    return store_label(context.spec.storage.root, context.spec.storage.storage_options)


def storage_error(
    operator_id: str,
    exc: BaseException,
    doing: str,
    *,
    store: str | None = None,
    subject: str | None = None,
) -> StorageError:
    """A filesystem or object-store failure outside Spark as the project's error: it names
    the store (``store``: the lake's root, with its endpoint), the operation and the path,
    and its fix says what to repair for the kind of fault (credentials, reachability, a
    path). ``subject`` replaces "Operator '<id>'" at its start (e.g. an asset's name)."""
    fault = describe_store_fault(exc)
    where = f" at {fault.path}" if fault.path else ""
    named = f" (store: {store})" if store else ""
    kind = {
        "credentials": " refused the credentials",
        "unreachable": " could not be reached",
        "path": " failed",
    }[fault.fault]
    target = store or fault.path or "the lake"
    fixes = {
        "credentials": f"give credentials that may read and write {target} (storage_options "
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, or the AWS_* "
        "environment variables; check that the key is active and its secret matches), "
        "then rerun: nothing of the batch is lost",
        "unreachable": f"make the store reachable ({target}: its endpoint, the network, the "
        "service up), then rerun: the run resumes where it stopped",
        "path": f"make {fault.path or target} readable and writable (a folder where one is "
        "expected, free space, permissions, the store reachable), then rerun",
    }
    error = StorageError(
        f"{subject or f'Operator {operator_id!r}'}: the lake's storage{kind}{where} while "
        f"{doing}{named}: {fault.reason.rstrip('.')}. {NOTHING_LOST}",
        fix=fixes[fault.fault],
    )
    for note in getattr(exc, "__notes__", ()):  # what failed after it (cleanups)
        error.add_note(note)
    return error


def partly_committed(
    context: "StageContext",
    exc: BaseException,
    *,
    batch_id: int,
    committed: list[str],
    rest: list[str],
    views: "Views | None" = None,
) -> BaseException:
    """The error of a commit that failed after other tables of the batch committed, with a
    message that says so (not "nothing was written"): those tables keep the batch, and the
    next run replays it for the others only. Errors the operator does not translate
    (an injected crash, an interrupt) are returned as they are."""
    if isinstance(exc, (PySparkException, Py4JJavaError)):
        error: SideInputError = translate(context, exc, views, what=f"committing {rest[0]!r}")
    elif is_store_error(exc):
        error = storage_error(
            context.spec.operator_id, exc, f"committing {rest[0]!r}", store=_store(context)
        )
    elif isinstance(exc, SideInputError):
        error = exc
    else:
        return exc
    told = error.message.replace(NOTHING_WRITTEN, "").replace(NOTHING_LOST, "").rstrip()
    return type(error)(
        f"{told} Batch {batch_id} is committed to {committed} but not to {rest}. Nothing is "
        "lost: the next run replays the batch from its plan for those tables only, and "
        "each table holds it once.",
        fix=error.fix,
    )


@contextmanager
def storage_errors(operator_id: str, doing: str, *, store: str | None = None) -> Iterator[None]:
    """Raise a filesystem or object-store failure of the block (an ``OSError``, an
    obstore error, delta-rs's store errors) as a :class:`StorageError` naming ``store``."""
    try:
        yield
    except SideInputError:
        raise
    except Exception as exc:
        if not is_store_error(exc):
            raise
        raise storage_error(operator_id, exc, doing, store=store) from exc


def lake_storage_errors(spec: "OperatorSpec", doing: str) -> Any:
    """:func:`storage_errors` naming the operator and its lake's store: for every entry
    point that reads or writes the lake outside a batch (the operator's state, the
    sensor, the checks, a run's metadata)."""
    storage = spec.storage
    return storage_errors(
        spec.operator_id, doing, store=store_label(storage.root, storage.storage_options)
    )
