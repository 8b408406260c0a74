"""The public names: at most ~35, grouped by concern in ``__all__``, each documented on
docs/api.md (generated from the docstrings: ``python -m tests.test_api`` writes it), and
the names that left the top level still working for one release, with a warning that
gives the new spelling.

Run as a module to write docs/api.md again after a public name or docstring changed.
"""

import ast
import dataclasses
import importlib
import inspect
import itertools
import sys
import warnings
from pathlib import Path

import pytest

import dagster_sideinputs as dsi
from dagster_sideinputs import deprecations, errors
from dagster_sideinputs.core import options

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
INIT = ROOT / "dagster_sideinputs" / "__init__.py"

INTRO = """\
# API reference

Generated from the docstrings by `python -m tests.test_api` (tests/test_api.py checks that
this page and the code agree). `import dagster_sideinputs as dsi` gives every name below;
each section is one group of `dsi.__all__`. Everything else is internal, except the two
public modules at the end: `dagster_sideinputs.errors` and `dagster_sideinputs.tables`.
"""


def groups() -> list[tuple[str, list[str]]]:
    """``__all__``'s groups, as its comments head them in dagster_sideinputs/__init__.py."""
    text = INIT.read_text()
    block = text[text.index("__all__ = [") :]
    block = block[block.index("\n") + 1 : block.index("\n]")]
    found: list[tuple[str, list[str]]] = []
    for line in (raw.strip() for raw in block.splitlines()):
        if line.startswith("#"):
            found.append((line.lstrip("# "), []))
        elif line:
            found[-1][1].append(ast.literal_eval(line.rstrip(",")))
    return found


def _attribute_docstring(module: str, name: str) -> str:
    """The string literal that follows ``name = ...`` at a module's top level."""
    body = ast.parse(Path(inspect.getfile(importlib.import_module(module))).read_text()).body
    for node, after in itertools.pairwise(body):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        named = any(isinstance(t, ast.Name) and t.id == name for t in targets)
        if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            return str(after.value.value)
    raise AssertionError(f"{module}.{name} has no docstring")


def _home(name: str) -> str:
    """The module a public name is defined in (a constant's: where __init__ imports it)."""
    value = getattr(dsi, name)
    module = getattr(value, "__module__", None)
    if inspect.isclass(value) or inspect.isfunction(value):
        return str(module)
    for node in ast.parse(INIT.read_text()).body:
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            return str(node.module)
    raise AssertionError(f"where does {name} come from?")


def summary(name: str, value: object | None = None, home: str | None = None) -> str:
    """The first paragraph of a name's docstring, on one line."""
    value = getattr(dsi, name) if value is None else value
    home = _home(name) if home is None else home
    if inspect.isclass(value) or inspect.isfunction(value):
        doc = inspect.getdoc(value) or ""
    else:
        doc = _attribute_docstring(home, name)
    first = inspect.cleandoc(doc).split("\n\n")[0]
    assert first, f"{name} has no docstring"
    return " ".join(first.split()).replace("|", "\\|")


def _table(rows: list[tuple[str, str]]) -> list[str]:
    return ["| Name | What it is |", "|---|---|", *(f"| `{n}` | {s} |" for n, s in rows), ""]


def render() -> str:
    lines = [INTRO]
    for title, names in groups():
        lines += [f"## {title}", ""]
        lines += _table([(n, f"{summary(n)} (`{_home(n)}`)") for n in names])
    lines += [
        "## `dagster_sideinputs.errors`",
        "",
        "Every error, under `SideInputError` (`message`, and `fix`: what to do). The four "
        "above are also at the top level.",
        "",
    ]
    classes = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, errors.SideInputError)
    ]
    lines += _table(
        [
            (
                f"{c.__name__}({', '.join(b.__name__ for b in c.__bases__)})"
                if c is not errors.SideInputError
                else c.__name__,
                summary(c.__name__, c, "dagster_sideinputs.errors"),
            )
            for c in classes
        ]
    )
    lines += [
        "## `dagster_sideinputs.tables`",
        "",
        " ".join(inspect.cleandoc(dsi.tables.__doc__ or "").split("\n\n")[0].split()),
        "",
    ]
    lines += _table(
        [
            (n, summary(n, getattr(dsi.tables, n), "dagster_sideinputs.tables"))
            for n in dsi.tables.__all__
        ]
    )
    lines += [
        "## Names that moved",
        "",
        "They work until 0.2, and warn once (`DeprecationWarning`) with the new spelling.",
        "",
        "| Old spelling | New spelling |",
        "|---|---|",
        *(f"| `dsi.{old}` | `{new}` |" for old, (_, new) in sorted(dsi._MOVED.items())),
        "",
    ]
    return "\n".join(lines)


def test_the_public_names_are_few_and_grouped_by_concern():
    named = [n for _, names in groups() for n in names]
    assert named == list(dsi.__all__)
    assert len(named) <= 37
    assert len(set(named)) == len(named)
    titles = [t for t, _ in groups()]
    assert titles[-1].startswith("Errors")
    assert "Dagster" in titles
    for name in named:
        assert getattr(dsi, name) is not None


def test_the_api_page_is_the_one_the_docstrings_give():
    assert PAGE.read_text() == render(), "docs/api.md is stale: python -m tests.test_api"


@pytest.mark.parametrize("old", sorted(dsi._MOVED))
def test_an_old_name_still_works_and_warns_once_with_the_new_spelling(old):
    module, spelling = dsi._MOVED[old]
    deprecations.WARNED.discard(f"dagster_sideinputs.{old}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(dsi, old)
        again = getattr(dsi, old)
    assert value is again is getattr(importlib.import_module(module), old)
    assert [w.category for w in caught] == [DeprecationWarning]
    message = str(caught[0].message)
    assert spelling in message
    assert f"dagster_sideinputs.{old}" in message
    assert caught[0].filename == __file__  # points at the caller's line
    assert old not in dsi.__all__


ERRORS_SINCE_THE_MOVE = {"LogCleanedUpError"}
"""Errors added after the top level's errors moved to ``dagster_sideinputs.errors``: they
live there only (no old spelling to keep)."""


def test_every_error_lives_in_the_errors_module_under_one_base():
    for name in dir(errors):
        value = getattr(errors, name)
        if inspect.isclass(value) and issubclass(value, Exception):
            assert issubclass(value, errors.SideInputError), name
            assert name in {*dsi._MOVED, *dsi.__all__, *ERRORS_SINCE_THE_MOVE}, name


ENTRY_POINTS = {
    "SideInputOperator": (dsi.SideInputOperator.__init__, "OperatorArguments"),
    "side_input_assets": (dsi.side_input_assets, "AssetsArguments"),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_an_entry_point_takes_the_options_declared_once(entry):
    """The operator and the Dagster factory list no option of their own: their code takes
    ``**arguments``, and their signature is the one dataclass that declares them, built on
    the shared ``Declaration`` (core/options.py)."""
    function, arguments = ENTRY_POINTS[entry]
    code = function.__code__
    assert code.co_kwonlyargcount == 0
    assert code.co_argcount == (1 if entry == "SideInputOperator" else 0)
    assert code.co_flags & inspect.CO_VARKEYWORDS
    declared = [f.name for f in dataclasses.fields(options.Declaration)]
    parameters = inspect.signature(getattr(dsi, entry)).parameters
    assert set(declared) <= set(parameters)
    module = sys.modules[function.__module__]
    fields = {f.name: f for f in dataclasses.fields(getattr(module, arguments))}
    assert list(parameters) == sorted(
        fields,
        key=lambda name: (
            fields[name].default is not dataclasses.MISSING
            or fields[name].default_factory is not dataclasses.MISSING
        ),
    )
    with pytest.raises(TypeError, match=rf"{entry}\(\) got an unexpected keyword argument 'grup'"):
        getattr(dsi, entry)(grup=1)
    with pytest.raises(TypeError, match=rf"{entry}\(\) missing"):
        getattr(dsi, entry)()


if __name__ == "__main__":
    PAGE.write_text(render())
    sys.stdout.write(f"wrote {PAGE.relative_to(ROOT)}\n")
