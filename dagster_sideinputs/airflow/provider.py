"""Airflow's provider metadata (the ``apache_airflow_provider`` entry point)."""

from importlib.metadata import PackageNotFoundError, version
from typing import Any


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
