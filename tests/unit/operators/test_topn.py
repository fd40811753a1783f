"""TopLogic without a runtime: the n best rows per window against pandas, also while bins move."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.hashing import bins_of
from chiray.operators.topn import RANK, TopLogic

from .support import move_bins, owned

NUM_BINS = 16
SIZE = 10


def window_results(seed: int, windows: int = 30, keys: int = 12) -> list[pa.RecordBatch]:
    """Per-key window results in window order, some keys missing, nulls and ties in ``v``."""
    rng = np.random.default_rng(seed)
    rows = []
    for w in range(windows):
        for k in rng.choice(keys, size=int(rng.integers(0, keys)), replace=False):
            v = None if rng.random() < 0.1 else int(rng.integers(0, 8))
            rows.append({"k": f"k{k}", "window_start": w * SIZE, "window_end": (w + 1) * SIZE, "v": v})
    table = pa.Table.from_pylist(rows, schema=pa.schema([("k", pa.string()), ("window_start", pa.int64()),
                                                          ("window_end", pa.int64()), ("v", pa.int64())]))
    return table.to_batches(max_chunksize=7) or [table.schema.empty_table().to_batches()]


def oracle(batches: list[pa.RecordBatch], n: int) -> dict[int, list]:
    """Per window, the n best values (greatest first, nulls last, ties in arrival order)."""
    df = pa.Table.from_batches(batches).to_pandas()
    df["arrival"] = range(len(df))
    out = {}
    for end, rows in df.groupby("window_end"):
        rows = rows.assign(null=rows["v"].isna()).sort_values(["null", "v", "arrival"],
                                                               ascending=[True, False, True])
        out[int(end)] = [(r.k, None if pd.isna(r.v) else int(r.v)) for r in rows.head(n).itertuples()]
    return out


def got(out: list[pa.RecordBatch]) -> dict[int, list]:
    result: dict[int, list] = {}
    for batch in out:
        for row in batch.to_pylist():
            result.setdefault(row["window_end"], []).append((row[RANK], row["k"], row["v"]))
    return {end: [(k, v) for _, k, v in sorted(rows)] for end, rows in result.items()}


@pytest.mark.parametrize("seed", range(4))
def test_top_n_per_window_matches_pandas_while_bins_move(seed):
    batches = window_results(seed)
    instances = [TopLogic(3, "v", NUM_BINS), TopLogic(3, "v", NUM_BINS)]
    owner = np.array([b % 2 for b in range(NUM_BINS)])
    out: list[pa.RecordBatch] = []
    rng = np.random.default_rng(seed)
    for i, batch in enumerate(batches):
        dest = owner[bins_of(batch.column("window_end"), NUM_BINS)]
        for j, inst in enumerate(instances):
            out += inst.process(batch.filter(pa.array(dest == j)), 0)
        mark = int(batch.column("window_end")[0].as_py()) - SIZE - 1  # every earlier window is complete
        for inst in instances:
            out += inst.on_watermark(mark)
        if i % 5 == 2:  # some bins move, with their open windows and watermark
            src = int(rng.integers(0, 2))
            move_bins(instances, owner, src, [b for b in owned(owner, src) if rng.random() < 0.5])
    for inst in instances:
        out += inst.finish()
    assert got(out) == oracle(batches, 3)
    assert sum(inst.late_records for inst in instances) == 0


def test_one_window_many_rows_keeps_only_n_and_empty_batches_are_fine():
    logic = TopLogic(2, "v", NUM_BINS, descending=False)
    rows = pa.record_batch({"window_start": [0] * 6, "window_end": [10] * 6, "v": [5, 1, None, 1, 9, 0]})
    assert logic.process(rows.slice(0, 0), 0) == []
    assert logic.process(rows, 0) == []
    kept = sum(len(t) for _, t in logic.state.windows[(0, 10)].state.items())
    assert kept == 2  # bounded: at most n rows per window
    out = logic.on_watermark(9)
    assert [(r["v"], r[RANK]) for b in out for r in b.to_pylist()] == [(0, 1), (1, 2)]
    assert logic.process(pa.record_batch({"window_start": [0], "window_end": [10], "v": [-5]}), 0) == []
    assert logic.late_records == 1  # its window was ranked already
