"""The delta-rs bridge engine (``engine.DeltaRsEngine``): Spark writes and reads parquet,
delta-rs reads the log and commits; it imports nothing of the delta-spark engine."""
