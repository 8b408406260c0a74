"""A batch builds no expression Spark warns about: the operator's own plans are clean,
so what a user sees in their log is theirs (issue: "WARN Column: Constructing trivially
true equals predicate, ''' == '''" on every batch of a function without a join)."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

import dagster_sideinputs as dsi
from tests.core.catalogue import PROFILES, T0, TXT, hours, put
from tests.core.conftest import Clock, Lake

COLUMN_LOGGER = "org.apache.spark.sql.Column"


@contextlib.contextmanager
def jvm_warnings(spark: SparkSession, logger: str, path: Path) -> Iterator[Path]:
    """Copies the WARN lines of one JVM logger into ``path`` while the block runs (the
    tests' session logs at ERROR, so they would otherwise go nowhere)."""
    jvm = spark._jvm  # type: ignore[attr-defined]
    log4j = jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    layout = log4j.core.layout.PatternLayout.newBuilder().withPattern("%p %c{1}: %m%n").build()
    appender = (
        log4j.core.appender.FileAppender.newBuilder()
        .withFileName(str(path))
        .setName("dsi-test-warnings")
        .setLayout(layout)
        .build()
    )
    appender.start()
    before = log4j.LogManager.getLogger(logger).getLevel()
    log4j.core.config.Configurator.setLevel(logger, log4j.Level.WARN)
    config = context.getConfiguration().getLoggerConfig(logger)
    config.addAppender(appender, log4j.Level.WARN, None)
    context.updateLoggers()
    try:
        yield path
    finally:
        config.removeAppender("dsi-test-warnings")
        log4j.core.config.Configurator.setLevel(logger, before)
        context.updateLoggers()
        appender.stop()


def _names(main, sides):
    return main.select("tx_id", main["profile"]["name"].alias("name"))


def test_a_batch_builds_no_trivially_true_predicate(lake: Lake, tmp_path):
    put(lake, "profiles", [(10, "ann")], PROFILES)
    put(lake, "transactions", [(1, 10, 1.0, T0), (2, 11, 2.0, T0)], TXT)
    side = dsi.SideInput.map("profiles", key="customer_id", missing=dsi.Wait(hours(1)))
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id", event_time="ts"),
        side_inputs={"profile": side},
        fn=_names,
        main_output="enriched",
        routes=dsi.Routes(unmatched=dsi.OutputTag("unmatched")),
    )
    with jvm_warnings(lake.spark, COLUMN_LOGGER, tmp_path / "warnings.log") as log:
        lake.run(op, Clock(T0 + hours(2)))
    written = log.read_text() if log.exists() else ""
    assert "trivially true" not in written, written
