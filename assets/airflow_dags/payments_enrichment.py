"""The example's Airflow DAG: ``payments_enrichment`` (see ``assets/airflow_payments.py``)."""

from assets.airflow_payments import payments_dag

dag = payments_dag()
