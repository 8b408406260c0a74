"""The README and the docs pages as written: every code block in them is run or checked
(Python runs, page by page; `make` targets exist; the YAML is the component's own, in
tests/dagster_layer/test_component.py; the module list is the package's, in
tests/test_structure.py; the demo's printout is what ``make demo`` prints), every relative
link reaches a file and a heading, the UI walkthrough names what the example code
location defines, and the glossary is the one the code reports with."""

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
DOCS = REPO / "docs"
MAKEFILE = REPO / "Makefile"
# Kept as they are: the contract, the decisions and the JVM notes are reference texts
# whose blocks are sketches (their links are checked all the same).
REFERENCE = {"DECISIONS.md", "SEMANTICS.md", "JVM_PACKAGES.md"}
PAGES = [README, *sorted(p for p in DOCS.glob("*.md") if p.name not in REFERENCE)]
DOCUMENTS = [README, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.S | re.M)


def blocks(page: Path, language: str | None = None) -> list[str]:
    """The fenced code blocks of a page (of one language)."""
    return [body for lang, body in FENCE.findall(page.read_text()) if language in (None, lang)]


def section(page: Path, heading: str) -> str:
    """A page's section: from its heading to the next heading of the same or a higher level."""
    text = page.read_text()
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    following = re.compile(rf"^#{{1,{len(level)}}} ", flags=re.M)
    found = following.search(text, start + len(heading))
    return text[start : found.start() if found else len(text)]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose = FENCE.sub("", page.read_text())
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", prose, flags=re.M):
        name, n = anchor(heading), 1
        while name in found:  # GitHub numbers repeated headings: name-1, name-2, ...
            name, n = f"{anchor(heading)}-{n}", n + 1
        found.add(name)
    return found


def broken_links(document: Path) -> list[str]:
    """The relative links (and images) of a page that reach no file, or whose
    ``#anchor`` is no heading of the page they reach."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", document.read_text())):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, fragment = target.partition("#")
        file = (document.parent / path) if path else document
        missing = not file.exists()
        if missing or (fragment and file.suffix == ".md" and fragment not in anchors(file)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_relative_links_reach_a_file_and_a_heading(document):
    """Every relative link of the README and docs/ points to a file a clone has, and its
    ``#anchor`` to a heading of that page."""
    assert broken_links(document) == [], f"{document.name} links what does not exist"


def test_the_link_check_sees_broken_links(tmp_path):
    """A missing file, a missing heading, and a heading's anchor spelled as GitHub does."""
    (tmp_path / "other.md").write_text("# Other\n\n## Temporal (as-of) side inputs\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# A page: its `title`\n\n[ok](other.md#temporal-as-of-side-inputs) [ok](#a-page-its-title)"
        " [file](gone.md) [heading](other.md#gone) ![image](gone.png) [web](https://x.y/z)\n"
        "```python\n# not a heading\n```\n[in page](#not-a-heading)\n"
    )
    assert broken_links(page) == ["gone.md", "other.md#gone", "gone.png", "#not-a-heading"]


def test_the_readme_is_short_and_links_every_page():
    """A newcomer reads the README in ten minutes; every docs page is one link away."""
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for page in sorted(DOCS.glob("*.md")):
        assert f"](docs/{page.name}" in text, f"the README does not link docs/{page.name}"


def test_every_code_block_is_run_or_checked():
    unchecked = []
    targets = set(re.findall(r"^([a-z][\w-]*):", MAKEFILE.read_text(), flags=re.M))
    for page in PAGES:
        for language, body in FENCE.findall(page.read_text()):
            if language == "python":
                continue  # test_python_blocks_run
            if language == "yaml":
                assert page.name == "dagster.md", page  # test_component.py checks it there
            elif language == "bash":
                commands = [line.split("#")[0].split() for line in body.splitlines()]
                for command in filter(None, commands):  # a `make` target of this repository
                    assert command[0] == "make", (page.name, command)
                    assert command[1] in targets, (page.name, command)
            elif language == "" and page.name == "getting-started.md":
                assert body.startswith("Delta tables under data/lake")  # the demo test's
            elif language == "" and page.name == "testing.md":
                assert body.startswith("dagster_sideinputs/")  # tests/test_structure.py's
            else:
                unchecked.append((page.name, language, body[:40]))
    assert not unchecked


def test_pages_have_python_examples():
    assert len(blocks(README, "python")) >= 1
    assert sum(len(blocks(page, "python")) for page in PAGES) >= 10


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")], ids=lambda p: p.name)
def test_python_blocks_run(page, spark, tmp_path, monkeypatch):
    """A page's Python blocks, in order, in one namespace of their own (each page stands
    alone)."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for block in blocks(page, "python"):
        exec(compile(block, str(page), "exec"), namespace)


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
    walkthrough = section(DOCS / "getting-started.md", "## The example pipeline, in the UI")
    defined = _code_location_names()
    sources = "".join(
        (REPO / name).read_text()
        for name in ("resources/__init__.py", "assets/payments.py", "assets/payments_operator.py")
    )
    unknown = []
    for token in sorted(set(re.findall(r"`([^`]+)`", walkthrough))):
        if token.startswith("make "):
            target = token[5:].split()[0]  # `make dev SPARK=embedded`: the target dev
            assert re.search(rf"^{target}:", MAKEFILE.read_text(), flags=re.M), token
        elif token.startswith("DSI_"):
            assert token.split("=")[0] in sources, token  # an environment variable read
        elif token.endswith((".py", ".yaml", "/")):  # a file or folder of the repository
            assert (REPO / token).exists(), token
        elif token not in defined:
            unknown.append(token)
    assert not unknown, f"the walkthrough names what the code location does not define: {unknown}"
    # Every job, sensor and schedule of the code location is in the walkthrough.
    from assets.definitions import defs

    repository = defs.get_repository_def()
    shown = {job.name for job in repository.get_all_jobs() if not job.name.startswith("__")}
    shown |= {s.name for s in repository.sensor_defs} | {s.name for s in repository.schedule_defs}
    missing = {name for name in shown if f"`{name}`" not in walkthrough} - {"fx_rates_job"}
    assert not missing, missing


def test_glossary_is_the_one_the_code_reports_with():
    from dagster_sideinputs.dagster_layer.figures import GLOSSARY

    glossary = section(DOCS / "operations.md", "## What the figures mean")
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.*) \|$", glossary, flags=re.M))
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
@pytest.mark.demo
def test_demo_prints_what_getting_started_shows(tmp_path_factory):
    """``python -m assets.demo`` as ``make demo`` runs it, in a scratch instance and lake
    (with a shorter profile timeout: the demo waits for it on purpose). The run is the
    test session's local demo run (the extended demo tests compare their tables with
    it); the seed makes its figures, not only their shape, repeatable."""
    demo = section(DOCS / "getting-started.md", "## The demo")
    [sample] = re.findall(r"A run of it.*?:\n\n```\n(.*?)```", demo, flags=re.S)
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
