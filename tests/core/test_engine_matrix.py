"""Which Delta engines a test of a ``DELTA_ENGINES`` module runs under (tests/core/conftest.py).

Checked on the collected tests of the modules that take the engines in turn: each engine
gets about half of them, a ``both_engines`` test gets both, and ``DSI_BOTH_ENGINES=1``
gives every test both.
"""

import types

import pytest

from tests.core import test_bad_input, test_bad_input_limits, test_semantics
from tests.core.conftest import ALTERNATE, _engines_of

ENGINES = ("rs", "spark")
ALTERNATING = (test_semantics, test_bad_input, test_bad_input_limits)


class Definition:
    def __init__(self, function: types.FunctionType) -> None:
        self.function = function

    def get_closest_marker(self, name: str) -> object | None:
        marks = getattr(self.function, "pytestmark", [])
        return next((m for m in marks if m.name == name), None)


def engines_of(module: types.ModuleType, name: str) -> tuple[str, ...]:
    function = getattr(module, name)
    call = types.SimpleNamespace(module=module, function=function, definition=Definition(function))
    return _engines_of(call, ENGINES)  # type: ignore[arg-type]


def module_tests(module: types.ModuleType) -> list[str]:
    return [name for name in vars(module) if name.startswith("test_")]


@pytest.mark.parametrize("module", ALTERNATING, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_alternating_modules_give_each_engine_about_half_and_both_to_marked_tests(
    module, monkeypatch
):
    monkeypatch.delenv("DSI_BOTH_ENGINES", raising=False)
    assert module.ENGINE_MATRIX == ALTERNATE
    chosen = {name: engines_of(module, name) for name in module_tests(module)}
    single = [engines for engines in chosen.values() if len(engines) == 1]
    assert single, "no test takes the engines in turn"
    runs = {engine: sum(engines.count(engine) for engines in single) for engine in ENGINES}
    assert abs(runs["rs"] - runs["spark"]) <= len(single) // 4 + 1, runs
    for name, engines in chosen.items():
        marked = Definition(getattr(module, name)).get_closest_marker("both_engines")
        assert (engines == ENGINES) == (marked is not None), name


@pytest.mark.parametrize("module", ALTERNATING, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_the_whole_matrix_when_asked(module, monkeypatch):
    monkeypatch.setenv("DSI_BOTH_ENGINES", "1")
    assert all(engines_of(module, name) == ENGINES for name in module_tests(module))


def test_modules_without_the_turn_keep_both_engines(monkeypatch):
    from tests.core import test_one_pass

    monkeypatch.delenv("DSI_BOTH_ENGINES", raising=False)
    assert getattr(test_one_pass, "ENGINE_MATRIX", None) is None
    assert all(engines_of(test_one_pass, name) == ENGINES for name in module_tests(test_one_pass))
