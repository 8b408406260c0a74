"""The example's definitions, loaded by ``dg.load_from_defs_folder`` (assets/definitions.py)."""
