"""The side-input operator of the payments pipeline, as Dagster assets.

Its declarations and function are ``assets/payments_operator.py`` (what it does is
described there); Airflow runs the same (``assets/airflow_dags/``).
"""

from pyspark.sql import DataFrame

import dagster_sideinputs as dsi
from assets.kafka import transactions_input
from assets.payments_operator import LATE, PROFILE_TIMEOUT, SUSPICIOUS, UNMATCHED, declarations
from assets.payments_operator import payments_enrichment as enrich

__all__ = ["LATE", "PROFILE_TIMEOUT", "SUSPICIOUS", "UNMATCHED", "payments_enrichment"]


@dsi.side_input_assets(
    main=transactions_input(),  # the Delta table, or the Kafka topic (assets/kafka.py)
    **declarations(),
    group_name="payments",
)
def payments_enrichment(main: DataFrame, sides: dsi.SideInputs) -> dsi.Outputs:
    """Enrich transactions with profiles and FX rates; split out suspicious ones."""
    return enrich(main, sides)
