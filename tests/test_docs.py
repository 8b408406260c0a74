"""The README as written: its Python examples run, its UI walkthrough names what the
example code location defines, its glossary is the one the code reports with, and its
sample ``make demo`` output is what the demo prints."""

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dagster_sideinputs
from tests.cluster import local_reference

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAKEFILE = REPO / "Makefile"


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def readme_section(start: str, end: str) -> str:
    text = README.read_text()
    return text[text.index(start) : text.index(end)]


def test_documents_link_only_to_files_in_the_repository():
    """Relative links of the README and docs/ point to files a clone has."""
    root = README.parent
    for document in [README, *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (document.parent / target).exists(), f"{document.name} links {target}"


def test_readme_has_python_examples():
    assert len(readme_blocks()) >= 3


def test_readme_examples_run_in_order(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in readme_blocks():
        exec(compile(block, str(README), "exec"), namespace)


def test_readme_links_and_images_exist():
    for target in re.findall(r"\]\(((?:docs|assets|resources)/[^)#]+)\)", README.read_text()):
        assert (REPO / target).exists(), target


def _code_location_names() -> set[str]:
    """Every name the example code location defines and the UI shows."""
    import dagster as dg

    from assets.definitions import defs
    from assets.enrichment import payments_enrichment
    from assets.payments import TransactionBatch
    from dagster_sideinputs.dagster_layer.declaration import declaration_of

    repository = defs.get_repository_def()
    graph = repository.asset_graph
    names: set[str] = set()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        names.add(key.to_user_string())
        names.update(node.kinds)
        names.update(node.metadata)
        names.add(node.group_name)
        for tag_key, value in node.tags.items():
            if not tag_key.startswith("dagster/"):
                names.update({tag_key, value})
    names.update(job.name for job in repository.get_all_jobs())
    names.update(sensor.name for sensor in repository.sensor_defs)
    names.update(schedule.name for schedule in repository.schedule_defs)
    names.update(check.name for check in graph.asset_check_keys)
    names.update(TransactionBatch.model_fields)
    names.update(declaration_of(payments_enrichment).side_inputs)
    assert isinstance(defs, dg.Definitions)
    return names


def test_ui_walkthrough_names_exist_in_the_code_location():
    section = readme_section("## The example pipeline, in the UI", "### What the figures mean")
    defined = _code_location_names()
    sources = (REPO / "resources" / "__init__.py").read_text() + (
        REPO / "assets" / "payments.py"
    ).read_text()
    unknown = []
    for token in sorted(set(re.findall(r"`([^`]+)`", section))):
        if token.startswith("make "):
            assert re.search(rf"^{token[5:]}:", MAKEFILE.read_text(), flags=re.M), token
        elif token.startswith("DSI_"):
            assert token.split("=")[0] in sources, token  # an environment variable read
        elif token.endswith((".py", ".yaml", "/")):  # a file or folder of the repository
            assert (REPO / token).exists(), token
        elif token not in defined:
            unknown.append(token)
    assert not unknown, f"the README names what the code location does not define: {unknown}"
    # Every job, sensor and schedule of the code location is in the walkthrough.
    from assets.definitions import defs

    repository = defs.get_repository_def()
    shown = {job.name for job in repository.get_all_jobs() if not job.name.startswith("__")}
    shown |= {s.name for s in repository.sensor_defs} | {s.name for s in repository.schedule_defs}
    missing = {name for name in shown if f"`{name}`" not in section} - {"fx_rates_job"}
    assert not missing, missing


def test_glossary_is_the_one_the_code_reports_with():
    from dagster_sideinputs.dagster_layer.figures import GLOSSARY

    section = readme_section("### What the figures mean", "## On a Spark cluster")
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.*) \|$", section, flags=re.M))
    assert rows == GLOSSARY


def _shape(line: str) -> str:
    """A demo line with what changes from run to run masked: numbers (and the spaces that
    align them), and which outputs a run wrote to (which waiting transactions time out
    before their profile arrives depends on how long the steps take)."""
    if line.strip().startswith("materialized:"):
        return "materialized: ..."
    return re.sub(r"\s+", " ", re.sub(r"\d+", "N", line)).rstrip()


def test_the_demo_says_which_outputs_were_only_created():
    """A table a run created without writing a row to it is listed as created (0 rows),
    not beside the tables that got rows (before: "materialized: ..., late_transactions"
    with late=0)."""
    import dagster as dg

    from assets.demo import run_summary
    from dagster_sideinputs.dagster_layer.figures import GLOSSARY, ROUTES

    figures = {name: 0 for name in GLOSSARY if name in ("new_records", "from_buffer")}
    figures |= {name: 0 for name in ROUTES} | {"buffered_rows": 0, "rows_written": 2}

    @dg.multi_asset(specs=[dg.AssetSpec("enriched_transactions"), dg.AssetSpec("late")])
    def run():
        yield dg.MaterializeResult(asset_key="enriched_transactions", metadata=figures)
        yield dg.MaterializeResult(asset_key="late", metadata={"rows_written": 0})

    summary = run_summary(dg.materialize([run]))
    assert summary.splitlines()[1] == (
        "    materialized: enriched_transactions; created (0 rows): late"
    )


@pytest.mark.slow
def test_demo_prints_what_the_readme_shows(tmp_path_factory):
    """``python -m assets.demo`` as ``make demo`` runs it, in a scratch instance and lake
    (with a shorter profile timeout: the demo waits for it on purpose). The run is the
    test session's local demo run (the extended demo tests compare their tables with
    it); the seed makes its figures, not only their shape, repeatable."""
    quick_start = readme_section("## Quick start", "## The example pipeline, in the UI")
    [sample] = re.findall(r"A run of it.*?:\n\n```\n(.*?)```", quick_start, flags=re.S)
    run = local_reference(tmp_path_factory).result()
    printed = run.log.read_text().splitlines()
    assert (run.lake.parent / "demo.log").stat().st_size > 0  # the logs went there
    assert run.errors.read_text() == ""  # quiet by default
    assert [_shape(line) for line in printed] == [_shape(line) for line in sample.splitlines()]


MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(dagster_sideinputs.__path__, "dagster_sideinputs.")
    # The Airflow provider's modules import Airflow, which this venv has not (.venv-airflow).
    if not name.startswith("dagster_sideinputs.airflow.")
)


def _with_examples(names: list[str]) -> list[str]:
    """The modules whose docstrings hold an example (``>>>``) that doctest runs (not
    ``+SKIP``): a doctest item for any other module would pass with nothing to check."""
    finder = doctest.DocTestFinder()
    return [
        name
        for name in names
        if any(
            not example.options.get(doctest.SKIP)
            for test in finder.find(importlib.import_module(name))
            for example in test.examples
        )
    ]


EXAMPLES = _with_examples(MODULES)


def test_the_docstring_examples_are_found():
    """The filter above keeps the modules that have examples (six), not none."""
    assert len(EXAMPLES) >= 5, EXAMPLES


@pytest.mark.parametrize("module", EXAMPLES)
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
