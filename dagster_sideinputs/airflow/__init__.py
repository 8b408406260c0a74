"""The Airflow 3 provider: the side-input operator as an Airflow task.

- :class:`SideInputOperatorTask`: one ``available_now`` run of a
  :class:`~dagster_sideinputs.SideInputOperator` per task run, on a Spark session the
  task builds (local, ``spark://``) or attaches to (Spark Connect). Its inlets are the
  main and side inputs' assets, its outlets the outputs' (Airflow ``Asset``\\ s named
  like the tables, with the tables' URIs); each output the run wrote rows to gets an
  asset event whose ``extra`` carries the run's figures (the names of
  ``dagster_sideinputs.dagster_layer.figures.GLOSSARY``).
- :class:`AirflowReadiness`: side inputs are ready from their assets' events.
- :func:`table_asset`: the Airflow asset of a table of a lake.

Needs Airflow 3 (``pip install 'dagster-sideinputs[airflow]'``); imports no Dagster.
Names are loaded on first use, so Airflow's provider discovery
(:func:`get_provider_info`, the ``apache_airflow_provider`` entry point) stays light.
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from dagster_sideinputs.errors import DeclarationError

_NAMES = {
    "AirflowReadiness": "dagster_sideinputs.airflow.readiness",
    "SideInputOperatorTask": "dagster_sideinputs.airflow.operator",
    "table_asset": "dagster_sideinputs.airflow.assets",
}

__all__ = sorted([*_NAMES, "get_provider_info"])


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(_NAMES[name])
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "airflow":
            raise
        raise DeclarationError(
            f"dagster_sideinputs.airflow.{name} needs Apache Airflow 3, which is not "
            "installed in this environment.",
            fix="pip install 'dagster-sideinputs[airflow]'",
        ) from exc
    return getattr(module, name)


def get_provider_info() -> dict[str, Any]:
    """What ``airflow providers list`` and the UI's Providers page show."""
    try:
        versions = [version("dagster-sideinputs")]
    except PackageNotFoundError:  # run from a checkout that was never installed
        versions = []
    return {
        "package-name": "dagster-sideinputs",
        "name": "Side inputs for PySpark (dagster-sideinputs)",
        "description": "Side inputs, side outputs and pre-keyed streams for PySpark, stored "
        "in Delta Lake: an operator whose inputs and outputs are Airflow assets, readiness "
        "from asset events.",
        "versions": versions,
        "integrations": [
            {
                "integration-name": "Side inputs",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "Side inputs",
                "python-modules": ["dagster_sideinputs.airflow.operator"],
            }
        ],
    }
