"""Which Delta engines a test runs under (tests/core/conftest.py), and on which stores
(tests/conftest.py).

The semantics and bad-input modules run every test once, under the engine users get
(delta-spark); a ``both_engines`` test, and every test of an engine contract module
(``DELTA_ENGINES``), runs under both; ``DSI_BOTH_ENGINES=1`` (``make test-engines``)
gives every test both. Checked on the modules' real test functions.
"""

import types

import pytest

from tests.conftest import STORAGE_CASES, STORES
from tests.core import test_bad_input, test_bad_input_limits, test_one_pass, test_semantics
from tests.core.conftest import ENGINES, default_engine, engines_of

BOTH = tuple(ENGINES)
SEMANTICS = (test_semantics, test_bad_input, test_bad_input_limits)


class Definition:
    def __init__(self, function: types.FunctionType) -> None:
        self.function = function

    def get_closest_marker(self, name: str) -> object | None:
        marks = getattr(self.function, "pytestmark", [])
        return next((m for m in marks if m.name == name), None)


def engines(module: types.ModuleType, name: str) -> tuple[str, ...]:
    function = getattr(module, name)
    call = types.SimpleNamespace(module=module, function=function, definition=Definition(function))
    return engines_of(call)  # type: ignore[arg-type]


def module_tests(module: types.ModuleType) -> list[str]:
    return [name for name in vars(module) if name.startswith("test_")]


@pytest.mark.parametrize("module", SEMANTICS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_semantics_modules_run_once_under_delta_spark_and_both_for_marked_tests(
    module, monkeypatch
):
    monkeypatch.delenv("DSI_BOTH_ENGINES", raising=False)
    monkeypatch.setenv("DSI_DELTA_ENGINE", "auto")
    assert default_engine() == "spark"
    assert getattr(module, "DELTA_ENGINES", None) is None
    chosen = {name: engines(module, name) for name in module_tests(module)}
    assert ("spark",) in chosen.values()
    for name, got in chosen.items():
        marked = Definition(getattr(module, name)).get_closest_marker("both_engines")
        assert got == (BOTH if marked is not None else ("spark",)), name


def test_the_bridge_alone_when_the_environment_asks_for_it(monkeypatch):
    monkeypatch.delenv("DSI_BOTH_ENGINES", raising=False)
    monkeypatch.setenv("DSI_DELTA_ENGINE", "delta-rs")
    assert engines(test_semantics, "test_late_records_go_to_the_late_tag") == ("rs",)


@pytest.mark.parametrize("module", SEMANTICS, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_the_whole_matrix_when_asked(module, monkeypatch):
    monkeypatch.setenv("DSI_BOTH_ENGINES", "1")
    assert all(engines(module, name) == BOTH for name in module_tests(module))


def test_engine_contract_modules_run_every_test_under_both(monkeypatch):
    monkeypatch.delenv("DSI_BOTH_ENGINES", raising=False)
    assert test_one_pass.DELTA_ENGINES == BOTH
    assert all(engines(test_one_pass, name) == BOTH for name in module_tests(test_one_pass))


def test_the_storage_contract_covers_every_store_under_every_engine():
    assert {(case.store, case.engine) for case in STORAGE_CASES} == {
        (store, engine) for store in ("local", "s3") for engine in ("bridge", "native")
    }
    assert {case.store for case in STORES} == {"local", "s3"}
    assert {case.engine for case in STORES} == {"default"}
