"""What a batch reads of the operator's own state does not grow with its history."""

import datetime as dt
import json
from pathlib import Path

from pyspark.sql import functions as F

import dagster_sideinputs as dsi
from dagster_sideinputs.core.batch import record
from dagster_sideinputs.core.batch.record import RETENTION_KEY
from dagster_sideinputs.core.state import folder as state

TX = "tx_id long, customer_id long, amount double"
PROFILES = "customer_id long, name string"
WAIT = dsi.Wait(dt.timedelta(days=1), then="null")


def test_the_ledger_and_the_state_folder_stay_small(lake, tmp_path, monkeypatch):
    monkeypatch.setattr(record, "VACUUM_EVERY", 3)
    monkeypatch.setattr(state, "KEEP", 2)
    folder = tmp_path / "landing"
    folder.mkdir()
    lake.append("profiles", [(10, "ann")], PROFILES)
    op = lake.operator(
        main=dsi.MainInput.files(str(folder), format="json", schema=TX, key="customer_id"),
        side_inputs={"profile": dsi.SideInput.map("profiles", key="customer_id", missing=WAIT)},
        fn=lambda main, sides: main.select("tx_id", F.col("profile.name").alias("name")),
        main_output="enriched",
    )
    # A record whose profile never comes waits in the buffer all along.
    (folder / "waiting.json").write_text(json.dumps({"tx_id": 99, "customer_id": 11}))
    for tx in range(4):
        (folder / f"{tx}.json").write_text(
            json.dumps({"tx_id": tx, "customer_id": 10, "amount": 1.0})
        )
        assert [b.rows_in for b in lake.run(op).batches] == [2 if tx == 0 else 1]
    engine = lake.storage.delta
    ledger = op.spec.files_seen_uri
    # Batch 2 compacted the ledger's three one-row files into one; batch 3 added one.
    assert len(engine.snapshot(ledger).files) == 2
    assert engine.transaction_version(ledger, op.operator_id) == 3
    # Housekeeping gave the operator's own tables a short log retention.
    assert len(op.spec.own_tables()) == 2  # the buffer and the ledger
    for uri in op.spec.own_tables():
        assert engine.snapshot(uri).configuration[RETENTION_KEY] == "interval 1 hour"
    assert lake.run(op).batches == []  # every landed file is still known as read
    assert lake.rows("enriched") == [(tx, "ann") for tx in range(4)]
    root = Path(op.state_uri)
    assert sorted(p.name for p in (root / "commits").iterdir()) == [
        f"{b:020d}.json" for b in (2, 3)
    ]
    assert sorted(p.name for p in (root / "plans").iterdir() if p.is_file()) == [
        f"{b:020d}.json" for b in (2, 3)
    ]
