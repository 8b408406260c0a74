"""The exactly-once invariant as a test helper.

After any input, state change or failure, once the cause is fixed and the operator
rerun, every main-input record is in exactly one place: the main output or a route (an
output that accounts for records: ``late``, ``unmatched``, ``overflow``, ``invalid``,
and any side output the test says partitions the records), or the buffer.
"""

from collections import Counter
from collections.abc import Iterable, Sequence

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch.buffer import load_state
from dagster_sideinputs.delta.bridge.engine import DeltaRsEngine
from dagster_sideinputs.delta.bridge.read import read_table


def ids_in(spark, uri: str, column: str) -> list:
    """The values of ``column`` in a Delta table (none when the table does not exist)."""
    if not DeltaRsEngine().exists(uri):
        return []
    frame = read_table(spark, uri)
    if column not in frame.columns:
        return []
    return [row[0] for row in frame.select(column).collect()]


def placement(
    spark, op: dsi.SideInputOperator, column: str, *, outputs: Iterable[str] | None = None
) -> Counter:
    """How many times each id appears across the accounting outputs and the buffer.

    Args:
        outputs: the output names that partition the records (default: the main output
            and every declared route).
    """
    spec = op.spec
    names = (
        list(outputs)
        if outputs is not None
        else [spec.main_tag.name, *[tag.name for tag in spec.routes.values()]]
    )
    found: Counter = Counter()
    for name in dict.fromkeys(names):
        found.update(ids_in(spark, op.output_tables[name], column))
    if load_state(spec).snapshot is not None:
        found.update(ids_in(spark, spec.buffer_uri, column))
    return found


def assert_accounted(
    spark,
    op: dsi.SideInputOperator,
    expected: Sequence,
    *,
    column: str = "tx_id",
    outputs: Iterable[str] | None = None,
) -> None:
    """Every expected id exactly once across the accounting outputs and the buffer, and
    nothing else there."""
    found = placement(spark, op, column, outputs=outputs)
    missing = sorted(set(expected) - set(found), key=repr)
    duplicated = sorted((i for i, n in found.items() if n > 1), key=repr)
    unexpected = sorted(set(found) - set(expected), key=repr)
    assert not missing, f"lost: {missing}"
    assert not duplicated, f"duplicated: {duplicated}"
    assert not unexpected, f"unexpected: {unexpected}"
