"""The README's Python examples and the package's doctests run as written."""

import doctest
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dagster_sideinputs

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


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


MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(dagster_sideinputs.__path__, "dagster_sideinputs.")
)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
