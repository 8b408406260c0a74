"""The operator's core: plain PySpark, no Dagster, no Delta library (Delta goes through
:class:`~dagster_sideinputs.delta.engine.DeltaEngine`).

Every module here is internal; the public names are those re-exported by
``dagster_sideinputs``. One concept per module:

Declarations
    ``declarations`` main input, key groups, buffer limits; ``side_inputs`` side inputs
    and their view factories; ``windows`` windows and namespaces; ``outputs`` output
    tags and what the function gets and returns; ``options`` the declaration as one
    value; ``spec`` the declaration resolved against a storage, and its checks.

A batch (``batch`` runs the stages in order; ``context`` is what they hand each other)
    ``planner`` plan (``plan`` the plan value, ``sources`` the main input's slices,
    ``readiness`` who decides readiness); ``read`` new and buffered records; ``route``
    side views joined, routes, counts, checks (``views`` one class per view kind,
    ``side_data`` side rows at a pinned version); ``compute`` the user function (``rows``
    row mode on executors, ``row_inputs`` its side values); ``write`` stage every
    output, then commit; ``record`` metrics (``metrics``) and the commit record.

Buffering
    ``buffer``: slots, slot choice, reading, limits and overflow, rows written back,
    numbers after a batch.

State and recovery
    ``state`` plans, commit records, identity file; ``identity`` checks the state
    against the declaration and the tables; ``recovery`` replay or re-plan an incomplete
    batch; ``reset`` the explicit start-over; ``lock`` one run at a time.

Spark
    ``session`` building a SparkSession; ``keyed`` key groups and pre-keyed scans;
    ``spark_errors`` Spark's errors as the project's; ``columns`` internal column names.
"""
