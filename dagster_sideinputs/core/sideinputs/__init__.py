"""Side inputs: their declaration and views, windows, as-of validity, readiness, and how
a side input's rows at a pinned version join the main records."""
