"""One micro-batch: ``run`` steps through its stages (planner, read, route, compute,
write, record), which hand each other a ``context.Batch``; the buffer and the helpers
one stage uses live beside them."""
