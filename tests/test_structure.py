"""The library's shape: small modules, layers apart, no import cycles, and a code layout
(docs/testing.md) that names every module. Read from the source with ``ast``; nothing is
imported or started."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dagster_sideinputs"
MAX_LINES = 600
"""A module is one concept (STYLE.md): 600 lines of one idea are fine, and a file
is never split to fit a number. Past this, a module almost always holds two ideas, so
the test asks which; it is a prompt to look, not a size to cut files to."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path) -> set[str]:
    """Every module of the library that ``name`` imports, at module level or inside a
    function. ``from pkg import x`` counts as importing ``pkg.x`` when that is a module."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                child = f"{origin}.{alias.name}"
                found.add(child if child in MODULES else origin)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def test_no_module_of_the_library_holds_more_than_one_concept_by_size():
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, (
        f"over {MAX_LINES} lines: {long}; does each hold more than one concept? Split by "
        "concept (never to fit the number)"
    )


def test_no_module_imports_one_that_imports_it_back():
    """Depth-first search for a cycle, function-local imports included (a local import
    hides a cycle from the interpreter, not from a reader)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            # A package's __init__ re-exporting its children is not a cycle with them.
            if module.startswith(target + "."):
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        (
            "dagster_sideinputs.core",
            ("dagster", "dagster_pyspark", "deltalake", "delta", "airflow"),
        ),
        ("dagster_sideinputs.dagster_layer", ("deltalake", "delta", "airflow")),
        ("dagster_sideinputs.delta", ("dagster", "dagster_sideinputs.dagster_layer", "airflow")),
        (
            "dagster_sideinputs.airflow",
            (
                "dagster",
                "dagster_pyspark",
                "dagster_sideinputs.dagster_layer",
                "deltalake",
                "delta",
            ),
        ),
    ],
)
def test_layers_import_only_what_they_may(layer, forbidden):
    wrong = {}
    for name, path in MODULES.items():
        if not (name == layer or name.startswith(layer + ".")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            bad = [n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)]
            if bad:
                wrong.setdefault(name, []).extend(bad)
    assert wrong == {}


def test_starting_spark_knows_nothing_of_the_operator():
    """``core.spark`` (sessions, JVM packages, Java, Spark Connect) sits below everything
    else in the core: it imports only itself, the errors and the Delta setup it needs for
    Delta's package; nothing of the operator, its stages or its declarations."""
    allowed = ("dagster_sideinputs.core.spark", "dagster_sideinputs.errors")
    allowed_delta = {"dagster_sideinputs.delta.spark.setup"}
    wrong = {
        name: sorted(
            m
            for m in targets
            if not any(m == a or m.startswith(a + ".") for a in allowed) and m not in allowed_delta
        )
        for name, targets in GRAPH.items()
        if name == allowed[0] or name.startswith(allowed[0] + ".")
    }
    assert {k: v for k, v in wrong.items() if v} == {}
    assert any(n.startswith("dagster_sideinputs.core.spark.") for n in GRAPH)


CORE = "dagster_sideinputs.core"
STAGES = ("planner", "read", "route", "compute", "write", "record")
"""The batch's stages (core/batch/run.py runs them in this order)."""


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _reaches(name: str, package: str) -> list[str]:
    return sorted(t for t in GRAPH[name] if _inside(t, package))


def test_the_core_is_laid_out_by_concept():
    """The folder names show the architecture: sources, Spark, side inputs, the batch and
    the operator's state each a subpackage, the operator and its declarations beside them."""
    folders = {p.name for p in (PACKAGE / "core").iterdir() if (p / "__init__.py").is_file()}
    assert folders == {"sources", "spark", "sideinputs", "batch", "state"}
    flat = [p.name for p in (PACKAGE / "core").glob("*.py") if p.name != "__init__.py"]
    assert len(flat) <= 16, f"the core's top folder holds {len(flat)} modules: {sorted(flat)}"


def test_sources_and_spark_sit_below_the_batch_and_nothing_imports_the_operator():
    """The main-input sources and Spark's start-up are used by the batch, never the
    reverse; the batch's stages know nothing of the operator that steps them; the operator
    is the top of the core, imported only from outside it (the package's names, the Dagster
    layer, the Airflow task, the run report both orchestrators share)."""
    low = [f"{CORE}.sources", f"{CORE}.spark"]
    # The plan is a value the sources read (a batch's range); the state folder is not.
    high = [f"{CORE}.batch", *(f"{CORE}.state.{m}" for m in ("folder", "recovery", "reset"))]
    high.append(f"{CORE}.operator")
    wrong = {
        name: [t for h in high for t in _reaches(name, h)]
        for name in GRAPH
        if any(_inside(name, lo) for lo in low)
    }
    assert len(wrong) >= 14
    assert {k: v for k, v in wrong.items() if v} == {}
    batch = {
        name: _reaches(name, f"{CORE}.operator") for name in GRAPH if _inside(name, f"{CORE}.batch")
    }
    assert {k: v for k, v in batch.items() if v} == {}
    importers = sorted(n for n, t in GRAPH.items() if f"{CORE}.operator" in t)
    assert [n for n in importers if _inside(n, CORE)] == []
    assert "dagster_sideinputs.run_report" in importers


def test_the_stages_of_a_batch_do_not_import_each_other():
    """Each stage takes the batch's context and value and returns the next value; what two
    stages share lives in the context, the plan or the side inputs, not in a stage."""
    stages = {f"{CORE}.batch.{s}" for s in STAGES}
    assert stages <= set(MODULES)
    wrong = {name: sorted(GRAPH[name] & stages) for name in stages}
    assert {k: v for k, v in wrong.items() if v} == {}
    helpers = {
        name: sorted(GRAPH[name] & stages)
        for name in GRAPH
        if _inside(name, f"{CORE}.batch") and name not in stages and name != f"{CORE}.batch.run"
    }
    assert {k: v for k, v in helpers.items() if v} == {}


def test_what_differs_between_main_inputs_lives_in_their_sources():
    """A source's own behaviour (reading, resetting, checking, tidying) sits behind the
    MainSource protocol: outside ``core/sources`` nothing asks whether the main input is
    Kafka or a landing folder, and the batch's stages do not branch on the main input's
    kind at all (a pre-keyed topic is ``MainInput.keyed_by_partition``, a declaration)."""
    asks = re.compile(r"\bis_kafka\b|\bis_files\b")
    outside = [
        f"{name}:{n}"
        for name, path in MODULES.items()
        if not _inside(name, f"{CORE}.sources")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if asks.search(line)
    ]
    assert outside == []
    stages = [
        f"{name}:{n}"
        for name, path in MODULES.items()
        if _inside(name, f"{CORE}.batch")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "spec.main.kind" in line
    ]
    assert stages == []


def test_the_library_imports_its_own_modules_at_the_top_of_each_module():
    """A dependency between two of our modules is stated where a reader looks for it; an
    import inside a function hides it (optional third-party packages may still be
    imported where they are used)."""
    hidden = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                hidden += [
                    f"{name}:{inner.lineno}"
                    for inner in ast.walk(node)
                    if isinstance(inner, ast.ImportFrom)
                    and (inner.module or "").startswith("dagster_sideinputs")
                ]
    assert hidden == []


DELTA = "dagster_sideinputs.delta"


def test_neither_delta_engine_imports_the_others_modules():
    """The delta-rs bridge and the delta-spark engine share the layer's own pieces (the
    engine interface, the log reader, the store, staging and reading files with Spark) and
    nothing of each other; only the storage, which picks one, knows both."""
    engines = {"bridge": f"{DELTA}.bridge", "spark": f"{DELTA}.spark"}
    crossing = {
        name: _reaches(name, other)
        for mine, package in engines.items()
        for name in GRAPH
        if _inside(name, package)
        for theirs, other in engines.items()
        if theirs != mine and _reaches(name, other)
    }
    assert crossing == {}
    shared = {
        name: [t for package in engines.values() for t in _reaches(name, package)]
        for name in GRAPH
        if _inside(name, DELTA)
        and not any(_inside(name, package) for package in engines.values())
        and name != f"{DELTA}.storage"
    }
    assert {k: v for k, v in shared.items() if v} == {}
    assert sum(_inside(n, f"{DELTA}.bridge") for n in GRAPH) >= 8
    assert sum(_inside(n, f"{DELTA}.spark") for n in GRAPH) >= 8


CORE_MAY_USE_OF_DELTA = (
    f"{DELTA}.engine",  # the engine interface and the values that cross it
    f"{DELTA}.storage",  # where tables live and which engine runs them
    f"{DELTA}.store",  # the state store: files, leases, S3 settings, a store's errors
    f"{DELTA}.schema",  # Spark's schema rules for appending (buffered records' schema)
    f"{DELTA}.spark.setup",  # Delta's jar and settings, for starting a session with it
)


def test_the_core_reaches_delta_only_through_its_interfaces():
    wrong = {
        name: sorted(
            t
            for t in GRAPH[name]
            if _inside(t, DELTA) and not any(_inside(t, a) for a in CORE_MAY_USE_OF_DELTA)
        )
        for name in GRAPH
        if _inside(name, CORE)
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_code_layout_names_every_module():
    testing = (ROOT / "docs" / "testing.md").read_text()
    section = testing[testing.index("## The code") :]
    block = re.search(r"```\n(dagster_sideinputs/.*?)```", section, re.S)
    assert block, "docs/testing.md's section 'The code' lost its module list"
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*\.py", block.group(1)))
    missing = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and p.name not in named
    )
    assert missing == [], f"add one line per module to docs/testing.md, 'The code': {missing}"


def test_the_continuous_polling_default_is_one_constant_everywhere():
    """The operator, the job builder and the job's run config default to POLL_INTERVAL
    (1 s: bench/latency.py measures the latency it gives)."""
    import inspect

    from dagster_sideinputs.core.operator import POLL_INTERVAL, SideInputOperator
    from dagster_sideinputs.dagster_layer.declaration import RUN_CONFIG
    from dagster_sideinputs.dagster_layer.job import build_side_input_job

    assert POLL_INTERVAL.total_seconds() == 1.0
    assert inspect.signature(SideInputOperator.run).parameters["interval"].default == POLL_INTERVAL
    job_default = inspect.signature(build_side_input_job).parameters["interval_seconds"].default
    assert job_default == RUN_CONFIG["interval_seconds"].default_value == 1.0


def test_modules_sharing_a_server_name_modules_that_use_it():
    """``SHARED_SCOPES`` keeps the modules that share a session's server in one xdist
    worker: a renamed module would silently start the server a second time."""
    from tests.conftest import SHARED_SCOPES

    root = Path(__file__).parent.parent
    for module, scope in SHARED_SCOPES.items():
        for path in (module, scope):
            assert (root / path).is_file(), path
    uses = {  # each scope's server, by the fixtures that reach it
        "tests/core/test_kafka.py": ("kafka_broker",),
        "tests/dagster_layer/test_webserver.py": ("connect_server", "story"),
    }
    assert set(SHARED_SCOPES.values()) == set(uses)
    for module, scope in [*SHARED_SCOPES.items(), *((s, s) for s in uses)]:
        text = (root / module).read_text()
        assert any(fixture in text for fixture in uses[scope]), (module, uses[scope])


def test_the_workers_get_the_modules_in_the_collections_order_end_to_end_first():
    """The scheduler of ``make test`` (xdist's own, with :data:`SHARED_SCOPES`) hands the
    modules out in the collection's order, the long end-to-end modules first. xdist's
    default hands out the modules with the most tests first: a one-test end-to-end module
    would start last and keep one worker running alone."""
    from types import SimpleNamespace
    from typing import Any

    from tests.conftest import pytest_xdist_make_scheduler

    class Worker:
        shutting_down = False

        def __init__(self, name: str) -> None:
            self.gateway = SimpleNamespace(id=name)
            self.sent: list[list[int]] = []

        def send_runtest_some(self, indices: list[int]) -> None:
            self.sent.append(indices)

        def shutdown(self) -> None:
            self.shutting_down = True

    option = SimpleNamespace(loadscopereorder=True)  # xdist's default
    config = SimpleNamespace(getvalue={"dist": "loadfile", "tx": ["2*popen"]}.get, option=option)
    scheduler: Any = pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]
    collection = [
        "tests/test_cluster.py::test_driver_report",  # end to end: one long test
        *(f"tests/core/test_semantics.py::test_{n}" for n in range(5)),
        *(f"tests/core/test_temporal.py::test_{n}" for n in range(4)),
        "tests/test_api.py::test_names",
    ]
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    first = workers[0].sent[0]
    assert [collection[i] for i in first] == collection[:1]
    assert [collection[i] for i in workers[1].sent[0]] == collection[1:6]


def test_a_server_is_stopped_once_the_tests_of_its_scope_are_done_unless_the_next_asks(
    monkeypatch,
):
    """The idle Kafka broker kept a few percent of a core busy for the rest of the run: it
    stops when the next test is in another scope and does not ask for it (not between two
    tests of its scope, which may leave it out: the next may ask again)."""
    from types import SimpleNamespace
    from typing import Any

    from tests import conftest
    from tests.conftest import pytest_runtest_teardown

    # The hook's record of this session's running servers stays as it is.
    monkeypatch.setattr(conftest, "_running_servers", {})

    class Server:
        def __init__(self) -> None:
            self.cached_result: object = ("broker", None, None)
            self.stops = 0

        def finish(self, request: object) -> None:
            self.stops += 1
            self.cached_result = None

    broker = Server()

    def item(nodeid: str, *fixtures: str) -> Any:
        defs = {name: (broker,) for name in fixtures}
        info = SimpleNamespace(name2fixturedefs=defs)
        return SimpleNamespace(
            nodeid=nodeid, fixturenames=list(fixtures), _fixtureinfo=info, _request=None
        )

    kafka = item("tests/core/test_kafka.py::test_read", "kafka_broker")
    pure = item("tests/core/test_kafka.py::test_offsets_parse")  # same scope, no broker
    assets = item("tests/dagster_layer/test_kafka_assets.py::test_run", "kafka_broker")
    other = item("tests/core/test_semantics.py::test_join", "spark")
    pytest_runtest_teardown(kafka, pure)
    assert broker.stops == 0  # its scope goes on
    pytest_runtest_teardown(pure, assets)
    assert broker.stops == 0  # the next test asks for it
    pytest_runtest_teardown(assets, other)
    assert broker.stops == 1
    pytest_runtest_teardown(other, kafka)
    assert broker.stops == 1  # stopped once; the next test that asks starts another


OWN_LOG_CODE = {
    "delta/log/files.py": "lists and reads a table's _delta_log (local, obstore, Spark)",
    "delta/log/replay.py": "which commit and checkpoint files of _delta_log make a version",
    "delta/log/reader.py": "probes V+1.json by name instead of listing the folder",
    "delta/log/commits.py": "reads a range of commit files one by one (a main input's)",
    "delta/bridge/log_commit.py": "writes a local table's next commit file itself",
    "delta/bridge/table.py": "commit_timestamps lists _delta_log and reads each commit's time",
}
"""The library's modules that list, read or write ``_delta_log`` entries themselves, each
with its reason; docs/DECISIONS.md names each (its path, or its folder's) and says why a
library's call does not do instead. Every other module reaches a table's log through them
or through delta-rs and delta-spark."""

_LOG_WORDS = ("_delta_log", "_last_checkpoint", ".checkpoint.")
"""The log folder, or a checkpoint, named in a string."""
_LOG_SUFFIXES = (".json", ".checkpoint", ".crc")
"""What follows a version in the name of a log entry (commit, checkpoint, checksum)."""
_LOG_NAME_TEXT = re.compile(
    r"\\d\{20\}"  # a regex of a version's file name
    r"|(?:^\.?|^/|_delta_log/)(?:%020d|\{[^{}]*:020d\})\.(?:json|checkpoint|crc)"  # a format
)


def _names_log_entry(joined: ast.JoinedStr) -> bool:
    """An f-string building a log entry's name: a 20-digit version then a log suffix, as a
    file's own name (nothing, a dot or a slash before it) or in ``_delta_log/``; not in a
    folder of another name (the operator's ``plans/{batch:020d}.json``)."""
    parts = joined.values
    for i, part in enumerate(parts):
        spec = part.format_spec if isinstance(part, ast.FormattedValue) else None
        if not isinstance(spec, ast.JoinedStr):
            continue
        if "020d" not in "".join(str(v.value) for v in spec.values if isinstance(v, ast.Constant)):
            continue
        before = parts[i - 1] if i else None
        after = parts[i + 1] if i + 1 < len(parts) else None
        prefix = str(before.value) if isinstance(before, ast.Constant) else ""
        named_here = prefix in ("", ".", "/") or prefix.endswith("_delta_log/")
        suffix = str(after.value) if isinstance(after, ast.Constant) else ""
        if named_here and suffix.startswith(_LOG_SUFFIXES):
            return True
    return False


def _identifier(node: ast.AST) -> str | None:
    """The name a variable, an attribute or an imported name refers to."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.name if isinstance(node, ast.alias) else None


def _log_references(path: Path) -> list[str]:
    """Where a module's code (its docstrings left out) names ``_delta_log`` or a log
    entry: the folder or a checkpoint in a string (in a message too), ``LOG_DIR`` (our name
    for the folder), a regex or format of a version's file name, or an f-string building
    one (:func:`_names_log_entry`)."""
    tree = ast.parse(path.read_text(), str(path))
    documents = {  # docstrings, attribute docstrings: strings standing as statements
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if id(node) not in documents and (
                any(word in text for word in _LOG_WORDS) or _LOG_NAME_TEXT.search(text)
            ):
                found.append((line, repr(text[:60])))
        elif isinstance(node, ast.JoinedStr) and _names_log_entry(node):
            found.append((line, "an f-string naming a log entry"))
        elif _identifier(node) == "LOG_DIR":
            found.append((line, "LOG_DIR"))
    return [f"{path.relative_to(PACKAGE)}:{line} {what}" for line, what in sorted(found)]


def test_only_the_modules_docs_decisions_names_read_or_write_the_delta_log_themselves():
    """Issue 38: a module of ours that lists, reads or writes ``_delta_log`` entries itself
    is kept only where a library cannot do it, and docs/DECISIONS.md says why. A new one
    fails here (add it to :data:`OWN_LOG_CODE` with its reason, and to DECISIONS.md, or use
    delta/log/ or a library); one that no longer touches the log must leave the list."""
    touching = {
        str(path.relative_to(PACKAGE)): refs
        for path in sorted(PACKAGE.rglob("*.py"))
        if (refs := _log_references(path))
    }
    assert set(touching) == set(OWN_LOG_CODE), {
        "new (reason it, or go through delta/log/)": {
            m: touching[m][:3] for m in sorted(set(touching) - set(OWN_LOG_CODE))
        },
        "no longer touching the log (remove it)": sorted(set(OWN_LOG_CODE) - set(touching)),
    }
    decisions = (ROOT / "docs" / "DECISIONS.md").read_text()
    unnamed = [  # by its path, or by its folder's (`delta/log/`)
        module
        for module in OWN_LOG_CODE
        if module not in decisions
        and not re.search(re.escape(module.rsplit("/", 1)[0]) + r"/(?![\w.])", decisions)
    ]
    assert unnamed == [], f"docs/DECISIONS.md does not say why these touch _delta_log: {unnamed}"
