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

_NAMES = {
    "AirflowReadiness": "dagster_sideinputs.airflow.readiness",
    "SideInputOperatorTask": "dagster_sideinputs.airflow.operator",
    "records_waiting": "dagster_sideinputs.airflow.operator",
    "table_asset": "dagster_sideinputs.airflow.assets",
    "get_provider_info": "dagster_sideinputs.airflow.provider",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
