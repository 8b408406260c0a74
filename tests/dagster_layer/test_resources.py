"""SparkResource: the shared test session, reached through the Dagster resource."""

from collections.abc import Iterator

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from dagster_sideinputs.core.spark.packages import KAFKA
from dagster_sideinputs.dagster_layer.resources import SparkResource
from dagster_sideinputs.delta.spark.setup import is_delta_configured
from dagster_sideinputs.errors import SparkStartupError

PROBE = "spark.dsi.test.probe"


def local_resource(**config) -> SparkResource:
    """A resource whose getOrCreate returns the running test session unchanged."""
    return SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR", **config)


@pytest.fixture
def probe_unset(spark) -> Iterator[None]:
    yield
    spark.conf.unset(PROBE)


def test_resource_reuses_the_running_session(spark):
    assert local_resource().spark_session is spark


def test_resource_exposes_the_spark_context_of_its_session(spark):
    assert local_resource().spark_context is spark.sparkContext


def test_resource_builds_its_session_once(spark, probe_unset):
    resource = local_resource(spark_config={PROBE: "from the resource"})
    first = resource.spark_session
    spark.conf.set(PROBE, "changed since")
    assert resource.spark_session is first
    assert spark.conf.get(PROBE) == "changed since"


def test_spark_config_reaches_the_session(spark, probe_unset):
    session = local_resource(spark_config={PROBE: 42}).spark_session
    assert session.conf.get(PROBE) == "42"


def test_required_settings_win_over_spark_config(spark):
    session = local_resource(
        spark_config={"spark.sql.session.timeZone": "America/New_York"}
    ).spark_session
    assert session.conf.get("spark.sql.session.timeZone") == "UTC"


def test_resource_serves_an_asset_under_materialize(spark):
    @dg.asset
    def counted(spark: SparkResource) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"rows": spark.spark_session.range(5).count()})

    with dg.instance_for_test() as instance:
        result = dg.materialize([counted], resources={"spark": local_resource()}, instance=instance)
    [materialization] = result.asset_materializations_for_node("counted")
    assert materialization.metadata["rows"].value == 5


def test_resource_defaults_suit_a_local_deployment():
    resource = SparkResource()
    assert resource.master == "local[*]"
    assert resource.remote is None
    assert resource.shuffle_partitions is None
    assert resource.spark_config == {}
    assert resource.delta is None  # "auto"
    assert resource.packages == []


def test_every_resource_field_is_documented():
    undocumented = [
        name for name, field in SparkResource.model_fields.items() if not field.description
    ]
    assert undocumented == []


def test_resource_without_java_fails_with_startup_error(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkStartupError, match="Java 17"):
        _ = local_resource().spark_session


def test_resource_with_remote_url_fails_fast_with_startup_error(spark):
    with pytest.raises(SparkStartupError, match=r"sc://127\.0\.0\.1:1"):
        _ = SparkResource(remote="sc://127.0.0.1:1").spark_session
    assert SparkSession.getActiveSession() is spark


def test_delta_and_packages_come_from_run_config(spark):
    @dg.asset
    def delta_ready(spark: SparkResource) -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"delta": is_delta_configured(spark.spark_session)})

    config = {"master": "local[2]", "ui_enabled": False, "delta": True, "packages": [KAFKA]}
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [delta_ready],
            resources={"spark": SparkResource.configure_at_launch()},
            run_config={"resources": {"spark": {"config": config}}},
            instance=instance,
        )
    [materialization] = result.asset_materializations_for_node("delta_ready")
    assert materialization.metadata["delta"].value is True


def test_resource_with_packages_over_connect_fails_before_connecting():
    with pytest.raises(SparkStartupError, match="cannot be added over Spark Connect"):
        _ = SparkResource(remote="sc://127.0.0.1:1", packages=[KAFKA]).spark_session
