"""The code location's resources (resources/: local Spark and Delta lake by default, or
what the ``DSI_*`` variables name) and its executor."""

import dagster as dg

from resources import RESOURCES

# One Spark session per run: the in-process executor keeps every step of a run (the
# catalog's Materialize included) in the run's process instead of starting a JVM per
# step.
defs = dg.Definitions(resources=RESOURCES, executor=dg.in_process_executor)
