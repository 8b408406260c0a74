"""Bad-input catalogue, issue 37 class 3: a decode that yields nothing is not a record.

For every source whose records the operator decodes (Kafka values as JSON, Avro,
string, bytes; landed JSON and CSV lines), each undecodable value (a tombstone, empty,
blank, not UTF-8, not of the schema, truncated Avro, none of the declared fields) stops
the batch without ``invalid=`` (naming the topic and offset, or the file, with the fix
that declares the route) and commits nothing; once the route is declared, every record
is in exactly one place (Kafka records counted by offset: undecodable ones have no id).
The rules: docs/DECISIONS.md, "A decode that yields nothing is not a record".
"""

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame

import dagster_sideinputs as dsi
from dagster_sideinputs.core.columns import CORRUPT
from dagster_sideinputs.core.sources.kafka.decode import decode
from tests.core.catalogue import INVALID, TX, accounted, nothing_committed, placed, refused
from tests.core.conftest import Lake
from tests.servers.kafka import KafkaBroker

FIX = "invalid=dsi.OutputTag"


def same(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
    return main


def enrich(lake: Lake, main: dsi.MainInput, **kwargs: Any) -> dsi.SideInputOperator:
    """Every main column to ``enriched``. No key and no side input: a record that decodes
    to nulls is then refused by nothing but the decode rules (a null key is invalid
    anyway)."""
    kwargs.setdefault("main_output", "enriched")
    return lake.operator(main=main, side_inputs={}, fn=same, **kwargs)


def refused_then_routed(
    lake: Lake,
    main: dsi.MainInput,
    names: Sequence[str],
    *,
    reasons: Sequence[str],
    column: str,
    ids: Sequence[Any],
    fix: Sequence[str] = (FIX,),
) -> list[str]:
    """Both halves of a case: the batch stops (naming ``names``) and commits nothing
    without ``invalid=``; with it, every id is once across the outputs and the buffer.
    Returns the invalid route's reasons."""
    op = enrich(lake, main)
    with nothing_committed(lake, op), refused(dsi.errors.MainInputDataError, *names, fix=fix):
        op.run(lake.spark)
    fixed = enrich(
        lake,
        main,
        routes=dsi.Routes(invalid=INVALID),
    )
    fixed.run(lake.spark)
    accounted(lake, fixed, ids, column=column)
    found = [r[0] for r in lake.rows("invalid", "reason")]
    for reason in reasons:
        assert any(reason in r for r in found), f"{reason!r} not in {found}"
    return found


# --- Kafka -------------------------------------------------------------------------------------

pytest_kafka = pytest.mark.kafka


def topic_of(broker: KafkaBroker, values: Sequence[bytes | str | None]) -> str:
    """A one-partition topic holding ``values`` at offsets 0.. (keys: "k<offset>")."""
    name = broker.create_topic(broker.unique_topic("decode"), 1)
    broker.produce(name, [(f"k{i}", v) for i, v in enumerate(values)], partition=0)  # type: ignore[misc]
    return name


def kafka(broker: KafkaBroker, name: str, **options: Any) -> dsi.MainInput:
    options.setdefault("schema", TX)
    return dsi.MainInput.kafka(name, bootstrap_servers=broker.bootstrap_servers, **options)


def good(tx_id: int) -> str:
    return json.dumps({"tx_id": tx_id, "customer_id": tx_id % 3, "amount": 1.0})


@pytest_kafka
def test_kafka_json_empty_and_blank_values_are_invalid(lake, kafka_broker):
    # The issue's example: b"" (and whitespace) was released with every field null.
    # (Spark parses "\v" and "\f" into a corrupt record, the others into nothing.)
    name = topic_of(kafka_broker, [good(0), b"", "  \n\t", "\x0b\x0c ", good(4)])
    reasons = refused_then_routed(
        lake,
        kafka(kafka_broker, name),
        [name, f"{name}[0]@1: empty value"],
        reasons=[
            f"{name}[0]@1: empty value",
            f"{name}[0]@2: blank value",
            f"{name}[0]@3: blank value",
        ],
        column="kafka_offset",
        ids=range(5),
        fix=[FIX, "Kafka record cannot be corrected in place"],
    )
    assert len(reasons) == 3
    assert sorted(lake.rows("enriched", "tx_id")) == [(0,), (4,)]


@pytest_kafka
def test_kafka_json_that_is_no_object_of_the_schema_is_invalid(lake, kafka_broker):
    values = [
        good(0),
        "null",
        "5",
        '[{"tx_id": 2, "customer_id": 1}]',
        "{}",  # no field of the schema
        '{"TX_ID": 5, "Customer_Id": 1}',  # names of another schema (case differs)
        '{"tx_id": null, "customer_id": null, "amount": null}',  # every field null
        good(7),
    ]
    name = topic_of(kafka_broker, values)
    refused_then_routed(
        lake,
        kafka(kafka_broker, name),
        [name, f"{name}[0]@1: null"],
        reasons=[
            f"{name}[0]@2: 5",
            f"{name}[0]@3: [",
            f"{name}[0]@4: no field of the declared schema (tx_id, customer_id, amount)",
            f"{name}[0]@5: no field",
            f"{name}[0]@6: no field",
        ],
        column="kafka_offset",
        ids=range(len(values)),
    )
    assert len(lake.rows("invalid")) == 6


@pytest_kafka
def test_kafka_json_field_present_but_mistyped_is_invalid_and_absent_is_null(lake, kafka_broker):
    values = [
        '{"tx_id": 0, "customer_id": 0}',  # amount absent: null, a record
        '{"tx_id": 1, "customer_id": 1, "amount": "one"}',
        '{"tx_id": 2, "customer_id": 1.5, "amount": 1}',
        '{"tx_id": 99999999999999999999, "customer_id": 1}',  # overflows a long
        b'{"tx_id": 4, "customer_id": 1, "amount": 1, "note": "\xff\xfe"}',  # not UTF-8
    ]
    name = topic_of(kafka_broker, values)
    kafka_broker.produce(name, [(b"\xff\xfe", good(5))], partition=0)  # a key not UTF-8
    refused_then_routed(
        lake,
        kafka(kafka_broker, name),
        [name, f"{name}[0]@1"],
        reasons=[
            f"{name}[0]@1: {{",
            f"{name}[0]@3: {{",
            f"{name}[0]@4: value is not UTF-8",
            f"{name}[0]@5: key is not UTF-8 text: 0xFFFE",
        ],
        column="kafka_offset",
        ids=range(len(values) + 1),
    )
    assert lake.rows("enriched", "tx_id", "amount") == [(0, None)]


@pytest_kafka
def test_kafka_string_and_bytes_tombstones_and_non_utf8_strings_are_invalid(lake, kafka_broker):
    # Tombstones were released as value=None under string/bytes; invalid UTF-8 as a
    # string Delta readers then refuse. An empty string (bytes) is a value.
    name = topic_of(kafka_broker, ["a", None, b"\xc3\x28", "", "  "])
    for fmt, valid in (("string", ["", "  ", "a"]), ("bytes", [b"", b"  ", b"a", b"\xc3\x28"])):
        main = kafka(kafka_broker, name, format=fmt, schema=None)
        op = enrich(lake, main, main_output=f"out_{fmt}")
        with nothing_committed(lake, op), refused(dsi.errors.MainInputDataError, name, fix=FIX):
            op.run(lake.spark)
        fixed = enrich(
            lake,
            main,
            main_output=f"out_{fmt}",
            routes=dsi.Routes(invalid=dsi.OutputTag(f"invalid_{fmt}")),
        )
        fixed.run(lake.spark)
        accounted(lake, fixed, range(5), column="kafka_offset")
        assert (
            sorted(bytes(v) if fmt == "bytes" else v for (v,) in lake.rows(f"out_{fmt}", "value"))
            == valid
        )
        reasons = sorted(r for (r,) in lake.rows(f"invalid_{fmt}", "reason"))
        assert any(f"{name}[0]@1: null value (a tombstone)" in r for r in reasons)
        if fmt == "string":
            assert any(f"{name}[0]@2: value is not UTF-8 text: 0xC328" in r for r in reasons)


def avro_long(n: int) -> bytes:
    """An Avro long: zig-zag, then base-128 varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def avro_tx(tx_id: int) -> bytes:
    return avro_long(tx_id) + avro_long(tx_id % 3) + struct.pack("<d", float(tx_id))


AVRO_TX = json.dumps(
    {
        "type": "record",
        "name": "Tx",
        "fields": [
            {"name": "tx_id", "type": "long"},
            {"name": "customer_id", "type": "long"},
            {"name": "amount", "type": "double"},
        ],
    }
)


@pytest_kafka
def test_kafka_avro_empty_truncated_and_garbage_values_are_invalid(lake, kafka_broker):
    values = [
        avro_tx(0),
        b"",
        avro_tx(2)[:-3],
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        avro_tx(4),
    ]
    name = topic_of(kafka_broker, values)
    main = kafka(kafka_broker, name, format="avro", schema=None, avro_schema=AVRO_TX)
    refused_then_routed(
        lake,
        main,
        [name, f"{name}[0]@1: empty value"],
        reasons=[f"{name}[0]@2: not decodable with the Avro schema", f"{name}[0]@3: not decodable"],
        column="kafka_offset",
        ids=range(len(values)),
    )
    assert sorted(lake.rows("enriched", "tx_id", "amount")) == [(0, 0.0), (4, 4.0)]


@pytest_kafka
def test_kafka_avro_non_record_schema_truncated_value_is_invalid(lake, kafka_broker):
    # A non-record schema's value is wrapped in a struct, which is never null: a value
    # Avro could not decode was released as value=None.
    name = topic_of(kafka_broker, [avro_long(7), b"\xff", b"", avro_long(-2)])
    main = dsi.MainInput.kafka(
        name, bootstrap_servers=kafka_broker.bootstrap_servers, format="avro", avro_schema='"long"'
    )
    refused_then_routed(
        lake,
        main,
        [name, f"{name}[0]@1: not decodable"],
        reasons=[f"{name}[0]@1: not decodable", f"{name}[0]@2: empty value"],
        column="kafka_offset",
        ids=range(4),
    )
    assert sorted(lake.rows("enriched", "value")) == [(-2,), (7,)]


# --- landing folders ---------------------------------------------------------------------------


def test_landed_json_lines_of_no_object_of_the_schema_are_invalid(lake, tmp_path: Path):
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [
        '{"tx_id": 1, "customer_id": 1, "amount": 1}',
        "",  # blank lines hold no record: Spark's reader skips them
        "   ",
        "null",
        "5",
        "{}",
        '{"TX_ID": 6, "CUSTOMER_ID": 1}',
        '{"tx_id": 7, "customer_id": "one"}',
        '{"tx_id": 8, "customer_id": 2}',
    ]
    (folder / "a.json").write_text("\n".join(lines) + "\n")
    main = dsi.MainInput.files(str(folder), format="json", schema=TX)
    op = enrich(lake, main)
    with (
        nothing_committed(lake, op),
        refused(
            dsi.errors.MainInputDataError,
            "5 record(s)",
            "'in'",
            fix=["fix the records at the source", FIX],
        ),
    ):
        op.run(lake.spark)
    fixed = enrich(
        lake,
        main,
        routes=dsi.Routes(invalid=INVALID),
    )
    fixed.run(lake.spark)
    placed(lake, fixed, {1: 1, 7: 1, 8: 1, None: 4})  # undecodable lines have no id
    assert sorted(lake.rows("enriched", "tx_id")) == [(1,), (8,)]
    reasons = sorted(r for (r,) in lake.rows("invalid", "reason"))
    assert sum("a.json: no field of the declared schema (tx_id" in r for r in reasons) == 2


def test_landed_csv_lines_of_separators_or_extra_fields_are_invalid(lake, tmp_path: Path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("1,1,1.0\n,,\n3,1,1.0,extra\n\n4,2,2.0\n")
    main = dsi.MainInput.files(str(folder), format="csv", schema=TX)
    op = enrich(lake, main)
    with (
        nothing_committed(lake, op),
        refused(dsi.errors.MainInputDataError, "2 record(s)", "'in'", fix=FIX),
    ):
        op.run(lake.spark)
    fixed = enrich(
        lake,
        main,
        routes=dsi.Routes(invalid=INVALID),
    )
    fixed.run(lake.spark)
    placed(lake, fixed, {1: 1, 4: 1, 3: 1, None: 1})  # tx 3 keeps its id in the route
    assert sorted(lake.rows("enriched", "tx_id")) == [(1,), (4,)]


def test_landed_xml_records_spark_cannot_parse_or_of_no_field_are_invalid(lake, tmp_path: Path):
    # XML was read without a corrupt column: a record Spark could not parse came out as
    # nulls and was released.
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.xml").write_text(
        "<txs><tx><tx_id>1</tx_id><customer_id>1</customer_id></tx>"
        "<tx><tx_id>two</tx_id><customer_id>1</customer_id></tx>"
        "<tx><other>3</other></tx>"
        "<tx><tx_id>4</tx_id><customer_id>2</customer_id><amount>4.5</amount></tx></txs>"
    )
    main = dsi.MainInput.files(str(folder), format="xml", schema=TX, options={"rowTag": "tx"})
    op = enrich(lake, main)
    with nothing_committed(lake, op), refused(dsi.errors.MainInputDataError, "2 record(s)", "'in'"):
        op.run(lake.spark)
    fixed = enrich(
        lake,
        main,
        routes=dsi.Routes(invalid=INVALID),
    )
    fixed.run(lake.spark)
    placed(lake, fixed, {1: 1, 4: 1, None: 2})
    assert sorted(lake.rows("enriched", "tx_id", "amount")) == [(1, None), (4, 4.5)]


def test_landed_text_lines_that_are_not_utf8_are_invalid(lake, tmp_path: Path):
    # Their bytes were written as strings; Delta's statistics then failed on them with a
    # raw UnicodeDecodeError, on every rerun. An empty line is a record.
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"a\n\n\xff\xfe\nb\n")
    main = dsi.MainInput.files(str(folder), format="text", schema="value string")
    op = enrich(lake, main)
    with nothing_committed(lake, op), refused(dsi.errors.MainInputDataError, "1 record(s)", "'in'"):
        op.run(lake.spark)
    fixed = enrich(
        lake,
        main,
        routes=dsi.Routes(invalid=INVALID),
    )
    fixed.run(lake.spark)
    accounted(lake, fixed, ["a", "", "\ufffd\ufffd", "b"], column="value")
    assert lake.rows("invalid", "reason") == [
        ("corrupt record: a.txt: line is not UTF-8 text: 0xFFFE",)
    ]


def test_a_json_value_is_parsed_once_per_record(spark):
    """The corrupt text reads the decoded column: Spark parses each value once, not once
    per reference (three times before, in a projection Spark does not compile)."""
    main = dsi.MainInput.kafka(
        "t", bootstrap_servers="127.0.0.1:9", schema="tx_id long, customer_id long"
    )
    assert main.kafka_input is not None
    raw = spark.createDataFrame(
        [(b"k", b'{"tx_id": 1, "customer_id": 2}', "t", 0, 5, None), (None, b"{", "t", 0, 6, None)],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp",
    )
    decoded = decode(main.kafka_input, "main input 't'", spark, raw)
    plan = decoded._jdf.queryExecution().optimizedPlan().toString()
    assert plan.count("from_json(") == 1, plan
    rows = {r["kafka_offset"]: (r["tx_id"], r[CORRUPT]) for r in decoded.collect()}
    assert rows[5] == (1, None)
    assert rows[6][0] is None
    assert "t[0]@6" in rows[6][1]
