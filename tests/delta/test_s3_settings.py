"""One S3 configuration for delta-rs and Spark: where the settings come from, how they
become s3a settings, and the shared Spark session reaching the S3 test server with them."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.store.files import TableFiles, normalize_uri, spark_uri
from dagster_sideinputs.delta.store.s3 import (
    ENVIRONMENT_VARIABLES,
    SIMPLE_CREDENTIALS,
    TEMPORARY_CREDENTIALS,
    S3Store,
    configure_spark,
    resolve_storage_options,
)
from dagster_sideinputs.errors import DeclarationError
from tests.servers.s3 import ACCESS_KEY, SECRET_KEY

ENV = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "env-key",
    "AWS_SECRET_ACCESS_KEY": "env-secret",
    "AWS_REGION": "eu-west-1",
}


@pytest.fixture
def no_aws_environment(monkeypatch):
    for name in ENVIRONMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# --- where the settings come from ------------------------------------------------------


def test_store_from_the_environment_takes_the_usual_variables():
    store = S3Store.from_env(
        {
            **ENV,
            "AWS_ENDPOINT_URL_S3": "http://s3.local:9000",  # the SDKs' S3-specific one wins
            "AWS_SESSION_TOKEN": "env-token",
            "AWS_DEFAULT_REGION": "ignored-when-AWS_REGION-is-set",
            "AWS_ALLOW_HTTP": "",  # empty counts as unset
        }
    )
    assert store == S3Store(
        endpoint="http://s3.local:9000",
        access_key_id="env-key",
        secret_access_key="env-secret",
        session_token="env-token",
        region="eu-west-1",
    )
    assert S3Store.from_env({}) == S3Store()


def test_store_reads_every_spelling_delta_rs_accepts():
    store = S3Store.from_storage_options(
        {
            "aws_endpoint": "http://minio:9000",
            "Access_Key_Id": "k",
            "AWS_SECRET_ACCESS_KEY": "s",
            "token": "t",
            "default_region": "r",
            "allow_http": "TRUE",
            "AWS_S3_LOCKING_PROVIDER": "dynamodb",  # delta-rs's own: not about the store
        }
    )
    assert store == S3Store("http://minio:9000", "k", "s", "t", "r", True)


def test_storage_options_are_the_environment_overridden_by_explicit_options():
    resolved = resolve_storage_options(
        "s3://bucket/lake",
        {"endpoint": "http://other:9000", "AWS_S3_ALLOW_UNSAFE_RENAME": "false"},
        environ=ENV,
    )
    assert resolved == {
        "AWS_ENDPOINT_URL": "http://other:9000",
        "AWS_ACCESS_KEY_ID": "env-key",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_REGION": "eu-west-1",
        "AWS_ALLOW_HTTP": "true",  # an http:// endpoint
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",  # unknown to us: passed on to delta-rs
    }
    # Other roots keep exactly what was given, whatever the environment holds.
    assert resolve_storage_options("/data/lake", {"x": "1"}, environ=ENV) == {"x": "1"}
    assert resolve_storage_options("gs://bucket/lake", None, environ=ENV) == {}


def test_delta_storage_on_s3a_resolves_the_environment_and_names_tables_by_s3(monkeypatch):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    storage = dsi.DeltaStorage(root="s3a://bucket/lake/")
    assert storage.root == "s3://bucket/lake"
    assert storage.table_uri(["sales", "orders"]) == "s3://bucket/lake/sales/orders"
    assert spark_uri(storage.table_uri("orders")) == "s3a://bucket/lake/orders"
    assert storage.storage_options["AWS_SECRET_ACCESS_KEY"] == "env-secret"
    assert storage.delta.storage_options == storage.storage_options  # the engine's too
    explicit = dsi.DeltaStorage("s3://bucket/lake", {"AWS_SECRET_ACCESS_KEY": "given"})
    assert explicit.storage_options["AWS_SECRET_ACCESS_KEY"] == "given"
    assert normalize_uri("S3A://bucket/x") == "s3://bucket/x"


def test_local_roots_are_not_given_the_aws_environment(monkeypatch, tmp_path):
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    assert dsi.DeltaStorage(str(tmp_path)).storage_options == {}


# --- the s3a settings ----------------------------------------------------------------------


def test_s3a_settings_for_a_bucket_carry_the_same_values():
    store = S3Store(endpoint="http://127.0.0.1:9000", access_key_id="k", secret_access_key="s")
    prefix = "fs.s3a.bucket.lake."
    assert store.hadoop_settings("lake") == {
        prefix + "endpoint": "http://127.0.0.1:9000",
        prefix + "path.style.access": "true",
        prefix + "connection.ssl.enabled": "false",
        prefix + "endpoint.region": "us-east-1",  # delta-rs's default, made explicit
        prefix + "aws.credentials.provider": SIMPLE_CREDENTIALS,
        prefix + "access.key": "k",
        prefix + "secret.key": "s",
    }
    temporary = S3Store(access_key_id="k", secret_access_key="s", session_token="t")
    assert temporary.spark_conf() == {
        "spark.hadoop.fs.s3a.aws.credentials.provider": TEMPORARY_CREDENTIALS,
        "spark.hadoop.fs.s3a.access.key": "k",
        "spark.hadoop.fs.s3a.secret.key": "s",
        "spark.hadoop.fs.s3a.session.token": "t",
    }
    # No credentials: both libraries use AWS's default chain (instance profile, ...).
    assert S3Store(region="eu-west-1").hadoop_settings("b") == {
        "fs.s3a.bucket.b.endpoint.region": "eu-west-1"
    }
    hosted = S3Store(endpoint="https://s3.example.com", virtual_hosted_style=True)
    assert hosted.hadoop_settings()["fs.s3a.path.style.access"] == "false"
    assert hosted.storage_options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "true"
    assert "AWS_ALLOW_HTTP" not in hosted.storage_options


def test_secrets_stay_out_of_reprs():
    store = S3Store(
        endpoint="http://x:1",
        access_key_id="AKIA-VISIBLE?",
        secret_access_key="s3cr3t",
        session_token="t0k3n",
    )
    storage = dsi.DeltaStorage("s3://bucket/lake", store.storage_options)
    shown = repr(store) + repr(storage) + repr(storage.delta) + str(store)
    assert repr(store) == ("S3Store(endpoint='http://x:1', region=None, credentials='temporary')")
    for secret in ("AKIA-VISIBLE?", "s3cr3t", "t0k3n"):
        assert secret not in shown
    assert set(store.secrets()) == {"AKIA-VISIBLE?", "s3cr3t", "t0k3n"}


@pytest.mark.parametrize("char", ["*", "?", "[", "]", "{", "}", "\\", "#", "%"])
def test_roots_with_characters_spark_or_delta_rs_would_misread_are_refused(char):
    with pytest.raises(DeclarationError, match=r"(?s)storage root .* holds the characters") as e:
        dsi.DeltaStorage(root=f"s3://bucket/lake-a{char}b")
    assert repr(char) in str(e.value)
    assert "Fix: use letters" in str(e.value)


def test_roots_with_spaces_colons_and_plus_are_accepted():
    storage = dsi.DeltaStorage(root="s3://bucket/my lake:v1+x")
    assert storage.table_uri("t") == "s3://bucket/my lake:v1+x/t"


# --- the shared Spark session on the S3 test server ----------------------------------------


@pytest.mark.s3
def test_the_session_reaches_the_server_with_the_storages_own_settings(spark, s3_server):
    """configure_spark sets the bucket's s3a settings at run time: Spark then writes where
    delta-rs and pyarrow read, with no s3a setting given when the session started."""
    storage = dsi.DeltaStorage(s3_server.fresh_prefix("conf"), s3_server.storage_options)
    storage.configure_spark(spark)
    prefix = f"fs.s3a.bucket.{s3_server.bucket}."
    assert spark.conf.get(prefix + "endpoint") == s3_server.endpoint_url
    assert spark.conf.get(prefix + "access.key") == ACCESS_KEY
    target = spark_uri(storage.table_uri("plain"))
    spark.range(5).write.parquet(target)
    files = TableFiles(storage.table_uri("plain"), storage.storage_options)
    [part] = [e.path for e in files.list_files("") if e.path.endswith(".parquet")][:1]
    assert pq.read_table(pa.BufferReader(files.read_bytes(part))).num_rows >= 1
    assert spark.read.parquet(target).count() == 5
    configure_spark(spark, storage.root, storage.storage_options)  # again: nothing changes
    assert spark.conf.get(prefix + "secret.key") == SECRET_KEY


@pytest.mark.s3
def test_bridge_tables_on_s3_are_delta_tables_for_delta_rs(spark, s3_server):
    storage = dsi.DeltaStorage(
        s3_server.fresh_prefix("bridge").replace("s3://", "s3a://"), s3_server.storage_options
    )
    uri = storage.table_uri("orders")
    frame = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
    result = storage.delta.write(frame, uri, partition_by=["name"])
    assert (result.version, result.num_rows) == (0, 2)
    table = DeltaTable(uri, storage_options=storage.storage_options)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2]
    again = dsi.tables.read_table(spark, uri, storage_options=storage.storage_options)
    assert sorted(tuple(r) for r in again.collect()) == [(1, "a"), (2, "b")]


@pytest.mark.s3
def test_a_session_without_the_s3a_filesystem_is_named_with_the_fix(spark, s3_server):
    """hadoop-aws missing is a clear error, not a ClassNotFoundException mid-job. (Emulated
    on the shared session by pointing fs.s3a.impl at a class that does not exist.)"""
    spark.conf.set("fs.s3a.impl", "org.example.NoSuchFileSystem")
    try:
        with pytest.raises(DeclarationError, match="no s3a filesystem") as raised:
            configure_spark(spark, "s3://lake/x", s3_server.storage_options)
    finally:
        spark.conf.unset("fs.s3a.impl")
    assert 'packages=["s3"]' in str(raised.value)
