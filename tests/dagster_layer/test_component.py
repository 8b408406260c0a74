"""``SideInputPipeline``: the operator as a dg component.

In process: the component builds what ``@side_input_assets`` and the ``build_*``
functions build for the same declaration, and refuses bad YAML naming the field. Through
the real ``dg`` CLI (``python -m dagster_dg_cli.cli``, the environment's own): a project
lists the component, scaffolds it, ``dg check defs`` accepts the scaffold, and ``dg
launch`` materializes it: the output Delta tables hold the enriched and unmatched orders.
"""

import datetime as dt
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.dagster_layer.component import SideInputPipeline, parse_duration
from dagster_sideinputs.dagster_layer.declaration import declaration_of
from dagster_sideinputs.dagster_layer.describe import human_duration
from dagster_sideinputs.dagster_layer.scaffold import DEFS_YAML, PIPELINE_PY

REPO = Path(__file__).resolve().parents[2]
TYPE = "dagster_sideinputs.SideInputPipeline"


def enrich(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    return {dsi.MAIN: main, "flagged": main.filter(F.col("amount") > 100)}


ATTRIBUTES = {
    "fn": f"{__name__}:enrich",
    "name": "pipeline_op",
    "main": {"asset": "tx", "key": "customer_id", "event_time": "ts"},
    "side_inputs": {
        "profile": {
            "view": "map",
            "asset": "profiles",
            "key": "customer_id",
            "missing": {"wait": "1h30m"},
        },
        "fx": {
            "view": "map",
            "asset": "fx",
            "key": "currency",
            "distribution": "broadcast",
            "window": {"size": "1h", "time_column": "ts"},
        },
        "rules": {"view": "singleton", "asset": "rules", "readiness": "fresh"},
        "cards": {"view": "multimap", "asset": "cards", "key": "customer_id"},
        "blocked": {"view": "list", "asset": "blocked", "max_age": 3600},
    },
    "main_output": {"name": "enriched", "description": "Enriched transactions."},
    "side_outputs": ["flagged"],
    "window": {"size": "1h", "watermark": "2h"},
    "routes": {"late": "late_tx", "unmatched": "unmatched_tx"},
    "buffer": {"max_rows": 1000, "max_age": "2d"},
    "group_name": "payments",
    "job": {"name": "pipeline_job", "replay": ["unmatched_tx"]},
    "sensor": {"minimum_interval_seconds": 45},
}


def the_same_with_the_decorator() -> tuple[dg.AssetsDefinition, list, list]:
    """What the Python API builds for ATTRIBUTES."""
    assets_def = dsi.side_input_assets(
        name="pipeline_op",
        main=dsi.MainInput("tx", key="customer_id", event_time="ts"),
        side_inputs={
            "profile": dsi.SideInput.map(
                "profiles", key="customer_id", missing=dsi.Wait(dt.timedelta(minutes=90))
            ),
            "fx": dsi.SideInput.map(
                "fx",
                key="currency",
                distribution="broadcast",
                window=dsi.Window.tumbling(dt.timedelta(hours=1), time_column="ts"),
            ),
            "rules": dsi.SideInput.singleton("rules", readiness="fresh"),
            "cards": dsi.SideInput.multimap("cards", key="customer_id"),
            "blocked": dsi.SideInput.list("blocked", max_age=dt.timedelta(hours=1)),
        },
        main_output=dsi.OutputTag("enriched", description="Enriched transactions."),
        side_outputs=[dsi.OutputTag("flagged")],
        window=dsi.Window.tumbling(dt.timedelta(hours=1), watermark=dt.timedelta(hours=2)),
        routes=dsi.Routes(late=dsi.OutputTag("late_tx"), unmatched=dsi.OutputTag("unmatched_tx")),
        buffer=dsi.BufferLimits(max_rows=1000, max_age=dt.timedelta(days=2)),
        group_name="payments",
    )(enrich)
    job = dsi.build_side_input_job(assets_def, name="pipeline_job")
    jobs = [job, dsi.build_replay_job(assets_def, "unmatched_tx")]
    sensors = [dsi.build_side_input_sensor(assets_def, job=job, minimum_interval_seconds=45)]
    return assets_def, jobs, [dsi.build_side_input_checks(assets_def), *sensors]


def shape(defs: dg.Definitions, executors: bool = False) -> dict:
    """What the UI shows of a set of definitions: keys, lineage, checks, jobs, sensors."""
    if not defs.resources:
        spark = dsi.SparkResource()
        io_manager = dsi.DeltaIOManager(root="/nonexistent/lake", spark=spark)
        defs = dg.Definitions.merge(
            defs, dg.Definitions(resources={"spark": spark, "io_manager": io_manager})
        )
    repository = defs.get_repository_def()
    graph = repository.asset_graph
    outputs = [key for key in graph.get_all_asset_keys() if graph.get(key).is_materializable]
    if executors:
        return {
            "executors": {
                job.name: job.executor_def.name
                for job in repository.get_all_jobs()
                if job.name != "__ASSET_JOB"
            }
        }
    return {
        "assets": {
            k.to_user_string(): sorted(p.to_user_string() for p in graph.get(k).parent_keys)
            for k in outputs
        },
        "groups": {graph.get(k).group_name for k in outputs},
        "descriptions": {k.to_user_string(): graph.get(k).description for k in outputs},
        "checks": sorted(key.to_user_string() for key in graph.asset_check_keys),
        "jobs": sorted(job.name for job in repository.get_all_jobs()),
        "sensors": {s.name: s.minimum_interval_seconds for s in repository.sensor_defs},
    }


def test_the_component_builds_what_side_input_assets_builds():
    component = SideInputPipeline.from_attributes_dict(attributes=ATTRIBUTES)
    from_yaml = component.definitions(component.function())
    yaml_options = declaration_of(from_yaml.assets[0]).options  # type: ignore[index, arg-type]

    assets_def, jobs, checks_and_sensor = the_same_with_the_decorator()
    python_options = declaration_of(assets_def).options
    from_python = dg.Definitions(
        assets=[assets_def],
        asset_checks=[checks_and_sensor[0]],
        jobs=jobs,
        sensors=checks_and_sensor[1:],
    )

    assert yaml_options == python_options
    assert shape(from_yaml) == shape(from_python)
    assert shape(from_yaml)["jobs"] == [
        "__ASSET_JOB",
        "pipeline_job",
        "pipeline_op_replay_unmatched_tx_job",
    ]
    assert shape(from_yaml)["checks"] == [
        "enriched:buffer_within_limits",
        "enriched:records_accounted_for",
        "enriched:side_inputs_ready",
    ]
    # One process, one Spark session per run of the operator's jobs (Dagster's default
    # executor would start a JVM per step: the operator, then each check).
    jobs = shape(from_yaml, executors=True)["executors"]
    assert jobs == {
        "pipeline_job": "in_process",
        "pipeline_op_replay_unmatched_tx_job": "in_process",
    }


def test_the_docs_example_is_the_docstring_example_and_builds():
    readme = re.findall(
        r"```yaml\n(.*?)```", (REPO / "docs" / "dagster.md").read_text(), flags=re.S
    )
    assert len(readme) == 1
    docstring = (SideInputPipeline.__doc__ or "").split(".. code-block:: yaml")[1]
    assert yaml.safe_load(readme[0]) == yaml.safe_load(textwrap.dedent(docstring))

    declared = yaml.safe_load(readme[0])
    assert declared["type"] == TYPE
    component = SideInputPipeline.from_attributes_dict(attributes=declared["attributes"])

    def enrich_payments(main: DataFrame, sides: dsi.SideInputs) -> DataFrame:
        return main

    shown = shape(component.definitions(enrich_payments))
    assert shown["assets"] == {
        name: ["payments", "profiles", "rules"]
        for name in ("enriched_payments", "suspicious_payments", "unmatched_payments")
    }
    assert "enrich_payments_replay_unmatched_payments_job" in shown["jobs"]


def test_durations_are_written_as_in_the_docs():
    assert parse_duration("1h30m", "x") == dt.timedelta(minutes=90)
    assert parse_duration("90s", "x") == parse_duration(90, "x") == dt.timedelta(seconds=90)
    assert parse_duration("1d", "x") == dt.timedelta(days=1)
    assert parse_duration("250ms", "x") == dt.timedelta(milliseconds=250)
    with pytest.raises(dsi.DeclarationError, match=r"side_inputs\.profile\.timeout is '1 hour'"):
        parse_duration("1 hour", "side_inputs.profile.timeout")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            {"view": "map", "asset": "p", "key": "k", "missing": "wait", "timeout": "1h",
             "on_timeout": "null"},
            {"view": "map", "asset": "p", "key": "k", "missing": {"wait": "1h", "then": "null"}},
        ),
        (
            {"view": "list", "asset": "p", "window": {"size": "1h", "time_column": "ts"},
             "grace": "10m"},
            {"view": "list", "asset": "p",
             "window": {"size": "1h", "time_column": "ts", "grace": "10m"}},
        ),
    ],
)  # fmt: skip
def test_a_defs_yaml_in_the_spelling_before_the_groups_still_loads_and_warns(old, new):
    def side(attributes):
        component = SideInputPipeline.from_attributes_dict(
            attributes={**ATTRIBUTES, "side_inputs": {"p": attributes}}
        )
        return component.assets_kwargs()["side_inputs"]["p"]

    with pytest.warns(DeprecationWarning, match=r"side_inputs\.p: .* is deprecated.*use"):
        before = side(old)
    assert before == side(new)


def test_a_bad_declaration_names_the_field():
    with pytest.raises(Exception, match="mapp"):
        SideInputPipeline.from_attributes_dict(
            attributes={**ATTRIBUTES, "side_inputs": {"p": {"view": "mapp", "asset": "p"}}}
        )
    bad_timeout = {"p": {"view": "map", "asset": "p", "key": "k", "missing": {"wait": "soon"}}}
    component = SideInputPipeline.from_attributes_dict(
        attributes={**ATTRIBUTES, "side_inputs": bad_timeout}
    )
    with pytest.raises(dsi.DeclarationError, match=r"side_inputs\.p\.missing\.wait is 'soon'"):
        component.assets_kwargs()
    wrong_option = {"r": {"view": "singleton", "asset": "r", "missing": "unmatched"}}
    component = SideInputPipeline.from_attributes_dict(
        attributes={**ATTRIBUTES, "side_inputs": wrong_option}
    )
    with pytest.raises(dsi.DeclarationError, match=r"SideInputPipeline side_inputs\.r: .*missing"):
        component.assets_kwargs()
    with pytest.raises(dsi.DeclarationError, match="not a module:function"):
        SideInputPipeline.from_attributes_dict(attributes={**ATTRIBUTES, "fn": "enrich"}).function()
    with pytest.raises(dsi.DeclarationError, match="has no function 'nope'"):
        SideInputPipeline.from_attributes_dict(
            attributes={**ATTRIBUTES, "fn": f"{__name__}:nope"}
        ).function()


def test_pipelines_giving_the_same_resources_share_them():
    resources = {"spark": {"master": "local[2]"}, "io_manager": {"root": "/tmp/lake"}}
    first, second = (
        SideInputPipeline.from_attributes_dict(
            attributes={
                "fn": f"{__name__}:enrich",
                "name": name,
                "main": {"asset": "tx"},
                "main_output": name,
                "resources": resources,
            }
        )
        for name in ("one", "two")
    )
    merged = dg.Definitions.merge(first.definitions(enrich), second.definitions(enrich))
    assert set(merged.resources or {}) == {"spark", "io_manager"}
    assert merged.get_repository_def()  # one SparkResource, one DeltaIOManager


# ---- through the dg CLI -------------------------------------------------------------

INPUTS_PY = """\
import dagster as dg

import dagster_sideinputs as dsi


@dg.asset
def orders(spark: dsi.SparkResource):
    return spark.spark_session.createDataFrame(
        [(1, 10, 5.0), (2, 11, 7.5), (3, 99, 1.0)],
        "order_id long, customer_id long, amount double",
    )


@dg.asset
def customers(spark: dsi.SparkResource):
    return spark.spark_session.createDataFrame(
        [(10, "Ada"), (11, "Bob")], "customer_id long, name string"
    )
"""


def dg_cli(project: Path, *args: str, home: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``dg`` (this environment's, its venv the active one) in the project, with the
    Dagster instance in ``home`` (default: the project's .dagster_home); fail with its
    output."""
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home or project / ".dagster_home"),
        "NO_COLOR": "1",
        "VIRTUAL_ENV": sys.prefix,
    }
    done = subprocess.run(
        [sys.executable, "-m", "dagster_dg_cli.cli", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"dg {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A minimal dg project (``[tool.dg]`` in pyproject.toml, package ``orders_proj``)."""
    root = tmp_path / "orders-proj"
    (root / "orders_proj" / "defs").mkdir(parents=True)
    (root / ".dagster_home").mkdir()
    (root / ".dagster_home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    (root / "pyproject.toml").write_text(
        '[project]\nname = "orders-proj"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "orders_proj"\n'
    )
    (root / "orders_proj" / "__init__.py").write_text("")
    (root / "orders_proj" / "defs" / "__init__.py").write_text("")
    (root / "orders_proj" / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n"
        "defs = dg.Definitions.merge(\n"
        "    dg.load_from_defs_folder(path_within_project=Path(__file__).parent),\n"
        "    dg.Definitions(executor=dg.in_process_executor),\n"
        ")\n"
    )
    yield root
    for name in [m for m in sys.modules if m == "orders_proj" or m.startswith("orders_proj.")]:
        del sys.modules[name]


@pytest.mark.slow
def test_dg_lists_scaffolds_checks_and_materializes_the_component(project, spark):
    listed = json.loads(dg_cli(project, "list", "components", "--json").stdout)["items"]
    summaries = {item["key"]: item["summary"] for item in listed}
    assert TYPE in summaries, (
        "dg does not list the component: is the package installed with its entry point "
        "(`make install`, or pip install -e . after pulling)?"
    )
    # What dg shows of it (and `dg utils inspect-component --description` in full).
    assert summaries[TYPE] == (SideInputPipeline.__doc__ or "").strip().splitlines()[0]

    dg_cli(project, "scaffold", "defs", TYPE, "orders_pipeline")
    folder = project / "orders_proj" / "defs" / "orders_pipeline"
    assert (folder / "defs.yaml").read_text() == DEFS_YAML.format(type_name=TYPE)
    assert (folder / "pipeline.py").read_text() == PIPELINE_PY

    (project / "orders_proj" / "defs" / "inputs.py").write_text(INPUTS_PY)
    checked = dg_cli(project, "check", "defs")
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr

    # Materialized through the CLI as a user does: `dg launch` runs the steps in its own
    # process (the project's executor is in_process_executor, as the template advises),
    # the template's local[2] session one JVM for the whole run: inputs, operator, checks.
    launched = dg_cli(project, "launch", "--assets", "*")
    assert "RUN_SUCCESS" in launched.stdout + launched.stderr
    written = {
        table: sorted(
            tuple(r) for r in dsi.tables.read_table(spark, str(project / "data" / table)).collect()
        )
        for table in ("enriched_orders", "unmatched_orders")
    }
    assert written["enriched_orders"] == [(1, 10, 5.0, "Ada"), (2, 11, 7.5, "Bob")]
    assert [row[0] for row in written["unmatched_orders"]] == [3]


@pytest.mark.slow
def test_the_example_is_a_dg_project_that_dg_checks_and_lists(tmp_path):
    """The example code location (``[tool.dg]`` in pyproject.toml, ``assets/defs/``) is
    what ``dg dev`` (``make dev``) serves: ``dg check defs`` loads it, ``dg list defs``
    shows it, and ``workspace.yaml`` names the same module and location."""
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    checked = dg_cli(REPO, "check", "defs", home=tmp_path)
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    listed = json.loads(dg_cli(REPO, "list", "defs", "--json", home=tmp_path).stdout)
    assert {job["name"] for job in listed["jobs"]} == {
        "payments_enrichment_job",
        "payments_enrichment_continuous_job",
        "replay_unmatched_transactions_job",
        "refresh_reference_data",
        "fx_rates_job",
    }
    assert [sensor["name"] for sensor in listed["sensors"]] == ["payments_enrichment_sensor"]
    assert {resource["name"] for resource in listed["resources"]} == {"spark", "io_manager"}
    [entry] = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"]
    assert entry["python_module"]["module_name"] == "assets.definitions"
    assert entry["python_module"]["location_name"] == "payments"


DECLARED_INPUTS = """
import dagster as dg
from assets.definitions import defs
node = defs.get_repository_def().asset_graph.get(dg.AssetKey("enriched_transactions"))
print(node.metadata["dsi/inputs"].value)
"""


def test_make_dev_serves_the_profile_timeout_its_runs_use():
    """``make dev`` and ``make demo`` give the code location one
    ``DSI_PROFILE_TIMEOUT_MINUTES`` (the demo waits for it): the UI's "waits up to" of the
    code location ``make dev`` serves is the runs' timeout, not the code's 30 minutes."""
    exports = re.findall(
        r"^([\w -]+): export DSI_PROFILE_TIMEOUT_MINUTES \?= (\S+)$",
        (REPO / "Makefile").read_text(),
        flags=re.M,
    )
    assert len(exports) == 1, exports
    [(targets, minutes)] = exports
    assert {"dev", "demo"} <= set(targets.split())
    env = {**os.environ, "DSI_PROFILE_TIMEOUT_MINUTES": minutes}
    shown = subprocess.run(
        [sys.executable, "-c", DECLARED_INPUTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    waits = human_duration(dt.timedelta(minutes=float(minutes)))
    assert f"a record whose key has no row waits up to {waits}," in shown
    assert waits != "30 minutes"  # the code's own default, which make test keeps
