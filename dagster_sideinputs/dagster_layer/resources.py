"""The Spark session as a Dagster resource."""

from typing import Any

import dagster as dg
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from dagster_sideinputs.core.spark.session import build_spark_session
from dagster_sideinputs.errors import DeclarationError


class SparkResource(dg.ConfigurableResource):
    """A configured SparkSession, started on first use.

    Compatible with ``dagster_pyspark.PySparkResource``: it exposes ``spark_session``
    and ``spark_context``, and takes extra settings in ``spark_config``. On top of it,
    it always applies the settings the Delta bridge needs (UTC session time zone,
    microsecond parquet timestamps), checks for Java 17+ before launching the JVM
    (a clear error instead of a hang), and picks shuffle partitions that suit the
    master.

    With ``remote=`` (Spark Connect) the JVM lives in the Connect server: ``app_name``,
    ``ui_enabled``, ``driver_memory`` and ``log_level`` are the server's settings, and
    ``spark_config`` may hold runtime SQL settings only (the resource fails naming any the
    server refuses). The operator and the IO manager work over Connect; ``spark_context``
    does not exist there. Local table paths must be the same files for this process and
    the server (the bridge commits from this process).

    Examples:
        .. code-block:: python

            defs = dg.Definitions(
                assets=[...],
                resources={
                    "spark": SparkResource(master="spark://10.0.0.5:7077",
                                           spark_config={"spark.executor.memory": "4g"}),
                },
            )
    """

    master: str = Field(
        default="local[*]",
        description="Spark master URL: local[*], local[2], spark://host:7077, yarn, ...",
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:15002). When set, `master` is ignored, and so "
        "are app_name, ui_enabled, driver_memory and log_level (the server's settings).",
    )
    app_name: str = Field(
        default="dagster-sideinputs", description="Application name shown in the Spark UI."
    )
    shuffle_partitions: int | None = Field(
        default=None,
        description="spark.sql.shuffle.partitions; default: two per core, of the local "
        "master or, on a cluster, of the executors registered when each batch starts.",
    )
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark settings, e.g. {'spark.executor.memory': '4g'}; over Spark "
        "Connect only runtime SQL settings (the session fails naming any the server refuses).",
    )
    ui_enabled: bool = Field(default=True, description="Start the Spark web UI.")
    driver_memory: str | None = Field(
        default=None, description="spark.driver.memory, e.g. '4g' (used when the JVM starts)."
    )
    log_level: str = Field(default="WARN", description="Spark log level.")
    # Optional[bool] rather than build_spark_session's `bool | "auto"`: Dagster's config
    # system takes no union of a bool and a string.
    delta: bool | None = Field(
        default=None,
        description="Configure Delta Lake for Spark (delta-spark's jar, SQL extension and "
        "catalog). Unset ('auto'): without it when its jar cannot be fetched (one warning; "
        "Delta tables then go through the delta-rs bridge); true: fail instead; false: leave "
        "it out. Over Spark Connect the server decides (true checks it has Delta).",
    )
    packages: list[str] = Field(
        default_factory=list,
        description="More Maven packages to load (spark.jars.packages): coordinates, or "
        "the short names 'kafka', 'avro' and 's3' (the versions matching this Spark), e.g. "
        "['kafka', 's3']. Not possible over Spark Connect.",
    )

    _session: SparkSession | None = PrivateAttr(default=None)

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    @property
    def spark_session(self) -> SparkSession:
        """The SparkSession (started, or reused if one is active, on first access)."""
        if self._session is None:
            self._session = build_spark_session(
                master=self.master,
                remote=self.remote,
                app_name=self.app_name,
                shuffle_partitions=self.shuffle_partitions,
                configs=self.spark_config,
                ui_enabled=self.ui_enabled,
                driver_memory=self.driver_memory,
                log_level=self.log_level,
                delta="auto" if self.delta is None else self.delta,
                packages=self.packages,
            )
        return self._session

    @property
    def spark_context(self) -> Any:
        """The SparkContext of the session.

        Raises:
            DeclarationError: over Spark Connect, which has no SparkContext.
        """
        if self.remote is not None:
            raise DeclarationError(
                f"SparkResource(remote={self.remote!r}) talks to a Spark Connect server, and "
                "Spark Connect has no SparkContext in the client: no sparkContext, RDDs, "
                "sc.broadcast or accumulators (the JVM runs in the server).",
                fix="use spark_session (DataFrame and SQL APIs work over Connect), or set "
                "master=... instead of remote=... to run the driver in this process",
            )
        return self.spark_session.sparkContext
