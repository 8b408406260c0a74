"""An example Dagster code location: enriching and splitting a payments stream."""
