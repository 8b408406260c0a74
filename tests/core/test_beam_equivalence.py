"""The operator and Apache Beam (DirectRunner) give the same windowed side-input results.

The same main records and side rows go through a Beam pipeline (``beam.Map`` with side
input views) and through the operator, for global windows, fixed windows (equal,
smaller and larger main windows) and sliding ones (main and side windows sliding, a
fixed main window in sliding side windows), with an empty side window, and for the singleton,
list, dict (map) and multimap views, keyed (the record's key looked up) and whole (the
window's dict / multimap). Beam's side inputs here are bounded, so every side window is
final when the main records are processed; the operator declares ``grace=0`` and runs
with a clock after every window, which makes every side window final too.

Each record's views are summarized the same way on both sides (sorted lists, the value
of the record's key, ...). Rows mode is compared for every scenario; frames mode for
the windowed ones (with global windows, frames mode hands lists and whole maps over as
``sides[name]`` DataFrames, not per record).
"""

import datetime as dt
import glob
import json
import os
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

import dagster_sideinputs as dsi
from tests.core.conftest import T0, Clock

MINUTE = 60
HOUR = 3600
MAIN = [  # tx_id, currency, minutes after T0
    (1, "EUR", 10),
    (2, "USD", 50),
    (3, "EUR", 70),
    (4, "EUR", 160),  # hour 2: no side row
    (5, "USD", 200),
    (6, "GBP", 215),
]
SIDE = [  # ccy, value, minutes: hour 0, hour 1, (hour 2 empty), hour 3
    ("EUR", "a", 5),
    ("USD", "b", 20),
    ("EUR", "a2", 40),
    ("EUR", "c", 65),
    ("EUR", "d", 110),
    ("USD", "e", 190),
]
# The dict views' rows: one per key over all windows (Beam's AsDict keeps an arbitrary
# one of duplicate keys; the operator refuses them, or keeps the greatest with pick=).
DICT = [("EUR", "a", 5), ("USD", "c", 65), ("GBP", "e", 190)]
SINGLE = [("x", 5), ("z", 190)]  # hours 1 and 2 empty


def singles(side_size: int | None) -> list[tuple[str, int]]:
    """The singleton's rows: one per side window (the global window holds one)."""
    return SINGLE if side_size is not None else SINGLE[:1]


KEYS = sorted({ccy for ccy, _, _ in SIDE} | {ccy for _, ccy, _ in MAIN})
DEFAULT = "-"
VIEWS = ("list", "single", "dict", "multi", "dictw", "multiw")

# (main window, side window[, main slide, side slide]) in seconds; None: the global
# window; no slide: tumbling.
WINDOWS: dict[str, tuple[int | None, ...]] = {
    "global": (None, None),
    "equal_1h": (HOUR, HOUR),
    "smaller_main_15m_side_1h": (15 * MINUTE, HOUR),
    "larger_main_2h_side_1h": (2 * HOUR, HOUR),
    "smaller_main_1h_side_2h": (HOUR, 2 * HOUR),
    # Sliding side windows: of the side windows holding the main window's last instant,
    # Beam reads the earliest-starting one ([08:00, 10:00) reads [08:00, 10:00)).
    "sliding_2h_1h_both": (2 * HOUR, 2 * HOUR, HOUR, HOUR),
    "main_1h_side_sliding_2h_1h": (HOUR, 2 * HOUR, None, HOUR),
}


def record_key(tx_id: int, start: dt.datetime | None) -> str:
    """A main record's result key: its id, and its window's start in minutes after T0
    (a sliding main window gives a record one result per window)."""
    if start is None:
        return str(tx_id)
    offset = start.replace(tzinfo=dt.timezone.utc) if start.tzinfo is None else start
    return f"{tx_id}@{int((offset - T0).total_seconds()) // MINUTE}"


def beam_window(size: int, slide: int | None) -> Any:
    from apache_beam.transforms import window

    if slide is None or slide == size:
        return window.FixedWindows(size)
    return window.SlidingWindows(size, slide)


def summary(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True)


# --- Beam -----------------------------------------------------------------------------------


def beam_results(
    tmp: str,
    main_size: int | None,
    side_size: int | None,
    main_slide: int | None = None,
    side_slide: int | None = None,
    *,
    default: str | None = DEFAULT,
) -> dict[str, str]:
    """Each record's views through a Beam DirectRunner pipeline."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import window

    base = T0.timestamp()
    single = singles(side_size)

    def stamped(minutes_at: int):
        return lambda row: window.TimestampedValue(row, base + row[minutes_at] * MINUTE)

    def summarize(record, values, singleton, mapping, multimap, w=beam.DoFn.WindowParam):
        ccy = record[1]
        start = None if main_size is None else w.start.to_utc_datetime(has_tz=True)
        return (
            record_key(record[0], start),
            summary(
                {
                    "list": sorted(values),
                    # Beam's Python SDK gives this marker for an empty singleton without a
                    # default (its Java SDK fails the DoFn instead).
                    "single": "EMPTY"
                    if isinstance(singleton, beam.pvalue.EmptySideInput)
                    else singleton,
                    "dict": mapping.get(ccy),
                    "multi": sorted(multimap[ccy]),
                    "dictw": sorted(mapping.items()),
                    # Beam's runner-side multimap only looks keys up: ask for every key.
                    "multiw": sorted((k, sorted(multimap[k])) for k in KEYS if list(multimap[k])),
                }
            ),
        )

    out = os.path.join(tmp, "beam", f"{main_size}-{side_size}-{main_slide}-{side_slide}", "out")
    options = PipelineOptions(["--direct_num_workers=1"])
    with beam.Pipeline(runner="DirectRunner", options=options) as p:
        main = p | "main" >> beam.Create(MAIN) | "main time" >> beam.Map(stamped(2))
        side = p | "side" >> beam.Create(SIDE) | "side time" >> beam.Map(stamped(2))
        one = p | "single" >> beam.Create(single) | "single time" >> beam.Map(stamped(1))
        keyed = p | "dict" >> beam.Create(DICT) | "dict time" >> beam.Map(stamped(2))
        if main_size is not None:
            main = main | "main windows" >> beam.WindowInto(beam_window(main_size, main_slide))
        if side_size is not None:
            side_windows = beam_window(side_size, side_slide)
            side = side | "side windows" >> beam.WindowInto(side_windows)
            one = one | "single windows" >> beam.WindowInto(side_windows)
            keyed = keyed | "dict windows" >> beam.WindowInto(side_windows)
        pairs = side | "pairs" >> beam.Map(lambda row: (row[0], row[1]))
        dict_pairs = keyed | "dict pairs" >> beam.Map(lambda row: (row[0], row[1]))
        singleton_kwargs = {} if default is None else {"default_value": default}
        (
            main
            | "views"
            >> beam.Map(
                summarize,
                beam.pvalue.AsList(side | "values" >> beam.Map(lambda row: row[1])),
                beam.pvalue.AsSingleton(
                    one | "one value" >> beam.Map(lambda row: row[0]), **singleton_kwargs
                ),
                beam.pvalue.AsDict(dict_pairs),
                beam.pvalue.AsMultiMap(pairs),
            )
            | "json" >> beam.Map(json.dumps)
            | "write" >> beam.io.WriteToText(out)
        )
    found: dict[str, str] = {}
    for name in glob.glob(out + "*"):
        with open(name) as lines:
            for line in lines:
                key, views = json.loads(line)
                assert key not in found
                found[key] = views
    return found


# --- the operator ---------------------------------------------------------------------------

OUT = dsi.OutputTag(
    "views_out",
    schema=T.StructType(
        [
            T.StructField("tx_id", T.LongType()),
            T.StructField("start", T.TimestampType()),
            T.StructField("views", T.StringType()),
        ]
    ),
)


def views_rows(record, ctx):
    values = [r.val for r in ctx.side_input("list")]
    single = ctx.side_input("single")
    row = ctx.side_input("dict")
    multi = ctx.side_input("multi")
    dictw = ctx.side_input("dictw")
    multiw = ctx.side_input("multiw")
    yield {
        "tx_id": record.tx_id,
        "start": window.start if (window := getattr(record, "window", None)) else None,
        "views": json.dumps(
            {
                "list": sorted(values),
                "single": single["val"] if single is not None else None,
                "dict": row.val if row is not None else None,
                "multi": sorted(r.val for r in multi),
                "dictw": sorted([k, v.val] for k, v in dictw.items()),
                "multiw": sorted([k, sorted(r.val for r in rs)] for k, rs in multiw.items()),
            },
            sort_keys=True,
        ),
    }


def views_frames(main, sides):
    return main.select("tx_id", F.col("window.start").alias("start"), *VIEWS)


def frames_summary(row: Any) -> str:
    """A frames-mode output row (the joined view columns) summarized as Beam's."""
    return summary(
        {
            "list": sorted(r.val for r in row["list"]),
            "single": row["single"]["val"] if row["single"] is not None else None,
            "dict": row["dict"]["val"] if row["dict"] is not None else None,
            "multi": sorted(r.val for r in row["multi"]),
            "dictw": sorted([k, v.val] for k, v in row["dictw"].items()),
            "multiw": sorted([k, sorted(r.val for r in rs)] for k, rs in row["multiw"].items()),
        }
    )


def operator_window(size: int, slide: int | None, **kwargs: Any) -> dsi.Window:
    return dsi.Window(dt.timedelta(seconds=size), dt.timedelta(seconds=slide or size), **kwargs)


def side_inputs(
    side_size: int | None, side_slide: int | None = None, *, default: Any = DEFAULT
) -> dict[str, dsi.SideInput]:
    window = None if side_size is None else operator_window(side_size, side_slide, time_column="ts")
    final = {} if window is None else {"window": window, "grace": dt.timedelta(0)}
    keyed = {"key": "ccy", "key_translator": "currency"}
    single_default = None if default is None else {"val": default}
    return {
        "list": dsi.SideInput.list("side", **final),
        "single": dsi.SideInput.singleton("single", default=single_default, **final),
        "dict": dsi.SideInput.map("dict", **keyed, **final),
        "multi": dsi.SideInput.multimap("side", **keyed, **final),
        # No key relation: main records have no column "ccy".
        "dictw": dsi.SideInput.map("dict", key="ccy", **final),
        "multiw": dsi.SideInput.multimap("side", key="ccy", **final),
    }


def operator_results(
    lake,
    mode: str,
    main_size: int | None,
    side_size: int | None,
    main_slide: int | None = None,
    side_slide: int | None = None,
    *,
    default: Any = DEFAULT,
) -> dict[str, str]:
    lake.append(
        "tx",
        [(i, c, T0 + dt.timedelta(minutes=m)) for i, c, m in MAIN],
        "tx_id long, currency string, ts timestamp",
    )
    lake.append(
        "side",
        [(c, v, T0 + dt.timedelta(minutes=m)) for c, v, m in SIDE],
        "ccy string, val string, ts timestamp",
    )
    lake.append(
        "dict",
        [(c, v, T0 + dt.timedelta(minutes=m)) for c, v, m in DICT],
        "ccy string, val string, ts timestamp",
    )
    lake.append(
        "single",
        [(v, T0 + dt.timedelta(minutes=m)) for v, m in singles(side_size)],
        "val string, ts timestamp",
    )
    op = lake.operator(
        main=dsi.MainInput("tx", event_time="ts"),
        side_inputs=side_inputs(side_size, side_slide, default=default),
        fn=views_rows if mode == "rows" else views_frames,
        mode=mode,
        main_output=OUT if mode == "rows" else "views_out",
        window=None if main_size is None else operator_window(main_size, main_slide),
    )
    lake.run(op, Clock(T0 + dt.timedelta(days=1)))  # after every window: all final
    rows = dsi.tables.read_table(lake.spark, lake.storage.table_uri("views_out")).collect()
    keys = [record_key(row.tx_id, row.start if main_size is not None else None) for row in rows]
    assert len(set(keys)) == len(keys)
    if mode == "rows":
        return {key: row.views for key, row in zip(keys, rows, strict=True)}
    return {key: frames_summary(row) for key, row in zip(keys, rows, strict=True)}


@pytest.fixture(scope="module")
def beam(tmp_path_factory) -> dict[str, dict[int, str]]:
    """Beam's results for every window configuration (one pipeline each)."""
    tmp = str(tmp_path_factory.mktemp("beam"))
    return {name: beam_results(tmp, *sizes) for name, sizes in WINDOWS.items()}


def test_beam_results_cover_the_interesting_cases(beam):
    """The scenarios exercise what they claim: an empty side window, a missing key, a
    main window mapped to a side window it does not contain."""
    equal = {int(k.split("@")[0]): json.loads(v) for k, v in beam["equal_1h"].items()}
    assert equal[4] == {
        "list": [],
        "single": DEFAULT,
        "dict": None,
        "multi": [],
        "dictw": [],
        "multiw": [],
    }
    assert equal[1]["multi"] == ["a", "a2"]
    assert equal[5]["dict"] is None  # USD has a row, in another hour
    assert equal[6]["dict"] == "e"
    larger = {
        int(k.split("@")[0]): json.loads(v) for k, v in beam["larger_main_2h_side_1h"].items()
    }
    assert larger[1]["list"] == ["c", "d"]  # main [0h, 2h) reads side [1h, 2h)
    sliding = {k: json.loads(v) for k, v in beam["sliding_2h_1h_both"].items()}
    # Record 3 (1h10) is in main windows [0h, 2h) and [1h, 3h); each reads the equal
    # side window, not the one starting an hour later.
    assert sliding["3@0"]["list"] == ["a", "a2", "b", "c", "d"]  # side [0h, 2h)
    assert sliding["3@60"]["list"] == ["c", "d"]  # side [1h, 3h)
    smaller = {k: json.loads(v) for k, v in beam["main_1h_side_sliding_2h_1h"].items()}
    assert smaller["1@0"]["list"] == ["a", "a2", "b"]  # main [0h, 1h) reads side [-1h, 1h)


# Frames mode per record only where side inputs are windowed: with global windows it
# hands lists and whole maps over as ``sides[name]`` DataFrames.
COMPARED = [("rows", name) for name in WINDOWS] + [
    ("frames", name) for name, sizes in WINDOWS.items() if sizes[1] is not None
]


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "windows"), COMPARED)
def test_the_operator_gives_what_beam_gives(lake, beam, mode, windows):
    assert operator_results(lake, mode, *WINDOWS[windows]) == beam[windows]


def test_an_empty_singleton_window_without_default_is_an_error_where_beam_python_marks_it(
    lake, tmp_path
):
    """Where Beam's Python SDK hands the function an ``EmptySideInput`` marker (its Java
    SDK throws), the operator stops the batch with an EmptySingletonError, as its
    contract says: a clear error rather than a value the function may not expect."""
    found = beam_results(str(tmp_path), HOUR, HOUR, default=None)
    assert json.loads(found["4@120"])["single"] == "EMPTY"
    with pytest.raises(dsi.errors.EmptySingletonError, match="2024-05-01T02:00:00Z"):
        operator_results(lake, "rows", HOUR, HOUR, default=None)
