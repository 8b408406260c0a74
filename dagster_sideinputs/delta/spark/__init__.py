"""The delta-spark engine (``engine.DeltaSparkEngine``): Delta's own writer and
transaction, usable over Spark Connect; it imports nothing of the delta-rs bridge."""
