"""Live rescale on real Ray actors: every strategy, scale 2 -> 3 -> 1 -> 2 under a continuous stream.

Oracles: the generator's own batches read directly (counts per key, and each
key's sequence of records in arrival order), so any record lost, counted
twice or applied out of order shows.
"""

from __future__ import annotations

import collections
import os
import time

import pyarrow as pa
import pytest
import ray

from actors.rescale import RescaleError
from operators import Dataflow, generate

pytestmark = pytest.mark.usefixtures("ray_session")

BINS = 32


def read_all(src) -> list[pa.RecordBatch]:
    out = []
    for split in src.splits():
        reader = src.open_split(split)
        while (batch := reader.read()) is not None:
            out.append(batch)
    return out


def track(key, rows, state):
    """Per key, the list of record sequence numbers in arrival order; emits each record's position."""
    seqs = state.value or []
    start = len(seqs)
    new = rows.column("seq").to_pylist()
    seqs.extend(new)
    state.value = seqs
    return pa.record_batch({"key": [key] * len(new), "seq": new, "pos": list(range(start, start + len(new)))})


def build(name: str, counted, ordered) -> Dataflow:
    flow = Dataflow(name)
    flow.source(counted, parallelism=2, name="src").key_by("key", num_bins=BINS).count(
        parallelism=2, name="count").collect(name="counts")
    flow.source(ordered, parallelism=1, name="src1").key_by("key", num_bins=BINS).process(
        track, parallelism=2, name="seqs").collect(name="positions")
    return flow


def check_exact(job, counted, ordered) -> None:
    expected = collections.Counter()
    for batch in read_all(counted):
        expected.update(batch.column("key").to_pylist())
    got = {r["key"]: r["count"] for r in job.result("counts").to_pylist()}
    assert got == dict(expected)
    arrival: dict[str, list[int]] = collections.defaultdict(list)  # one upstream: arrival order is seq order
    for batch in read_all(ordered):
        for k, s in zip(batch.column("key").to_pylist(), batch.column("seq").to_pylist()):
            arrival[k].append(s)
    seen: dict[str, dict[int, int]] = collections.defaultdict(dict)
    for row in job.result("positions").to_pylist():
        assert row["pos"] not in seen[row["key"]], f"key {row['key']}: position {row['pos']} twice"
        seen[row["key"]][row["pos"]] = row["seq"]
    assert set(seen) == set(arrival)
    for key, by_pos in seen.items():
        assert [by_pos[i] for i in range(len(by_pos))] == arrival[key], f"key {key}: state lost or reordered"


def switchable_clock(flag: str):
    """A pacing clock that jumps far ahead once ``flag`` exists: the rest of the input is due at once."""
    def clock() -> float:
        return time.monotonic() + (1e9 if os.path.exists(flag) else 0.0)
    return clock


COUNTED = 4_000_000


def sources(tmp_path, counted_n: int = COUNTED, ordered_n: int = 600_000):
    """Paced for minutes (so rescales happen while input flows, however loaded the machine); a test
    lifts the pacing once done."""
    flag = str(tmp_path / "full-speed")
    counted = generate(counted_n, rate=40_000, batch_size=1000, num_keys=200, num_splits=2, seed=3,
                       clock=switchable_clock(flag))
    ordered = generate(ordered_n, rate=5_000, batch_size=250, num_keys=50, num_splits=1, seed=4,
                       clock=switchable_clock(flag))
    return counted, ordered, flag


def wait_records(job, operator: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while job.statistics().records_out(operator) < n:
        assert time.monotonic() < deadline, f"{operator} emitted fewer than {n} records in {timeout} s"
        time.sleep(0.05)


@pytest.mark.parametrize("strategy,knobs", [
    ("all_at_once", {}),
    ("batched", {"chunk_bins": 4}),
    ("fluid", {}),
    ("non_disruptive", {"chunk_bins": 4}),
])
def test_scale_2_3_1_2_is_exact(strategy, knobs, tmp_path):
    counted, ordered, flag = sources(tmp_path)
    job = build(f"rescale-{strategy}", counted, ordered).submit()
    try:
        wait_records(job, "src", 20_000)
        for p in (3, 1, 2):
            handles = [job.rescale(op, p, strategy=strategy, **knobs) for op in ("count", "seqs")]
            for handle in handles:
                progress = handle.result(120)
                assert progress["state"] == "DONE" and progress["parallelism"] == p
                assert progress["bins_moved"] == progress["bins"] > 0
        stats = job.statistics()
        assert stats.records_out("src") < COUNTED, "the input ended before the rescales"
        assert sorted(s.index for s in stats.of("count") if not s.finished) == [0, 1]
        open(flag, "w").close()  # let the rest of the input through at full speed
        job.wait(timeout=120)
    finally:
        job.cancel()
    check_exact(job, counted, ordered)
