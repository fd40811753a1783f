"""The Delta Lake sink on real Ray actors: a host killed mid-run, the table read back with deltalake.

A pass-through job writes the generator's records to a Delta table with a
checkpoint every 0.2 s; the test kills a host once a checkpoint's version is
in the table, and the recovery replays from the last checkpoint. The oracle
is the source's own records (read straight from its splits): the table must
hold each exactly once, and no two table versions may carry one checkpoint.
"""

from __future__ import annotations

import collections
import os

import pytest
import ray

from chiray.operators import Dataflow, generate, to_delta
from tests.gate import Gate, gated
from tests.oracles import source_batches
from tests.waiting import wait_for

deltalake = pytest.importorskip("deltalake")

pytestmark = pytest.mark.usefixtures("ray_session")

N = 4_000
SPLITS = 2
BATCH = 100
COLUMNS = ("key", "seq", "value")


def records(batches) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for batch in batches:
        out.update(zip(*(batch.column(c).to_pylist() for c in COLUMNS)))
    return out


def checkpoint_versions(uri: str) -> dict[str, list[int]]:
    """Checkpoint -> the table versions whose commit info names it (take-backs left out)."""
    out: dict[str, list[int]] = collections.defaultdict(list)
    for h in deltalake.DeltaTable(uri).history():
        if "chiray.checkpoint" in h and "chiray.take_back" not in h:
            out[h["chiray.checkpoint"]].append(h["version"])
    return out


def test_a_killed_host_neither_loses_nor_repeats_a_row_of_the_table(tmp_path):
    os.makedirs(tmp_path / "gate")
    gate = Gate(tmp_path / "gate")
    inner = generate(N, batch_size=BATCH, num_keys=50, num_splits=SPLITS, seed=5)
    src = gated(inner, gate, N / SPLITS, fast=0.3, trickle=1_000, position=lambda offset: offset * BATCH)
    uri = str(tmp_path / "table")
    flow = Dataflow("delta-kill")
    (flow.source(src, parallelism=SPLITS, name="src")
         .map(lambda b: b.select(list(COLUMNS)), name="pass")
         .sink(to_delta(uri, max_rows_per_file=500), parallelism=2, name="delta"))
    job = flow.submit(checkpoint_interval_s=0.2, poll_interval_s=0.2, checkpoint_dir=str(tmp_path / "chk"))
    try:
        log = os.path.join(uri, "_delta_log")  # the sink creates the table at the first checkpoint's commit
        wait_for(lambda: os.path.isdir(log) and any(n.endswith(".json") for n in os.listdir(log)), 60,
                 "a checkpoint's version in the table", interval=0.1)
        ray.kill(job.actors[1], no_restart=True)
        gate.open()
        job.wait(timeout=120)
    finally:
        job.cancel()
    assert any(e.startswith("recovered") for e in job.status().events), job.status().events

    table = deltalake.DeltaTable(uri).to_pyarrow_table()
    assert records(table.to_batches()) == records(source_batches(inner))
    assert table.num_rows == N
    by_checkpoint = checkpoint_versions(uri)
    assert {c: v for c, v in by_checkpoint.items() if len(v) > 1} == {}, by_checkpoint
    assert job.result("delta") == sorted(v for versions in by_checkpoint.values() for v in versions)
    assert not [n for n in os.listdir(uri) if n.startswith(".")], "staged files or a claim left behind"
