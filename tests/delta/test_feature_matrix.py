"""Every Delta table feature delta-spark 4.4 writes, as main input, side input and output,
under both engines (issue 38's matrix; docs/engines.md, "Table features", shows the result).

Each case is one operator, run twice: its main input, its side input and its output are
tables made by delta-spark with the feature (a ``TBLPROPERTIES`` or ``CLUSTER BY`` clause,
or a column of the feature's type), holding two transactions and three profiles. Between the
runs the side table changes as the feature allows (rows deleted and updated under deletion
vectors, a column renamed and dropped under column mapping, a column widened, a row added)
and two more transactions arrive. Each role is either exact (the output holds the four
transactions joined with the profiles each run saw, nothing twice) or refused up front
with ``UnsupportedTableFeatureError`` naming the table and the feature, with nothing
written (:data:`REFUSED`). Where the bridge refuses a role, the same case runs again with
the feature on the other roles only, so every cell of the matrix is decided. The last row
is the state of a log rather than a feature: a log cleaned up past the operator's position
(:func:`test_a_log_cleaned_up_past_the_operators_position`).
"""

import dataclasses
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.delta.spark.predicates import sql_table
from dagster_sideinputs.delta.storage import DeltaStorage

ROLES = ("main", "side", "output")
TABLES = {"main": "transactions", "side": "profiles", "output": "enriched"}
COLUMNS = {
    "main": "tx_id BIGINT, customer_id BIGINT",
    "side": "customer_id BIGINT, name STRING",
    "output": "tx_id BIGINT, customer_id BIGINT, name STRING",
}


@dataclasses.dataclass(frozen=True)
class Feature:
    """A table feature: how a table gets it, and what may change under it between runs."""

    name: str
    clause: str = ""
    column: str = ""
    """An extra column every table of the case has (``name TYPE``), for features of types
    or columns; the function passes it from the main input to the output."""
    value: str = "NULL"
    """Its SQL value in the rows the case inserts."""
    passed: bool = True
    """Whether the function passes the column on (not for columns Delta computes)."""
    setup: tuple[str, ...] = ()
    """SQL run on each table with the feature after its creation (``{t}``: the table)."""
    change: tuple[str, ...] = ()
    """SQL run on the side table between the runs (``{t}``: the table)."""
    deleted: bool = False
    """Whether ``change`` deletes customer 11's profile and renames customer 10 'ANN'."""


FEATURES = (
    Feature(
        "deletion vectors",
        "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
        change=(
            "DELETE FROM {t} WHERE customer_id = 11",
            "UPDATE {t} SET name = 'ANN' WHERE customer_id = 10",
        ),
        deleted=True,
    ),
    Feature(
        "column mapping",
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
        "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')",
        column="note STRING",
        value="'n'",
        change=(
            "ALTER TABLE {t} RENAME COLUMN note TO remark",
            "ALTER TABLE {t} DROP COLUMN remark",
        ),
    ),
    Feature(
        "type widening",
        "TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
        column="rank SMALLINT",
        value="CAST(1 AS SMALLINT)",
        change=("ALTER TABLE {t} ALTER COLUMN rank TYPE INT",),
    ),
    Feature("row tracking", "TBLPROPERTIES ('delta.enableRowTracking' = 'true')"),
    Feature("timestamp_ntz", column="seen TIMESTAMP_NTZ", value="TIMESTAMP_NTZ'2024-05-01 10:00'"),
    Feature("variant", column="payload VARIANT", value="parse_json('{\"a\": 1}')"),
    Feature("liquid clustering", "CLUSTER BY (customer_id)"),
    Feature(
        "v2 checkpoints",
        "TBLPROPERTIES ('delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2')",
    ),
    Feature("in-commit timestamps", "TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true')"),
    Feature("change data feed", "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"),
    Feature(
        "CHECK constraints",
        setup=("ALTER TABLE {t} ADD CONSTRAINT positive CHECK (customer_id > 0)",),
        change=("ALTER TABLE {t} ADD CONSTRAINT known CHECK (name IS NOT NULL)",),
    ),
    Feature(
        "generated columns",
        column="doubled BIGINT GENERATED ALWAYS AS (customer_id * 2)",
        passed=False,
    ),
    Feature("identity columns", column="ident BIGINT GENERATED ALWAYS AS IDENTITY", passed=False),
    Feature("appendOnly", "TBLPROPERTIES ('delta.appendOnly' = 'true')"),
)

REFUSED = {
    "delta-rs": {
        # Reader features the bridge cannot read correctly: refused as an input, and as
        # an output (the same features are writer features it cannot honour).
        "column mapping": {
            "main": "columnMapping",
            "side": "columnMapping",
            "output": "columnMapping",
        },
        "type widening": {"main": "typeWidening", "side": "typeWidening", "output": "typeWidening"},
        "variant": {"main": "variantType", "side": "variantType", "output": "variantType"},
        # Files with deletion vectors (the side table after its DELETE): refused to read;
        # a table that only allows them reads and takes appends.
        "deletion vectors": {"side": "deletion vectors"},
        # Writer features only: read like any table, refused as an output.
        "row tracking": {"output": "rowTracking"},
        "liquid clustering": {"output": "clustering"},
        "in-commit timestamps": {"output": "inCommitTimestamp"},
        "generated columns": {"output": "generatedColumns"},
        "identity columns": {"output": "identityColumns"},
    },
    "delta-spark": {},
}
"""Per engine, feature and role: the feature the refusal names. Every other cell works."""


def _create(spark, path: str, role: str, feature: Feature | None) -> None:
    columns = COLUMNS[role] + (f", {feature.column}" if feature and feature.column else "")
    clause = feature.clause if feature else ""
    spark.sql(f"CREATE TABLE {sql_table(path)} ({columns}) USING delta {clause}")
    for statement in feature.setup if feature else ():
        spark.sql(statement.format(t=sql_table(path)))


def _insert(spark, path: str, role: str, rows: list[tuple], feature: Feature | None) -> None:
    names = [c.split()[0] for c in COLUMNS[role].split(", ")]
    extra: list[str] = []  # the feature's column and its value, where the rows give it
    if feature is not None and feature.column and feature.passed:
        names.append(feature.column.split()[0])
        extra = [feature.value]
    values = ", ".join("(" + ", ".join([*map(repr, row), *extra]) + ")" for row in rows)
    # One file of them all, so a DELETE or UPDATE of one row leaves a deletion vector.
    spark.sql(
        f"INSERT INTO {sql_table(path)} ({', '.join(names)}) "
        f"SELECT /*+ REPARTITION(1) */ * FROM VALUES {values}"
    )


def _run_case(spark, root: Path, engine: str, feature: Feature, roles: set[str]) -> dict:
    """The case with ``feature`` on the tables of ``roles``; the outcome of each run."""
    store = DeltaStorage(str(root), engine=engine).bind(spark)  # type: ignore[arg-type]
    paths = {role: store.table_uri(TABLES[role]) for role in ROLES}
    on = {role: feature if role in roles else None for role in ROLES}
    for role in ROLES:
        _create(spark, paths[role], role, on[role])
    profiles = [(10, "ann"), (11, "bob"), (12, "cy")]  # 12: a row the change leaves alone
    _insert(spark, paths["side"], "side", profiles, on["side"])
    _insert(spark, paths["main"], "main", [(1, 10), (2, 11)], on["main"])
    extra = feature.column.split()[0] if feature.column and feature.passed else None
    passes = extra is not None and "main" in roles and "output" in roles

    def enrich(main, sides):
        columns = [F.col("tx_id"), F.col("customer_id"), F.col("profile.name").alias("name")]
        return main.select(*columns, *([F.col(extra)] if passes else []))

    operator = dsi.SideInputOperator(
        main=dsi.MainInput(TABLES["main"], key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map(TABLES["side"], key="customer_id")},
        fn=enrich,
        main_output=TABLES["output"],
        storage=store,
    )
    outcomes = {}
    for run in (1, 2):
        if run == 2:
            if "side" in roles:
                for statement in feature.change:
                    spark.sql(statement.format(t=sql_table(paths["side"])))
            _insert(spark, paths["main"], "main", [(3, 10), (4, 11)], on["main"])
        before = spark.sql(f"DESCRIBE HISTORY {sql_table(paths['output'])}").count()
        try:
            operator.run(spark)
        except dsi.errors.UnsupportedTableFeatureError as exc:
            after = spark.sql(f"DESCRIBE HISTORY {sql_table(paths['output'])}").count()
            outcomes[run] = ("refused", str(exc), after == before)
            break
        outcomes[run] = ("ran", None, None)
    rows = spark.read.format("delta").load(paths["output"]).select("tx_id", "customer_id", "name")
    outcomes["rows"] = sorted(tuple(r) for r in rows.collect())
    outcomes["deleted"] = feature.deleted and "side" in roles
    return outcomes


def _expected_rows(runs: int, deleted: bool = False) -> list[tuple]:
    """The output after ``runs`` runs (``deleted``: the side change deleted and updated)."""
    first = [(1, 10, "ann"), (2, 11, "bob")]
    second = [(3, 10, "ANN"), (4, 11, None)] if deleted else [(3, 10, "ann"), (4, 11, "bob")]
    return [*first, *second][: 2 * runs]


@pytest.mark.parametrize("engine", ["delta-spark", "delta-rs"])
@pytest.mark.parametrize("feature", FEATURES, ids=[f.name.replace(" ", "_") for f in FEATURES])
def test_a_table_feature_works_in_every_role_or_is_refused_up_front(
    spark, tmp_path, engine, feature
):
    refused = REFUSED[engine].get(feature.name, {})
    working = {role for role in ROLES if role not in refused}
    if working:
        outcome = _run_case(spark, tmp_path / "works", engine, feature, working)
        assert outcome[1][0] == outcome[2][0] == "ran", (feature.name, working, outcome)
        assert outcome["rows"] == _expected_rows(2, outcome["deleted"])
    for role, named in refused.items():
        outcome = _run_case(spark, tmp_path / f"refused-{role}", engine, feature, {role})
        run = 2 if feature.change and role == "side" and feature.deleted else 1
        state, message, nothing_written = outcome[run]
        assert state == "refused", (feature.name, role, outcome)
        assert TABLES[role] in message
        assert named in message
        assert nothing_written
        # What the refused run would have written is not in the output: exact until then.
        assert outcome["rows"] == _expected_rows(run - 1)


# --- a log cleaned up past the operator's position ---------------------------------------

RETENTION = (
    "TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 0 seconds', "
    "'delta.deletedFileRetentionDuration' = 'interval 0 seconds')"
)
LOG_CLEANED = "a log cleaned up past the operator's position"
LOG_CLEANED_CELL = "side, output; refused as main (`LogCleanedUpError`: reset past it)"
"""Both engines alike: a side input reads its latest snapshot and an output's application
transactions are in its checkpoint, so their logs may be cleaned up at any time; what a
main input appended in commits its log no longer holds cannot be read incrementally."""


def _clean_log(uri: str) -> None:
    """A checkpoint at the table's version, then every log file before it removed (the
    table's retention is zero): what log retention does to a table left alone long enough."""
    table = DeltaTable(uri)
    table.create_checkpoint()
    table.cleanup_metadata()
    assert not Path(uri, "_delta_log", f"{0:020d}.json").exists()


@pytest.mark.parametrize("engine", ["delta-spark", "delta-rs"])
def test_a_log_cleaned_up_past_the_operators_position(spark, tmp_path, engine):
    """The main input's log cleaned up past the operator's position is refused up front,
    naming the table, the versions gone and the reset that reads on, with nothing written;
    after that reset the side input and the output, their logs cleaned up too, are read
    and written exactly."""
    store = DeltaStorage(str(tmp_path), engine=engine).bind(spark)  # type: ignore[arg-type]
    paths = {role: store.table_uri(TABLES[role]) for role in ROLES}
    for role in ROLES:
        _create(spark, paths[role], role, None)
        spark.sql(f"ALTER TABLE {sql_table(paths[role])} SET {RETENTION}")
    _insert(spark, paths["side"], "side", [(10, "ann"), (11, "bob")], None)
    _insert(spark, paths["main"], "main", [(1, 10), (2, 11)], None)
    operator = dsi.SideInputOperator(
        main=dsi.MainInput(TABLES["main"], key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map(TABLES["side"], key="customer_id")},
        fn=lambda main, sides: main.select(
            "tx_id", "customer_id", F.col("profile.name").alias("name")
        ),
        main_output=TABLES["output"],
        storage=store,
    )
    operator.run(spark)  # main read up to its version 2
    _insert(spark, paths["main"], "main", [(3, 10)], None)  # version 3: gone below
    _insert(spark, paths["main"], "main", [(4, 11)], None)  # version 4: the oldest left
    _insert(spark, paths["side"], "side", [(12, "cy")], None)
    for role in ROLES:
        _clean_log(paths[role])
    history = spark.sql(f"DESCRIBE HISTORY {sql_table(paths['output'])}").count()

    with pytest.raises(dsi.errors.LogCleanedUpError) as refused:
        operator.run(spark)
    message = str(refused.value)
    assert "'transactions'" in message, message
    assert "version 3 " in message, message
    assert "operator.reset(main_from=3)" in message, message
    assert refused.value.oldest == 4
    assert spark.sql(f"DESCRIBE HISTORY {sql_table(paths['output'])}").count() == history

    operator.reset(main_from=3)  # what version 3 appended is skipped, as the fix says
    _insert(spark, paths["main"], "main", [(5, 12)], None)
    assert [b.rows_in for b in operator.run(spark).batches] == [2]
    rows = spark.read.format("delta").load(paths["output"]).select("tx_id", "customer_id", "name")
    assert sorted(tuple(r) for r in rows.collect()) == [
        (1, 10, "ann"),
        (2, 11, "bob"),
        (4, 11, "bob"),
        (5, 12, "cy"),
    ]
    assert operator.run(spark).batches == []  # the output's transactions survived its checkpoint


def render() -> str:
    """The README's table of this matrix (``python -m tests.delta.test_feature_matrix``)."""

    def cell(engine: str, feature: Feature) -> str:
        refused = REFUSED[engine].get(feature.name, {})
        works = [role for role in ROLES if role not in refused]
        if not refused:
            return "works"
        named = " / ".join(f"`{n}`" for n in dict.fromkeys(refused.values()))
        if not works:
            return f"refused ({named})"
        return f"{', '.join(works)}; refused as {', '.join(refused)} ({named})"

    lines = [
        "| table feature | delta-spark | delta-rs bridge |",
        "| --- | --- | --- |",
        *(f"| {f.name} | {cell('delta-spark', f)} | {cell('delta-rs', f)} |" for f in FEATURES),
        f"| {LOG_CLEANED} | {LOG_CLEANED_CELL} | {LOG_CLEANED_CELL} |",
    ]
    return "\n".join(lines) + "\n"


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_this_matrix():
    text = README.read_text()
    start = text.index("| table feature |")
    end = text.index("\n\n", start) + 1
    assert text[start:end] == render(), (
        "README's table is stale: python -m tests.delta.test_feature_matrix"
    )


if __name__ == "__main__":
    text = README.read_text()
    start = text.index("| table feature |")
    end = text.index("\n\n", start) + 1
    README.write_text(text[:start] + render() + text[end:])
