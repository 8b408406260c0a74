"""Reading a Delta table's ``_delta_log`` ourselves, for both engines: which files make a
version (``files``, ``replay``), a version's state (``state``, ``lazy_files``), states
cached per version and probed (``reader``), and a range of commits one by one
(``commits``). Why not a library's: docs/DECISIONS.md, "A batch's Delta bookkeeping at any
history depth"."""
