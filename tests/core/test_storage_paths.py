"""Paths that are special on object stores: handled, or refused before anything is written.

What each character does in delta-rs and in Spark on S3 is recorded in
tests/delta/test_object_store.py and tests/delta/test_s3a_spark.py; here, the operator.
"""

import pytest
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from tests.core.conftest import Lake

pytestmark = pytest.mark.s3

TX = "tx_id long, customer_id long, amount double"


def enrich(main, sides):
    return main.select("tx_id", F.col("profile.name").alias("name"))


def operator(lake: Lake, **kwargs) -> dsi.SideInputOperator:
    return lake.operator(
        main=dsi.MainInput("transactions", key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id")},
        fn=enrich,
        main_output=kwargs.pop("main_output", "enriched"),
        **kwargs,
    )


def test_a_root_with_spaces_and_punctuation_works_on_s3(spark, s3_server):
    """Spaces, ``:``, ``+``, ``=``, ``,``, ``é``: each table lands in the folder named so,
    and Spark and delta-rs agree on it."""
    base = s3_server.fresh_prefix("paths")
    root = f"{base}/my lake:v1+a=b,é"
    lake = Lake(spark, dsi.DeltaStorage(root, s3_server.storage_options))
    lake.append("profiles", [(10, "ann")], "customer_id long, name string")
    lake.append("transactions", [(1, 10, 1.0), (2, 10, 2.0)], TX)
    op = operator(lake)
    assert lake.run(op).batches[0].released == 2
    assert lake.rows("enriched") == [(1, "ann"), (2, "ann")]
    assert lake.run(op).batches == []
    folders = {key.split("/")[1] for key in s3_server.keys(base)}
    assert folders == {"my lake:v1+a=b,é"}
    logs = [
        key for key in s3_server.keys(base) if key.endswith("_delta_log/00000000000000000000.json")
    ]
    assert {"enriched", "profiles", "transactions"} <= {key.split("/")[2] for key in logs}


@pytest.mark.parametrize("name", ["late#2", "late?x", "late[1]", "late%20x", "late{a}"])
def test_an_output_name_spark_or_delta_rs_would_misread_is_refused_before_any_write(
    spark, s3_server, name
):
    base = s3_server.fresh_prefix("refused")
    lake = Lake(spark, dsi.DeltaStorage(base, s3_server.storage_options))
    lake.append("profiles", [(10, "ann")], "customer_id long, name string")
    lake.append("transactions", [(1, 10, 1.0)], TX)
    before = s3_server.keys(base)
    with pytest.raises(dsi.DeclarationError, match=r"(?s)Output .* whose characters") as raised:
        operator(lake, side_outputs=[dsi.OutputTag(name)])
    assert "letters, digits" in str(raised.value)
    assert s3_server.keys(base) == before  # no table, no plan, no lock
