"""Session windows without a runtime: bins move between instances with their sessions and watermark."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.aggregates import AggSpec
from chiray.operators.sessions import SessionWindowLogic, merge_sessions
from chiray.operators.windows import session

from .test_windows import JITTER, NUM_BINS, batches, pc_max, route

from .support import move_bins, owned

GAP = 12


def logic() -> SessionWindowLogic:
    return SessionWindowLogic("k", "t", session(GAP), NUM_BINS, aggs=[AggSpec("n", "count"), AggSpec("s", "sum", "v")])


def oracle(table: pa.Table) -> pd.DataFrame:
    df = table.to_pandas().sort_values(["k", "t"], kind="stable")
    df["sid"] = ((df["k"] != df["k"].shift()) | (df["t"] - df["t"].shift() >= GAP)).cumsum()
    out = df.groupby("sid").agg(k=("k", "first"), window_start=("t", "min"), last=("t", "max"),
                                n=("v", "count"), s=("v", "sum"))
    out["window_end"] = out["last"] + GAP
    return out[["k", "window_start", "window_end", "n", "s"]].sort_values(["k", "window_start"]).reset_index(drop=True)


def normal(out: list[pa.RecordBatch]) -> pd.DataFrame:
    df = pa.Table.from_batches([b for b in out if b.num_rows]).to_pandas()
    assert not df.duplicated(["k", "window_start"]).any(), "a session fired twice"
    cols = ["k", "window_start", "window_end", "n", "s"]
    return df[cols].sort_values(["k", "window_start"]).reset_index(drop=True)


@pytest.mark.parametrize("seed", range(4))
def test_sessions_move_with_their_bins(seed):
    rng = random.Random(seed)
    data = batches(seed, n=300)
    instances = [logic(), logic()]
    owner = np.array([rng.randrange(2) for _ in range(NUM_BINS)])
    out: list[pa.RecordBatch] = []
    high, marks, lag = -1, [], rng.randrange(1, 6)
    for i, batch in enumerate(data):
        for inst, part in zip(instances, route(batch, owner)):
            out += inst.process(part, 0)
        high = max(high, pc_max(batch))
        marks.append(high - JITTER - 1)
        out += instances[0].on_watermark(marks[-1])
        if i >= lag:
            out += instances[1].on_watermark(marks[i - lag])
        if i % 7 == 3:
            src = (i // 7) % 2
            move_bins(instances, owner, src, owned(owner, src)[:3])
    for inst in instances:
        out += inst.finish()
    pd.testing.assert_frame_equal(normal(out), oracle(pa.Table.from_batches(data)), check_dtype=False)


def test_a_record_that_bridges_two_sessions_merges_them():
    rows = pa.record_batch({"t": [1, 30]})
    sessions, _ = merge_sessions([], np.array([1, 30]), rows, 10)
    assert [(s[0], s[1]) for s in sessions] == [(1, 11), (30, 40)]
    merged, touched = merge_sessions(sessions, np.array([8, 17, 25]), pa.record_batch({"t": [8, 17, 25]}), 10)
    assert [(s[0], s[1], sum(p.num_rows for p in s[2])) for s in merged] == [(1, 40, 5)] and touched == [0]



def test_user_function_over_each_session():
    def spread(key, start, end, rows):
        t = rows.column("t").to_pylist()
        return [{"k": key, "window_start": start, "window_end": end, "n": len(t), "s": max(t) - min(t)}]

    data = batches(5, n=200)
    logic_fn = SessionWindowLogic("k", "t", session(GAP), NUM_BINS, fn=spread)
    out: list[pa.RecordBatch] = []
    high = -1
    for batch in data:
        high = max(high, pc_max(batch))
        out += logic_fn.process(batch, 0) + logic_fn.on_watermark(high - JITTER - 1)
    out += logic_fn.finish()
    got = pa.Table.from_batches(out).to_pandas().sort_values(["k", "window_start"]).reset_index(drop=True)
    expected = oracle(pa.Table.from_batches(data))
    assert got["n"].tolist() == expected["n"].tolist()
    assert got["window_end"].tolist() == expected["window_end"].tolist()
    assert (got["s"] == got["window_end"] - GAP - got["window_start"]).all()


def test_a_bin_of_sessions_carries_only_its_own_rows():
    """Sessions keep zero-copy slices of input batches; a bin's payload must not carry the whole batch."""
    n = 20_000
    batch = pa.record_batch({"k": [f"k{i}" for i in range(n)], "t": list(range(n)), "v": [1] * n})
    s = logic()
    s.process(batch, 0)
    sizes = s.state.bin_key_counts()
    b = max(sizes, key=sizes.get)
    payload = s.state.snapshot_bins([b])[b]
    assert len(payload) < 1_000 * sizes[b]  # under a kilobyte a one-row session (the whole batch is 500 KB)
