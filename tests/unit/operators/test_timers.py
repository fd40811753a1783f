"""Keyed process with event-time timers: pending timers move with their bins and fire once, in time order."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa

from chiray.operators import codec
from chiray.operators.timers import TimerProcessLogic

from .test_windows import JITTER, NUM_BINS, batches, pc_max, route

from .support import move_bins, owned


def test_pending_timers_move_with_their_bins():
    """Timers registered on one instance fire on the one their bin moved to, once, in time order."""
    def on_rows(key, rows, ctx):
        for t in rows.column("t").to_pylist():
            ctx.register(t - t % 10 + 9)
        ctx.value = (ctx.value or 0) + rows.num_rows

    def on_timer(key, time, ctx):
        return [{"k": key, "at": time}]

    data = batches(11, n=300)
    rng = random.Random(11)
    instances = [TimerProcessLogic("k", on_rows, on_timer, NUM_BINS) for _ in range(2)]
    owner = np.array([rng.randrange(2) for _ in range(NUM_BINS)])
    out: list[pa.RecordBatch] = []
    high, marks = -1, []
    for i, batch in enumerate(data):
        for inst, part in zip(instances, route(batch, owner)):
            out += inst.process(part, 0)
        high = max(high, pc_max(batch))
        marks.append(high - JITTER - 1)
        out += instances[0].on_watermark(marks[-1])
        if i >= 3:
            out += instances[1].on_watermark(marks[i - 3])
        if i % 5 == 2:
            src = (i // 5) % 2
            move_bins(instances, owner, src, owned(owner, src)[:4])
    for inst in instances:
        out += inst.finish()
    got = pa.Table.from_batches(out).to_pandas()
    df = pa.Table.from_batches(data).to_pandas()
    expected = set(zip(df["k"], df["t"] - df["t"] % 10 + 9))
    assert not got.duplicated().any() and set(zip(got["k"], got["at"])) == expected
    for _, per_key in got.groupby("k"):
        assert per_key["at"].is_monotonic_increasing
    assert sum(len(inst.state.timers) for inst in instances) == 0  # every timer fired


class _Count:
    """A user object as a key's value."""

    def __init__(self, n: int) -> None:
        self.n = n


def test_values_of_user_functions_are_pickled_and_timers_are_arrow():
    """A bin carries the user's values pickled (any objects) and the pending timers as Arrow IPC only."""
    def on_rows(key, rows, ctx):
        ctx.value = _Count((ctx.value.n if ctx.value else 0) + rows.num_rows)
        ctx.register(50)

    def on_timer(key, time, ctx):
        return [{"k": key, "n": ctx.value.n}]

    instances = [TimerProcessLogic("k", on_rows, on_timer, NUM_BINS) for _ in range(2)]
    instances[0].process(pa.record_batch({"k": ["a", "b", "a"]}), 0)
    bins = instances[0].state.bins()
    doc = codec.decode(instances[0].state.snapshot_bins(bins[:1])[bins[0]])
    assert codec.is_pickle(doc["values"]) and not codec.is_pickle(doc["timers"])
    move_bins(instances, np.zeros(NUM_BINS, dtype=np.int64), 0, bins)
    out = pa.Table.from_batches(instances[1].on_watermark(50)).to_pylist()
    assert sorted(out, key=lambda r: r["k"]) == [{"k": "a", "n": 2}, {"k": "b", "n": 1}]
