"""How the package installs: ``make install``'s editable install prints no warning of
the build backend, and maps the library alone (not the repository's top: tests/,
bench/, assets/ stay out of every process of the venv, Spark's executors included)."""

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The scratch venv's processes, without this session's PYTHONPATH (which names a checkout).
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _copy_project(target: Path) -> Path:
    """What a build reads (the metadata, the README, the package), and a ``tests`` package
    and a ``bench/operator.py`` beside it, as in the repository."""
    project = target / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(
        REPO / "dagster_sideinputs",
        project / "dagster_sideinputs",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (project / "tests").mkdir()
    (project / "tests" / "__init__.py").write_text("")
    (project / "bench").mkdir()
    (project / "bench" / "operator.py").write_text("raise SystemExit('not the stdlib')\n")
    return project


def _python(python: Path, code: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_the_editable_install_prints_no_warning_and_maps_the_package_alone(tmp_path):
    """Before: setuptools chose its import-finder strategy for the flat layout and printed
    "BuildBackendWarning: Editable installation" on every ``make install`` (and its other
    strategy, a .pth naming the repository's top, made tests/ importable everywhere)."""
    project = _copy_project(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # As make install does (the pip Python bundles does not show the backend's warnings);
    # `editables` is what the editable install requires at run time (--no-deps below
    # leaves out pyspark & co., which this test does not need).
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip", "editables"],
        check=True,
        env=ENV,
        timeout=600,
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(project)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    assert "Warning" not in installed.stdout + installed.stderr, installed.stderr

    origins = _python(
        python,
        "import importlib.util as u\n"
        "for name in ('dagster_sideinputs', 'tests', 'bench'):\n"
        "    spec = u.find_spec(name)\n"
        "    print(spec.origin if spec else None)\n",
        cwd=tmp_path,
    ).splitlines()
    assert origins == [str(project / "dagster_sideinputs" / "__init__.py"), "None", "None"]
    # A bench script's own folder comes first on its path: the stdlib's operator module,
    # imported when the interpreter starts, is the one every later import gets.
    script = project / "bench" / "uses_operator.py"
    script.write_text("import operator\nprint(operator.__file__)\n")
    done = subprocess.run(
        [str(python), str(script)], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "bench" not in done.stdout
