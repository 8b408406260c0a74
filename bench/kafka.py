"""Benchmark: the operator reading Kafka against the hand-written Structured Streaming job.

    python bench/kafka.py --rows 4000000 --side-rows 200000 --repeats 3

One local broker (``tests/servers/kafka.py``) holds one topic of ``--rows`` JSON
transactions keyed by customer (Kafka's default partitioner); every variant reads that
same topic in the same run. Sections (``--only`` runs one):

- ``frames``: ``SideInputOperator`` over ``MainInput.kafka`` in frames mode (a broadcast
  map of customer profiles, a singleton threshold, a main output and a ``suspicious``
  side output, Delta tables), against what an engineer writes by hand: ``readStream``
  from Kafka, ``from_json``, a stream-static broadcast join in ``foreachBatch`` writing
  the same two outputs (parquet), ``availableNow``. Medians and per-repeat ratios.
- ``late``: reference data arriving late. 5% of the customers get their profile only
  after the records were first processed: the operator (``missing="wait"``) holds their
  records and releases them enriched once the profiles arrive; the stream-static join
  emits them with empty profiles, and a later micro-batch has no reason to look at them
  again. Prints how many records each enriched, and the first run (which buffers the
  5%) against the plain run of the same operator with every profile on time, in turn
  (goal: at most 1.5x).
- ``prekeyed``: the topic declared pre-keyed (``KeyGroups``) against the same operator
  without it, with a keyed (shuffled) map and broadcast joins off: speed and shuffle
  bytes from Spark's REST API.
- ``murmur2``: Kafka's partitioner in Spark on 2M keys: the Arrow UDF the operator uses,
  a pandas UDF, a pure Spark SQL expression, and Spark's own ``hash`` as the floor.
"""

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from bench.operator import (
    SUSPICIOUS,
    THRESHOLD,
    TIMES,
    OperatorRun,
    SparkRest,
    _load,
    comparison,
    emitted_counts,
    enrich_batch_writer,
    enrich_frames,
    fraud_sides,
    interleaved,
    measured_session,
    median_of,
    output_counts,
    print_counts,
    print_profile,
    print_ratios,
    profile_operator_run,
    profiles,
    rate,
    run_available_now,
    run_section,
    timed,
)
from dagster_sideinputs.core.sources.kafka.declaration import SPARK_KAFKA_PACKAGE
from dagster_sideinputs.core.sources.kafka.keyed import (
    BUCKET,
    bucket_of,
    buckets,
    murmur2_partition,
    partitioned_read,
)
from tests.servers.kafka import KafkaBroker

SCHEMA = "tx_id long, customer_id long, amount double, currency string, ts timestamp"
BASE_EPOCH = 1_704_067_200
PARTITIONS = 8
LATE_SHARE = 20  # 1 customer in LATE_SHARE gets its profile late (5%)


# --- data -------------------------------------------------------------------------------------


def produce(broker: KafkaBroker, topic: str, rows: int, customers: int) -> float:
    """``rows`` JSON transactions keyed by customer; returns seconds taken."""
    template = '{"tx_id":%d,"customer_id":%d,"amount":%.2f,"currency":"%s","ts":"%s"}'
    currencies = ("USD", "EUR", "GBP", "JPY")
    base = dt.datetime.fromtimestamp(BASE_EPOCH, dt.timezone.utc)
    stamps = [(base + dt.timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ") for s in range(86400)]

    def records():
        for i in range(rows):
            customer = (i * 7919) % customers
            amount = (i * 104729 % 100_000) / 100.0
            value = template % (i, customer, amount, currencies[i % 4], stamps[i % 86400])
            yield str(customer), value

    seconds, _ = timed(lambda: broker.produce(topic, records()))
    return seconds


class Lake:
    """Side tables and per-run output roots."""

    def __init__(self, work: Path, spark: SparkSession, side_rows: int) -> None:
        self.work, self.spark, self.side_rows = work, spark, side_rows
        self.runs = 0
        self.profiles_uri = str(work / "data" / "customer_profiles")
        self.rules_uri = str(work / "data" / "fraud_rules")
        dsi.tables.write_dataframe(profiles(spark, side_rows), self.profiles_uri)
        dsi.tables.write_dataframe(
            spark.createDataFrame([(THRESHOLD, 1)], "threshold double, version int"),
            self.rules_uri,
        )

    def fresh_root(self, label: str) -> Path:
        self.runs += 1
        return self.work / "runs" / f"{label}_{self.runs}"


def kafka_main(broker: KafkaBroker, topic: str, *, pre_keyed: bool = False) -> dsi.MainInput:
    return dsi.MainInput.kafka(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        schema=SCHEMA,
        key="customer_id",
        pre_keyed=dsi.KeyGroups(max_key_groups=PARTITIONS) if pre_keyed else None,
    )


def kafka_operator(
    main: dsi.MainInput,
    root: Path,
    profiles_uri: str,
    rules_uri: str,
    *,
    distribution: str = "broadcast",
    missing: str = "null",
) -> dsi.SideInputOperator:
    wait = {"missing": "wait", "timeout": dt.timedelta(days=30), "on_timeout": "null"}
    return dsi.SideInputOperator(
        main=main,
        side_inputs=fraud_sides(
            profiles_uri,
            rules_uri,
            distribution=distribution,
            **(wait if missing == "wait" else {}),
        ),
        fn=enrich_frames,
        main_output="enriched",
        side_outputs=[SUSPICIOUS],
        storage=dsi.DeltaStorage(str(root)),
    )


def streaming_job(
    spark: SparkSession,
    broker: KafkaBroker,
    topic: str,
    profiles_uri: str,
    rules_uri: str,
    out: Path,
) -> int:
    """The hand-written job: Kafka -> from_json -> stream-static broadcast join in
    foreachBatch -> two parquet outputs, availableNow. Returns its micro-batches."""
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("v"))
        .select("v.*")
    )
    process = enrich_batch_writer(spark, profiles_uri, rules_uri, out)
    return run_available_now(records, process, out)


def parquet_rows(spark: SparkSession, path: Path, where: str | None = None) -> int:
    if not path.exists():
        return 0
    frame = spark.read.parquet(str(path))
    return (frame.filter(where) if where else frame).count()


# --- sections ---------------------------------------------------------------------------------


def _unpack(ctx: dict[str, Any]) -> tuple[SparkSession, Lake, KafkaBroker, str, Any]:
    return ctx["spark"], ctx["lake"], ctx["broker"], ctx["topic"], ctx["args"]


def bench_frames(ctx: dict[str, Any]) -> dict[str, Any]:
    spark, lake, broker, topic, args = _unpack(ctx)

    def operator(i: int) -> tuple[Path, dsi.RunResult]:
        root = lake.fresh_root("kafka_op")
        op = kafka_operator(kafka_main(broker, topic), root, lake.profiles_uri, lake.rules_uri)
        return root, op.run(spark)

    def baseline(i: int) -> Path:
        out = lake.fresh_root("kafka_streaming")
        streaming_job(spark, broker, topic, lake.profiles_uri, lake.rules_uri, out)
        return out

    operator(-1)  # warm up: JVM, Python workers, the broker's page cache
    baseline(-1)
    seconds, results = interleaved({"operator": operator, "baseline": baseline}, args.repeats)
    figures = comparison(
        args.rows,
        seconds,
        {emitted_counts(r) for _, r in results["operator"]},
        {output_counts(spark, p) for p in results["baseline"]},
    )
    print(
        f"\n[frames] {args.rows} records in Kafka ({PARTITIONS} partitions), "
        f"{args.side_rows} profiles"
    )
    print(f"  hand-written readStream(kafka) + foreachBatch   {rate(figures, 'baseline')}")
    print(f"  SideInputOperator, MainInput.kafka              {rate(figures, 'operator')}")
    print_ratios(figures)
    print_counts(figures, "hand-written")

    def profiled() -> OperatorRun:
        root, result = operator(-2)
        return OperatorRun(result, root)

    figures["profile"] = profile_operator_run(ctx["lake"], ctx["rest"], profiled)
    print_profile(figures["profile"])
    return figures


def bench_late(ctx: dict[str, Any]) -> dict[str, Any]:
    """Profiles of 5% of the customers arrive after their records were first processed.

    Issue 42's goal: the first run, which buffers those 5%, at most 1.5x the *plain* run
    (the same operator, ``missing="wait"``, every profile on time), both timed in turn
    ``--repeats`` times, each on a fresh operator."""
    spark, lake, broker, topic, args = _unpack(ctx)
    everyone = dsi.tables.read_table(spark, lake.profiles_uri)
    late_ones = F.col("customer_id") % LATE_SHARE == 0
    ops: list[tuple[dsi.SideInputOperator, str, Path]] = []

    def operator(root: Path, profiles_uri: str) -> dsi.SideInputOperator:
        return kafka_operator(
            kafka_main(broker, topic), root, profiles_uri, lake.rules_uri,
            distribution="broadcast", missing="wait",
        )  # fmt: skip

    def plain(i: int) -> dsi.RunResult:
        return operator(lake.fresh_root("late_plain") / "operator", lake.profiles_uri).run(spark)

    def late(i: int) -> dsi.RunResult:
        work = lake.fresh_root("late")
        early_uri = str(work / "profiles")
        dsi.tables.write_dataframe(everyone.filter(~late_ones), early_uri)
        op = operator(work / "operator", early_uri)
        ops.append((op, early_uri, work))
        return op.run(spark)

    plain(-1)  # warm up the decoding and the writes
    seconds, results = interleaved({"plain": plain, "late": late}, args.repeats)
    pairs = [t / p for p, t in zip(TIMES["plain"], TIMES["late"], strict=True)]
    buffered = sorted(
        {sum(b.routes.get("key_wait", 0) for b in r.batches) for r in results["late"]}
    )
    op, early_uri, work = ops[-1]
    out = work / "streaming"
    first_base, _ = timed(
        lambda: streaming_job(spark, broker, topic, early_uri, lake.rules_uri, out)
    )
    # The late profiles arrive; both jobs run again (no new records).
    dsi.tables.write_dataframe(everyone.filter(late_ones), early_uri)
    again_op, second = timed(lambda: op.run(spark))
    released = sum(b.released for b in second.batches)
    again_base, _ = timed(
        lambda: streaming_job(spark, broker, topic, early_uri, lake.rules_uri, out)
    )
    enriched_op = (
        dsi.tables.read_table(spark, str(work / "operator" / "enriched"))
        .filter(F.col("name").isNotNull())
        .count()
    )
    enriched_base = parquet_rows(spark, out / "enriched", "name IS NOT NULL")
    figures = {
        "rows": args.rows,
        "late_customers_share": 1 / LATE_SHARE,
        "operator_enriched": enriched_op,
        "baseline_enriched": enriched_base,
        "operator_buffered_first_run": buffered,
        "operator_released_when_profiles_arrived": released,
        "plain_s": seconds["plain"],
        "first_run_s": seconds["late"],
        "first_over_plain": seconds["late"] / seconds["plain"],
        "first_over_plain_per_repeat": pairs,
        "operator_release_s": round(again_op, 2),
        "baseline_seconds": [round(first_base, 2), round(again_base, 2)],
    }
    print(f"\n[late] {args.rows} records; the profiles of 1 customer in {LATE_SHARE} arrive late")
    print(
        f"  operator first run (buffers {buffered}) {seconds['late']:.2f} s against the plain "
        f"run (every profile on time) {seconds['plain']:.2f} s: "
        f"{figures['first_over_plain']:.2f}x (goal <= 1.5); per repeat "
        f"{' '.join(f'{r:.2f}' for r in pairs)} (median {statistics.median(pairs):.2f})"
    )
    print(
        f"  records enriched: SideInputOperator {enriched_op} of {args.rows} "
        f"({released} released from its buffer when the profiles arrived, "
        f"{again_op:.2f} s); hand-written stream-static join {enriched_base} of {args.rows} "
        f"(its runs {figures['baseline_seconds']} s)"
    )
    return figures


SHUFFLE_FIGURES = (
    "shuffle_write_bytes",
    "shuffle_read_bytes",
    "shuffle_exchanges",
    "main_side_shuffles",
)


def bench_prekeyed(ctx: dict[str, Any]) -> dict[str, Any]:
    spark, lake, broker, topic, args = _unpack(ctx)
    rest: SparkRest | None = ctx["rest"]
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold") or "10MB"
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    own: dict[str, list[float]] = {"shuffled": [], "pre_keyed": []}
    metrics: dict[str, list[dict[str, Any]]] = {"shuffled": [], "pre_keyed": []}
    results: dict[str, list[dsi.RunResult]] = {"shuffled": [], "pre_keyed": []}

    def variant(name: str, pre_keyed: bool) -> Callable[[int], None]:
        def run(i: int) -> None:
            op = kafka_operator(
                kafka_main(broker, topic, pre_keyed=pre_keyed), lake.fresh_root(name),
                lake.profiles_uri, lake.rules_uri, distribution="keyed",
            )  # fmt: skip
            mark = rest.mark() if rest else None
            seconds, result = timed(lambda: op.run(spark))
            if i >= 0:
                own[name].append(seconds)
                results[name].append(result)
                if rest and mark:
                    metrics[name].append(rest.since(mark))

        return run

    by_hand = HandJoin(spark, broker, topic, lake)
    try:
        actions = {"shuffled": variant("shuffled", False), "pre_keyed": variant("pre_keyed", True)}
        hand = {"by hand, shuffled": by_hand.shuffled, "by hand, in place": by_hand.in_place}
        for action in (*actions.values(), *hand.values()):
            action(-1)
        hand_times, _ = interleaved({**actions, **hand}, args.repeats)
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)
    figures: dict[str, Any] = {"rows": args.rows, "partitions": PARTITIONS}
    print(
        f"\n[prekeyed] {args.rows} records in {PARTITIONS} Kafka partitions keyed by customer, "
        f"keyed (shuffled) map of {args.side_rows} profiles, broadcast joins off"
    )
    for name in actions:
        seconds = median_of(own[name])
        counts = sorted({(r.emitted("enriched"), r.emitted("suspicious")) for r in results[name]})
        notes = sorted({n for r in results[name] for b in r.batches for n in b.notes})
        entry: dict[str, Any] = {
            "rec_s": args.rows / seconds,
            "seconds": seconds,
            "counts": counts,
            "notes": notes,
        }
        for key in SHUFFLE_FIGURES:
            if metrics[name]:
                entry[key] = median_of([m[key] for m in metrics[name]])
        figures[name] = entry
        shuffle = (
            f"shuffle write {entry['shuffle_write_bytes'] / 2**20:7.1f} MiB, read "
            f"{entry['shuffle_read_bytes'] / 2**20:7.1f} MiB; main records shuffled by key: "
            f"{'yes' if entry['main_side_shuffles'] else 'no'}"
            if metrics[name]
            else "shuffle metrics unavailable"
        )
        print(f"  {name:<10} {entry['rec_s'] / 1e6:6.3f} M rec/s ({seconds:6.2f} s)  {shuffle}")
        print(f"             rows {counts}; notes: {notes or '-'}")
    figures["speedup"] = figures["shuffled"]["seconds"] / figures["pre_keyed"]["seconds"]
    figures["counts_match"] = figures["shuffled"]["counts"] == figures["pre_keyed"]["counts"]
    figures["bound"] = hand_times["by hand, shuffled"] / hand_times["by hand, in place"]
    for name in hand:
        print(f"  {name:<18} {hand_times[name]:6.2f} s")
    print(
        f"  pre-keyed / shuffled speed {figures['speedup']:5.2f}x; rows "
        f"{'match' if figures['counts_match'] else 'MISMATCH'}\n"
        f"  bound: the same join by hand, read in place / shuffled {figures['bound']:5.2f}x "
        f"(the operator reaches {figures['speedup'] / figures['bound']:4.2f} of it)"
    )
    return figures


class HandJoin:
    """The keyed join written by hand, without the operator: the topic's records joined
    with the profiles (sort-merge, broadcast off) and written as parquet, read either
    with a shuffle or in place (Kafka partition ``p`` as Spark partition ``p``, the
    same partitioned read the operator uses, with no check of the promise). Their ratio
    is what reading in place can gain on this machine: the bound of the pre-keyed path."""

    def __init__(self, spark: SparkSession, broker: KafkaBroker, topic: str, lake: Lake) -> None:
        self.spark, self.broker, self.topic, self.lake = spark, broker, topic, lake
        self.side = dsi.tables.read_table(spark, lake.profiles_uri)

    def _load(self, partitions: list[int] | None = None) -> DataFrame:
        reader = self.spark.read.format("kafka").option(
            "kafka.bootstrap.servers", self.broker.bootstrap_servers
        )
        reader = (
            reader.option("subscribe", self.topic)
            if partitions is None
            else reader.option("assign", json.dumps({self.topic: partitions}))
        )
        return reader.option("startingOffsets", "earliest").option("endingOffsets", "latest").load()

    @staticmethod
    def _decoded(raw: DataFrame, *keep: str) -> DataFrame:
        value = F.from_json(F.col("value").cast("string"), SCHEMA).alias("v")
        return raw.select(value, *keep).select("v.*", *keep)

    def _write(self, frame: DataFrame, label: str) -> None:
        frame.write.parquet(str(self.lake.fresh_root(label)))

    def shuffled(self, _: int) -> None:
        self._write(self._decoded(self._load()).join(self.side, "customer_id", "left"), "hand")

    def in_place(self, _: int) -> None:
        values = buckets(PARTITIONS)
        reads = [self._load([p]).withColumn(BUCKET, F.lit(values[p])) for p in range(PARTITIONS)]
        main = partitioned_read(self.spark, reads, PARTITIONS)
        assert main is not None, "this session cannot read a topic in place"
        partition = murmur2_partition(F.col("customer_id").cast("string"), PARTITIONS)
        side = self.side.withColumn(BUCKET, bucket_of(partition, PARTITIONS))
        conf, setting = self.spark.conf, "spark.sql.requireAllClusterKeysForCoPartition"
        conf.set(setting, "false")  # as the operator does: reuse the bucket partitioning
        try:
            joined = self._decoded(main, BUCKET).join(side, [BUCKET, "customer_id"], "left")
            self._write(joined.drop(BUCKET), "hand_in_place")
        finally:
            conf.unset(setting)


# --- Kafka's murmur2 three ways ------------------------------------------------------------------

_M, _MASK, _SEED = 0x5BD1E995, 0xFFFFFFFF, 0x9747B28C


def murmur2_sql(key_bytes: str) -> str:
    """Kafka's murmur2 as one Spark SQL expression: 32-bit arithmetic in bigint (a product
    with the constant stays below 2^63), bytes read from the key's hex string, a
    higher-order ``aggregate`` over the 4-byte blocks."""

    def byte(text: str, index: str) -> str:
        return f"cast(conv(substr({text}, 2 * ({index}) + 1, 2), 16, 10) as bigint)"

    block = (
        "cast(conv(concat(substr(a.x, 8 * i + 7, 2), substr(a.x, 8 * i + 5, 2), "
        "substr(a.x, 8 * i + 3, 2), substr(a.x, 8 * i + 1, 2)), 16, 10) as bigint)"
    )
    k1 = f"((({block}) * {_M}) & {_MASK})"
    k2 = f"(({k1} ^ shiftright({k1}, 24)) * {_M}) & {_MASK}"
    step = f"named_struct('h', ((a.h * {_M}) & {_MASK}) ^ ({k2}), 'x', a.x)"
    n = "(length(a.x) div 2)"
    body, rest = f"({n} div 4) * 4", f"({n} % 4)"
    tail = (
        f"(a.h ^ (case when {rest} = 3 then shiftleft({byte('a.x', f'{body} + 2')}, 16) else 0 end)"
        f" ^ (case when {rest} >= 2 then shiftleft({byte('a.x', f'{body} + 1')}, 8) else 0 end)"
        f" ^ (case when {rest} >= 1 then {byte('a.x', body)} else 0 end))"
    )
    tailed = f"(case when {rest} >= 1 then ({tail} * {_M}) & {_MASK} else a.h end)"
    f1 = f"({tailed} ^ shiftright({tailed}, 13))"
    f2 = f"(({f1} * {_M}) & {_MASK})"
    final = f"({f2} ^ shiftright({f2}, 15))"
    blocks = f"(length(hex({key_bytes})) div 8)"
    seed = f"cast((({_SEED} ^ (length(hex({key_bytes})) div 2)) & {_MASK}) as bigint)"
    return (
        f"aggregate(if({blocks} > 0, sequence(0, {blocks} - 1), array()), "
        f"named_struct('h', {seed}, 'x', hex({key_bytes})), (a, i) -> {step}, a -> {final})"
    )


def murmur2_pandas(partitions: int) -> Any:
    """A pandas UDF: a Python murmur2 per key (the partitioner of tests/servers)."""
    from tests.servers.partitioner import default_partition

    @F.pandas_udf("int")  # type: ignore[call-overload]
    def partition(keys: pd.Series) -> pd.Series:
        return pd.Series(
            np.fromiter(
                (default_partition(k.encode(), partitions) for k in keys), np.int32, len(keys)
            )
        )

    return partition


KEY_BYTES = "encode(k, 'UTF-8')"


def bench_murmur2(ctx: dict[str, Any]) -> dict[str, Any]:
    spark, args = ctx["spark"], ctx["args"]
    keys = spark.range(2_000_000).select(
        F.concat(F.lit("customer-"), F.col("id").cast("string")).alias("k")
    )
    keys = keys.cache()
    keys.count()
    variants = {
        "spark_hash": F.expr(f"pmod(hash(k), {PARTITIONS})"),
        "arrow_udf": murmur2_partition(F.col("k"), PARTITIONS),
        "pandas_udf": murmur2_pandas(PARTITIONS)(F.col("k")),
        "sql_expression": F.expr(
            f"cast((({murmur2_sql(KEY_BYTES)}) & 2147483647) % {PARTITIONS} as int)"
        ),
    }
    check = (
        keys.limit(2000)
        .select(*[v.alias(n) for n, v in variants.items() if n != "spark_hash"])
        .collect()
    )
    agree = all(r["arrow_udf"] == r["pandas_udf"] == r["sql_expression"] for r in check)

    def summed(column: Any) -> Callable[[int], Any]:
        return lambda i: keys.select(F.sum(column)).collect()

    actions = {name: summed(col) for name, col in variants.items()}
    seconds, _ = interleaved(actions, args.repeats)
    print(f"\n[murmur2] Kafka's partition of 2M string keys in Spark (same results: {agree})")
    for name, value in seconds.items():
        print(f"  {name:<15} {value:6.2f} s   {2_000_000 / value / 1e6:5.2f} M keys/s")
    keys.unpersist()
    return {"seconds": seconds, "agree": agree}


SECTIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "frames": bench_frames,
    "late": bench_late,
    "prekeyed": bench_prekeyed,
    "murmur2": bench_murmur2,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--side-rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    spark, rest = measured_session(args, packages=[SPARK_KAFKA_PACKAGE])
    work = Path(tempfile.mkdtemp(prefix="dsi-bench-kafka-"))
    figures: dict[str, Any] = {
        "rows": args.rows,
        "side_rows": args.side_rows,
        "repeats": args.repeats,
    }
    try:
        with KafkaBroker(heap="1g") as broker:
            topic = broker.create_topic("transactions", PARTITIONS)
            produced = produce(broker, topic, args.rows, args.side_rows)
            print(
                f"rows={args.rows} side_rows={args.side_rows} repeats={args.repeats} "
                f"master={args.master} partitions={PARTITIONS} cpus={os.cpu_count()} "
                f"load={_load()}; produced in {produced:.1f} s "
                f"(broker started in {broker.startup_s:.1f} s)"
            )
            sys.stdout.flush()
            ctx = {
                "spark": spark,
                "broker": broker,
                "topic": topic,
                "args": args,
                "rest": rest,
                "lake": Lake(work, spark, args.side_rows),
            }
            for name, section in SECTIONS.items():
                if args.only and name not in args.only:
                    continue
                figures[name] = run_section(name, lambda: section(ctx))  # noqa: B023
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
