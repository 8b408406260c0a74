"""Main-input sources: what is new since the last batch, and reading exactly that.

A source has two sides, used once each per batch:

- the planner asks :meth:`~.main_source.MainSource.next_range` for the slice after the
  previous batch's (Delta versions, new landed files, or Kafka offsets), checking the
  input's identity (a table recreated under the same path, a landed file that changed
  after it was read);
- the read stage asks :meth:`~.main_source.MainSource.files` and
  :meth:`~.main_source.MainSource.read` for the records of a pinned slice, identical on
  a replay.

The protocol and its slice are :mod:`.main_source`; :mod:`.choice` picks the source of a
declaration: a Delta table (:mod:`.delta_table`), a landing folder (:mod:`.landing`) or a
Kafka topic (:mod:`.kafka`).
"""
