"""How the package installs: ``make install``'s editable install prints no warning of
the build backend, and a wheel holds the library alone."""

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _copy_project(target: Path) -> Path:
    """What a build reads: the metadata, the README and the package (no caches)."""
    project = target / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(
        REPO / "dagster_sideinputs",
        project / "dagster_sideinputs",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return project


@pytest.mark.slow
def test_the_editable_install_prints_no_build_backend_warning(tmp_path):
    """Before: setuptools chose its import-finder strategy for the flat layout and printed
    "BuildBackendWarning: Editable installation" on every ``make install``."""
    project = _copy_project(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # As make install does (the pip Python bundles does not show the backend's warnings).
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        check=True,
        timeout=600,
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(project)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    assert "Warning" not in installed.stdout + installed.stderr, installed.stderr
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print(u.find_spec('dagster_sideinputs').origin)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert found.stdout.strip() == str(project / "dagster_sideinputs" / "__init__.py")
