"""The code location, a ``dg`` project (``[tool.dg]`` in pyproject.toml): ``dg dev`` and
``dagster dev -w workspace.yaml`` load ``defs``, the definitions of ``assets/defs/``."""

from pathlib import Path

import dagster as dg

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
