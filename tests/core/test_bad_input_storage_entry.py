"""Bad-input catalogue, storage faults outside a run: the entry points that read the lake
without running the operator (the Dagster sensor's tick, the asset checks, a run's
metadata, ``reset``, a readiness provider's own reads) when the store refuses the
credentials or is down.

The store, the lake and the operator are test_bad_input_storage's (the credential-checking
S3 server behind a stoppable proxy). Every case: the store's failure ends as a
:class:`StorageError` naming the store, the operation and the fix (a sensor tick skips
with its text, an asset check fails with it), never obstore's or delta-rs's own
exception, and nothing is committed.
"""

from collections import Counter
from collections.abc import Iterator
from typing import Any

import dagster as dg
import obstore
import pytest
from pyspark.sql import DataFrame

import dagster_sideinputs as dsi
from dagster_sideinputs.dagster_layer.declaration import CHECK_BUFFER, CHECK_READY
from dagster_sideinputs.delta.store.object_store import open_object_store
from tests.core import test_bad_input_storage as storage_cases
from tests.core.catalogue import nothing_committed, refused
from tests.core.test_bad_input_storage import IDS, Store, enrich, exact, operator

pytestmark = pytest.mark.s3

# The guarded store (module-scoped: this module's own server and proxy, on its own bucket:
# Hadoop caches one s3a filesystem per bucket and JVM) and a fresh lake on it.
BUCKET = "guarded-entry"
store = storage_cases.store
lake = storage_cases.lake

SIDE = {"profile": dsi.SideInput.map("profiles", key="customer_id")}


@dsi.side_input_assets(
    main=dsi.MainInput("transactions", key="customer_id"),
    side_inputs=SIDE,
    main_output="enriched",
    side_outputs=[dsi.OutputTag("big")],
    operator_id="guarded",
)
def guarded(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    return enrich(main, sides)


sensor = dsi.build_side_input_sensor(guarded)
checks = dsi.build_side_input_checks(guarded)


def io_manager(lake: Any, store: Store, **wrong: str) -> dsi.DeltaIOManager:
    spark = dsi.SparkResource(master="local[2]", ui_enabled=False, log_level="ERROR")
    options = store.options(**wrong)
    return dsi.DeltaIOManager(
        root=lake.storage.root, storage_options=options, engine="delta-rs", spark=spark
    )


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as made:
        yield made


def tick(instance: dg.DagsterInstance, manager: dsi.DeltaIOManager) -> Any:
    with dg.build_sensor_context(instance=instance, resources={"io_manager": manager}) as context:
        return sensor.evaluate_tick(context)


def skipped(result: Any, *names: str) -> None:
    """A tick that requested nothing and skipped with the StorageError's text."""
    assert not result.run_requests, result.run_requests
    message = result.skip_message or ""
    assert message.startswith("Store unreachable: cannot read the operator's state"), message
    for name in (BUCKET, *names):
        assert name in message, (name, message)


# --- the sensor ---------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["down", "wrong-secret"])
def test_a_sensor_tick_skips_with_the_storage_error(lake, store, instance, fault):
    if fault == "down":
        with store.down():
            result = tick(instance, io_manager(lake, store))
        skipped(result, "could not be reached", "planning the next batch", "make the store")
    else:
        result = tick(instance, io_manager(lake, store, AWS_SECRET_ACCESS_KEY="not-the-secret"))
        skipped(result, "refused the credentials", "SignatureDoesNotMatch", "AWS_SECRET_ACCESS")
        assert "not-the-secret" not in result.skip_message
    again = tick(instance, io_manager(lake, store))  # the fix: the next tick asks for the run
    assert len(again.run_requests) == 1, again.skip_message


def test_a_sensor_tick_whose_store_goes_down_after_the_peek_skips(
    lake, store, instance, monkeypatch
):
    """The plan read, then the store gone: naming the work (a new batch), and saying why
    there is none (after a run), read the state again; both skip with the error."""
    peek = dsi.SideInputOperator.peek

    def store_gone_after(op: dsi.SideInputOperator, **kwargs: Any) -> Any:
        plan = peek(op, **kwargs)
        store.proxy.stop()
        return plan

    monkeypatch.setattr(dsi.SideInputOperator, "peek", store_gone_after)
    manager = io_manager(lake, store)
    try:
        skipped(tick(instance, manager), "could not be reached", "reading the batch plans")
    finally:
        store.proxy.start()
    guarded_op = guarded_operator(lake)
    lake.run(guarded_op)
    try:
        skipped(tick(instance, manager), "could not be reached", "reading the commit records")
    finally:
        store.proxy.start()


def guarded_operator(lake: Any) -> dsi.SideInputOperator:
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs=SIDE,
        fn=enrich,
        main_output="enriched",
        side_outputs=[dsi.OutputTag("big")],
        operator_id="guarded",
    )


# --- the asset checks ---------------------------------------------------------------------


def test_the_asset_checks_fail_with_the_storage_error_when_the_store_is_down(lake, store, instance):
    """A check the state cannot answer fails (severity WARN) with the error's text; the
    checks' step does not crash, and the next execution answers."""
    manager = io_manager(lake, store)
    resources = {"io_manager": manager, "spark": manager.spark}
    defs = dg.Definitions(assets=[guarded], asset_checks=[checks], resources=resources)
    job = defs.resolve_implicit_global_asset_job_def()
    keys = {dg.AssetCheckKey(dg.AssetKey("enriched"), name) for name in (CHECK_BUFFER, CHECK_READY)}
    alone = job.get_subset(asset_selection=set(), asset_check_selection=keys)
    with store.down():
        result = alone.execute_in_process(instance=instance, raise_on_error=False)
    assert result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {CHECK_BUFFER, CHECK_READY}
    for evaluation in evaluations.values():
        assert not evaluation.passed
        assert evaluation.severity == dg.AssetCheckSeverity.WARN
        text = evaluation.description or ""
        for name in (BUCKET, "could not be reached", "make the store"):
            assert name in text, (name, text)
        assert evaluation.metadata["error"].value == "StorageError"
    again = alone.execute_in_process(instance=instance)
    assert {e.check_name: e.passed for e in again.get_asset_check_evaluations()}[CHECK_BUFFER]


# --- the Dagster run's own reads, reset, a readiness provider -----------------------------


def test_a_dagster_run_with_the_store_down_fails_with_a_storage_error(lake, store, instance):
    """The run reads the output tables' versions before the operator runs: a
    StorageError, nothing committed, and the same run works once the store is back."""
    manager = io_manager(lake, store)
    resources = {"io_manager": manager, "spark": manager.spark}
    with (
        nothing_committed(lake, guarded_operator(lake)),
        store.down(),
        pytest.raises(Exception) as failure,  # noqa: PT011 (Dagster's wrapper)
    ):
        dg.materialize([guarded], resources=resources, instance=instance)
    chain = [failure.value]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    [error] = [e for e in chain if isinstance(e, dsi.SideInputError)]
    assert type(error) is dsi.StorageError, error
    for name in ("could not be reached", "reading the output tables' versions", BUCKET):
        assert name in error.message, (name, error.message)
    assert dg.materialize([guarded], resources=resources, instance=instance).success


def test_a_dagster_run_whose_store_goes_down_after_its_batches_committed_materializes(
    lake, store, instance, monkeypatch
):
    """The figures read after the batches committed (the tables' versions, the buffer) are
    left out with the error's text; the run succeeds and reports its materializations,
    which Dagster would otherwise never get (the next run has nothing to write)."""
    run = dsi.SideInputOperator.run

    def store_gone_after(op: dsi.SideInputOperator, *args: Any, **kwargs: Any) -> Any:
        result = run(op, *args, **kwargs)
        store.proxy.stop()
        return result

    monkeypatch.setattr(dsi.SideInputOperator, "run", store_gone_after)
    instance.report_runless_asset_event(dg.AssetMaterialization("profiles"))  # ready
    manager = io_manager(lake, store)
    resources = {"io_manager": manager, "spark": manager.spark}
    try:
        result = dg.materialize([guarded], resources=resources, instance=instance)
    finally:
        store.proxy.start()
    assert result.success
    events = {
        e.asset_key.to_user_string(): e.step_materialization_data.materialization
        for e in result.get_asset_materialization_events()
    }
    assert set(events) == {"enriched", "big"}
    metadata = {k: v.value for k, v in events["enriched"].metadata.items()}
    assert metadata["rows_written"] == 3
    text = metadata["figures_unavailable"]
    for name in ("could not be reached", BUCKET):
        assert name in text, (name, text)
    assert "delta_version" not in metadata
    assert Counter(r for (r,) in lake.rows("enriched", "tx_id")) == Counter(IDS)


def test_reset_with_the_store_down(lake, store):
    lake.run(operator(lake))
    with (
        nothing_committed(lake, operator(lake)),
        store.down(),
        refused(
            dsi.StorageError,
            BUCKET,
            "could not be reached",
            "taking the operator's lock",
            fix="make the store reachable",
        ),
    ):
        operator(lake).reset(main_from="keep")
    exact(lake)


class MarkerReadiness:
    """Ready once a ``_READY`` marker object exists next to the side table, read with
    obstore and its own credentials (which the store may refuse)."""

    def __init__(self, store: Store, root: str, **wrong: str) -> None:
        self.objects = open_object_store(root, store.options(**wrong))

    def decide(self, facts: Any, windows: Any, now: Any) -> dict[str, dsi.Decision]:
        listed = obstore.list(self.objects, "_READY").collect()
        return {"global": dsi.Decision(bool(listed), "marker")}


def test_a_readiness_provider_refused_by_the_store_is_a_storage_error(lake, store):
    """obstore's PermissionDeniedError from the provider's own read is the store's fault
    (a StorageError), not the provider's declaration (a DeclarationError)."""
    provider = MarkerReadiness(store, lake.storage.root, AWS_SECRET_ACCESS_KEY="not-the-secret")
    op = lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs=SIDE,
        fn=enrich,
        main_output="enriched",
        side_outputs=[dsi.OutputTag("big")],
        readiness=provider,
    )
    with refused(dsi.StorageError, BUCKET, "refused the credentials", fix="then rerun"):
        op.peek()
    with nothing_committed(lake, op), refused(dsi.StorageError, "refused the credentials"):
        lake.run(op)
