"""The operator's own state: its folder of batch plans and commit records (``folder``),
the plan format, the check that the state belongs to its tables (``identity``),
what a run does with an interrupted batch (``recovery``), the explicit reset, and the
one-run-at-a-time lock."""
