"""Join logics without a runtime: both sides of a key move together with its bin, and the join stays exact."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.hashing import bins_of
from chiray.operators.joins import JoinLogic, WindowJoinLogic
from chiray.operators.windows import tumbling

NUM_BINS = 16


def side(seed: int, n: int, key: str, value: str) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    rows = [{key: f"u{rng.randrange(10)}", "t": i * 3 + rng.randrange(20), value: rng.randint(0, 99)}
            for i in range(n)]
    return pa.Table.from_pylist(rows).to_batches(max_chunksize=7)


def route(batch: pa.RecordBatch, key: str, owner: np.ndarray) -> list[pa.RecordBatch]:
    dest = owner[bins_of(batch.column(key), NUM_BINS)]
    return [batch.filter(pa.array(dest == i)) for i in (0, 1)]


def sort(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


@pytest.mark.parametrize("windowed", [False, True], ids=["incremental", "window"])
@pytest.mark.parametrize("seed", range(3))
def test_join_state_moves_with_its_bins(windowed, seed):
    rng = random.Random(seed)
    left, right = side(seed, 200, "user", "amount"), side(seed + 9, 200, "id", "score")

    def make():
        if windowed:
            return WindowJoinLogic(("user", "id"), ("t", "t"), tumbling(30), NUM_BINS)
        return JoinLogic(("user", "id"), NUM_BINS)

    instances = [make(), make()]
    owner = np.array([rng.randrange(2) for _ in range(NUM_BINS)])
    out: list[pa.RecordBatch] = []
    high = -1
    for i, (lb, rb) in enumerate(zip(left, right)):
        for side_index, (batch, key) in enumerate(((lb, "user"), (rb, "id"))):
            for inst, part in zip(instances, route(batch, key, owner)):
                out += inst.process(part, side_index)
        high = max(high, int(np.max(lb.column("t"))), int(np.max(rb.column("t"))))
        for j, inst in enumerate(instances):  # instance 1 sees the watermark two batches late
            out += inst.on_watermark(high - 21 - (0 if j == 0 else 6))
        if i % 6 == 2:
            src = (i // 6) % 2
            moving = [b for b in range(NUM_BINS) if owner[b] == src][:4]
            instances[1 - src].state.install_bins(instances[src].state.extract_bins(moving))
            owner[moving] = 1 - src
    for inst in instances:
        out += inst.finish()
    ldf, rdf = pa.Table.from_batches(left).to_pandas(), pa.Table.from_batches(right).to_pandas()
    on_left, on_right = ["user"], ["id"]
    if windowed:
        ldf["window_start"], rdf["window_start"] = ldf["t"] // 30 * 30, rdf["t"] // 30 * 30
        on_left, on_right = ["user", "window_start"], ["id", "window_start"]
    expected = pd.merge(ldf, rdf, left_on=on_left, right_on=on_right, suffixes=("", "_right")).drop(columns="id")
    got = pa.Table.from_batches(out).to_pandas()
    if windowed:
        got = got.drop(columns="window_end")
    pd.testing.assert_frame_equal(sort(got), sort(expected[list(got.columns)]))
    assert sum(getattr(inst, "late_records", 0) for inst in instances) == 0
