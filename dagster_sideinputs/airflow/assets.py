"""Airflow assets of the operator's tables."""

from pathlib import Path

from airflow.sdk import Asset

from dagster_sideinputs.core.declarations import asset_path
from dagster_sideinputs.delta.storage import DeltaStorage


def table_uri(location: str) -> str:
    """A table location as an asset URI: a local path becomes a ``file://`` URI."""
    return Path(location).as_uri() if location.startswith("/") else location


def table_asset(storage: DeltaStorage, name: str, *, prefix: str = "", group: str = "") -> Asset:
    """The Airflow asset of table ``name`` of a lake: named like the table (after
    ``prefix``), its URI the table's location, in ``group`` (default: Airflow's)."""
    uri = table_uri(storage.table_uri(asset_path(name)))
    if group:
        return Asset(name=f"{prefix}{name}", uri=uri, group=group)
    return Asset(name=f"{prefix}{name}", uri=uri)
