"""The main-record key of a keyed side input: the expression giving a main record's side
key (the key translator, or the column named like the side key), cast to the side key's
type only where no value can change on the way."""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from dagster_sideinputs.core.callbacks import callable_name, short
from dagster_sideinputs.core.columns import quoted
from dagster_sideinputs.core.spec import BoundSide
from dagster_sideinputs.errors import DeclarationError, SideInputError, did_you_mean

_NUMERIC = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.DecimalType,
    T.FloatType,
    T.DoubleType,
)


def main_key(bound: BoundSide, main: DataFrame, side_type: T.DataType) -> Column:
    """The main-record expression matching the side key (of type ``side_type``)."""
    return _cast_main_key(bound, _resolve_main_key(bound, main), main, side_type)


def _resolve_main_key(bound: BoundSide, main: DataFrame) -> Column:
    """The main-record expression giving the side key: the translator, or the same column."""
    translator = bound.side.key_translator
    if translator is None:
        assert bound.side.key is not None
        return F.col(quoted(bound.side.key))
    if isinstance(translator, str):
        if translator not in main.columns:
            raise DeclarationError(
                f"The key_translator of {bound.label} names column {translator!r}, which main "
                f"records do not have.{did_you_mean(translator, main.columns)}",
                fix="name a column of the main input, or pass a Column expression",
            )
        return F.col(quoted(translator))
    if isinstance(translator, Column):
        return translator
    try:
        result = translator(main)
    except SideInputError:
        raise
    except Exception as exc:
        raise DeclarationError(
            f"The key_translator {callable_name(translator)} of {bound.label} raised "
            f"{type(exc).__name__}: {exc}. Nothing was written; buffered records are intact.",
            fix="make it a function of the main DataFrame returning a Column, e.g. "
            "lambda main: F.upper(main.currency)",
        ) from exc
    if not isinstance(result, Column):
        raise DeclarationError(
            f"The key_translator {callable_name(translator)} of {bound.label} returned "
            f"{short(result)}, not a Column. Nothing was written; buffered records are intact.",
            fix="return a Column, e.g. lambda main: F.upper(main.currency)",
        )
    return result


_INTEGRAL_WIDTH: dict[type[T.DataType], int] = {
    T.ByteType: 1,
    T.ShortType: 2,
    T.IntegerType: 4,
    T.LongType: 8,
}


def _widens(main: T.DataType, side: T.DataType) -> bool:
    """Whether every value of the main key type is exactly a value of the side key type."""
    main_width, side_width = _INTEGRAL_WIDTH.get(type(main)), _INTEGRAL_WIDTH.get(type(side))
    if main_width is not None and side_width is not None:
        return main_width <= side_width
    if isinstance(side, T.DoubleType):
        return isinstance(main, T.FloatType) or (main_width is not None and main_width <= 4)
    if isinstance(side, T.DecimalType) and main_width is not None:
        return side.precision - side.scale >= {1: 3, 2: 5, 4: 10, 8: 19}[main_width]
    return False


def _cast_main_key(
    bound: BoundSide, expr: Column, main: DataFrame, side_type: T.DataType
) -> Column:
    try:
        key = bound.side.key
        if bound.side.key_translator is None and key in main.columns:
            main_type = main.schema[key].dataType  # the main's schema: no plan to analyse
        else:
            main_type = main.select(expr.alias("k")).schema["k"].dataType
    except Exception as exc:
        raise DeclarationError(
            f"{bound.label}: the main-record key expression cannot be evaluated on the main "
            f"input: {str(exc).splitlines()[0][:300]}",
            fix="fix key_translator= (or the main input's key column)",
        ) from exc
    if main_type == side_type:
        return expr
    if isinstance(main_type, _NUMERIC) and isinstance(side_type, _NUMERIC):
        if _widens(main_type, side_type):
            return expr.cast(side_type)
        # A cast that may lose the value (10.5 -> 10, or an overflow, an error under ANSI)
        # would match the wrong side row: a main key that does not survive the round trip
        # has no side row.
        narrowed = expr.try_cast(side_type)
        return F.when(narrowed.cast(main_type) == expr, narrowed)
    if isinstance(main_type, T.StringType | T.DateType | T.TimestampType) and type(
        main_type
    ) is type(side_type):
        return expr
    raise DeclarationError(
        f"{bound.label}: main records give a {main_type.simpleString()} key but the side key "
        f"{bound.side.key!r} is {side_type.simpleString()}; they would never match.",
        fix=f"pass key_translator=F.col(...).cast('{side_type.simpleString()}')",
    )
