"""Delta Lake for Spark (delta-spark): configuring a session builder, and telling whether a
session has it.

The jar is never named by hand: :func:`configure_delta` goes through delta-spark's own
``configure_spark_with_delta_pip`` (or, with ``jars_given``, the jars an earlier start of
the same packages resolved through it), which asks Maven for
``io.delta:delta-spark_<spark major.minor>_2.13:<installed delta-spark version>``, so the
pip package and the jar cannot drift apart (pyproject.toml pins delta-spark to a version
whose jar Maven Central serves). :func:`is_delta_configured` reads the session's settings,
so it works over Spark Connect too.
"""

import importlib.metadata
from collections.abc import Sequence

import pyspark
from delta.pip_utils import configure_spark_with_delta_pip
from pyspark.sql import SparkSession

DELTA_SQL_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
EXTENSIONS_KEY = "spark.sql.extensions"
CATALOG_KEY = "spark.sql.catalog.spark_catalog"


def delta_package() -> str:
    """The Maven coordinate ``configure_spark_with_delta_pip`` puts in ``spark.jars.packages``.

    Built the same way (installed delta-spark version, pyspark's major.minor, Scala
    2.13), so ``make install`` can fetch exactly the jar a session will ask for;
    tests/delta/test_delta_spark_smoke.py checks the two agree.
    """
    version = importlib.metadata.version("delta-spark")
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark_minor}_2.13:{version}"


def with_delta_extension(extensions: str | None) -> str:
    """A ``spark.sql.extensions`` value that keeps the ones set and adds Delta's once."""
    names = [name.strip() for name in (extensions or "").split(",") if name.strip()]
    if DELTA_SQL_EXTENSION not in names:
        names.append(DELTA_SQL_EXTENSION)
    return ",".join(names)


def configure_delta(
    builder: SparkSession.Builder,
    *,
    extensions: str | None = None,
    extra_packages: Sequence[str] = (),
    jars_given: bool = False,
) -> SparkSession.Builder:
    """Make a (classic, not Connect) builder start a session with Delta Lake.

    Sets ``spark.jars.packages`` to Delta's jar plus ``extra_packages`` (through
    ``configure_spark_with_delta_pip``, which replaces any earlier value: pass every
    other package here), Delta's SQL extension after ``extensions``, and Delta's catalog
    as ``spark_catalog``.

    Args:
        builder: a ``SparkSession.builder`` with master, app name and settings applied.
        extensions: the ``spark.sql.extensions`` the builder already has, kept first.
        extra_packages: other Maven coordinates (Kafka, S3A, ...).
        jars_given: the builder's ``spark.jars`` already names the jars an earlier start
            resolved for :func:`delta_package` plus ``extra_packages``; only the extension
            and the catalog are set.

    Returns:
        The same builder.
    """
    if not jars_given:
        builder = configure_spark_with_delta_pip(builder, extra_packages=list(extra_packages))
    return builder.config(EXTENSIONS_KEY, with_delta_extension(extensions)).config(
        CATALOG_KEY, DELTA_CATALOG
    )


def is_delta_configured(spark: SparkSession) -> bool:
    """Whether a live session runs with Delta's SQL extension and catalog.

    Reads ``spark.sql.extensions`` and ``spark.sql.catalog.spark_catalog`` through
    ``spark.conf``, so it answers for a Spark Connect session too (there, for the
    server's settings).
    """
    extensions = spark.conf.get(EXTENSIONS_KEY, None) or ""
    catalog = spark.conf.get(CATALOG_KEY, None)
    names = {name.strip() for name in extensions.split(",")}
    return DELTA_SQL_EXTENSION in names and catalog == DELTA_CATALOG
