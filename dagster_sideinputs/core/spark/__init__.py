"""Starting Spark for the operator: a local session or one attached to a cluster or a
Spark Connect server (:mod:`.session`), the optional JVM packages and their jar lists
(:mod:`.packages`, :mod:`.jars`), Java (:mod:`.java_runtime`), faster local JVM starts
(:mod:`.jvm_archive`), and Spark Connect's checks (:mod:`.connect`).

Nothing here knows the operator: the operator, the Dagster resource, the Airflow task
and the tests build their sessions through it.
"""
