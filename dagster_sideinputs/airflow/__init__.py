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
(:func:`~dagster_sideinputs.airflow.provider.get_provider_info`) stays light.
"""

import importlib
from typing import Any

from dagster_sideinputs.errors import DeclarationError

_NAMES = {
    "AirflowReadiness": "dagster_sideinputs.airflow.readiness",
    "SideInputOperatorTask": "dagster_sideinputs.airflow.operator",
    "records_waiting": "dagster_sideinputs.airflow.operator",
    "table_asset": "dagster_sideinputs.airflow.assets",
    "get_provider_info": "dagster_sideinputs.airflow.provider",
}

__all__ = sorted(_NAMES)


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
