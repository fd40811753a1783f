"""Window logics without a runtime: bins (with open windows and the watermark) move between instances exactly.

Batches are routed by bin to two logic instances, as a hash router would;
mid-stream some bins move from one to the other (``extract_bins`` ->
``install_bins``), also between instances whose watermarks differ. The
union of their outputs must be the batch group-by over the same input
(pandas), every window exactly once.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.aggregates import AggSpec
from chiray.operators.hashing import bins_of
from chiray.operators.windows import FixedWindowLogic, sliding, tumbling

from .support import move_bins, owned

NUM_BINS = 16
JITTER = 30


def batches(seed: int, n: int = 400, size: int = 9) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    rows = [{"k": f"k{rng.randrange(12)}", "t": i * 2 + rng.randrange(JITTER), "v": rng.randint(0, 9)}
            for i in range(n)]
    return pa.Table.from_pylist(rows).to_batches(max_chunksize=size)


def oracle(table: pa.Table, size: int, slide: int) -> pd.DataFrame:
    df = table.to_pandas()
    parts = [df.assign(window_start=df["t"] - df["t"] % slide - j * slide) for j in range(size // slide)]
    out = pd.concat(parts).groupby(["k", "window_start"])["v"].agg(n="count", s="sum").reset_index()
    return out.sort_values(["k", "window_start"]).reset_index(drop=True)


def normal(out: list[pa.RecordBatch]) -> pd.DataFrame:
    df = pa.Table.from_batches([b for b in out if b.num_rows]).to_pandas()
    assert not df.duplicated(["k", "window_start"]).any(), "a window fired twice"
    return df[["k", "window_start", "n", "s"]].sort_values(["k", "window_start"]).reset_index(drop=True)


def logic(spec) -> FixedWindowLogic:
    return FixedWindowLogic("k", "t", spec, NUM_BINS, aggs=[AggSpec("n", "count"), AggSpec("s", "sum", "v")])


def route(batch: pa.RecordBatch, owner: np.ndarray) -> list[pa.RecordBatch]:
    dest = owner[bins_of(batch.column("k"), NUM_BINS)]
    return [batch.filter(pa.array(dest == i)) for i in (0, 1)]


@pytest.mark.parametrize("spec", [tumbling(40), sliding(40, 10)], ids=["tumbling", "sliding"])
@pytest.mark.parametrize("seed", range(4))
def test_bins_move_with_their_windows_and_watermark(spec, seed):
    """Watermarks reach the two instances at different times; bins move both ways mid-stream."""
    rng = random.Random(seed)
    data = batches(seed)
    instances = [logic(spec), logic(spec)]
    owner = np.array([rng.randrange(2) for _ in range(NUM_BINS)])
    out: list[pa.RecordBatch] = []
    high = -1
    lag = rng.randrange(1, 6)  # instance 1 sees watermarks that many batches late
    marks: list[int] = []
    for i, batch in enumerate(data):
        for inst, part in zip(instances, route(batch, owner)):
            out += inst.process(part, 0)
        high = max(high, pc_max(batch))
        marks.append(high - JITTER - 1)
        out += instances[0].on_watermark(marks[-1])
        if i >= lag:
            out += instances[1].on_watermark(marks[i - lag])
        if i % 9 == 4:  # move a few bins, alternately each way
            src = (i // 9) % 2
            move_bins(instances, owner, src, owned(owner, src)[:3])
    for inst in instances:
        out += inst.finish()
    size, slide = (40, 40) if spec.kind == "tumbling" else (40, 10)
    pd.testing.assert_frame_equal(normal(out), oracle(pa.Table.from_batches(data), size, slide),
                                  check_dtype=False)
    assert sum(inst.late_records for inst in instances) == 0


def pc_max(batch: pa.RecordBatch) -> int:
    return int(np.max(batch.column("t").to_numpy()))


def test_snapshot_restores_windows_and_watermark():
    """A checkpoint of every bin, installed in a fresh instance, continues exactly (and keeps event time)."""
    data = batches(7)
    ref, first = logic(tumbling(40)), logic(tumbling(40))
    out_ref: list[pa.RecordBatch] = []
    out: list[pa.RecordBatch] = []
    high = -1
    for i, batch in enumerate(data):
        high = max(high, pc_max(batch))
        out_ref += ref.process(batch, 0) + ref.on_watermark(high - JITTER - 1)
        if i < 20:
            out += first.process(batch, 0) + first.on_watermark(high - JITTER - 1)
        if i == 19:
            saved = first.state.snapshot_bins(first.state.bins())
            restored = logic(tumbling(40))
            restored.state.install_bins(saved)
            assert restored.state.watermark == first.state.watermark
        if i >= 20:
            out += restored.process(batch, 0) + restored.on_watermark(high - JITTER - 1)
    out_ref += ref.finish()
    out += restored.finish()
    pd.testing.assert_frame_equal(normal(out), normal(out_ref))


def test_late_record_after_a_restore_stays_late():
    """The watermark travels in the bins: a record behind it is late after the restore too."""
    a = logic(tumbling(10))
    a.process(pa.record_batch({"k": ["x"], "t": [5], "v": [1]}), 0)
    fired = a.on_watermark(30)
    assert [r["n"] for b in fired for r in b.to_pylist()] == [1]
    b = logic(tumbling(10))
    b.state.install_bins(a.state.snapshot_bins(a.state.bins()))
    assert b.process(pa.record_batch({"k": ["x"], "t": [7], "v": [1]}), 0) == []
    assert b.late_records == 1 and b.finish() == []


def test_user_function_over_each_window():
    def total(key, start, end, rows):
        return [{"k": key, "window_start": start, "n": rows.num_rows, "s": int(np.sum(rows.column("v")))}]

    data = batches(3)
    a = FixedWindowLogic("k", "t", tumbling(40), NUM_BINS, fn=total)
    b = FixedWindowLogic("k", "t", tumbling(40), NUM_BINS, fn=total)
    out: list[pa.RecordBatch] = []
    high = -1
    for i, batch in enumerate(data):
        high = max(high, pc_max(batch))
        current = a if i < 15 else b
        out += current.process(batch, 0) + current.on_watermark(high - JITTER - 1)
        if i == 14:
            b.state.install_bins(a.state.extract_bins(range(NUM_BINS)))
            assert len(a.state) == 0
    out += a.finish() + b.finish()
    pd.testing.assert_frame_equal(normal(out), oracle(pa.Table.from_batches(data), 40, 40), check_dtype=False)


def test_apply_is_consistent_with_agg_timestamps_key_and_window_columns_first():
    """A timestamp time column: apply's function gets datetime bounds and a Table; the output starts with the
    key and the window's bounds as timestamps, exactly like agg's."""
    import datetime

    seen = []

    def stats(key, start, end, rows):
        seen.append((type(start), type(end), type(rows)))
        return [{"n": rows.num_rows, "total": sum(rows.column("v").to_pylist())}]

    t0 = datetime.datetime(2026, 1, 1)
    ts = pa.array([t0 + datetime.timedelta(seconds=s) for s in (1, 5, 61, 62)], pa.timestamp("ms"))
    batch = pa.record_batch({"k": ["a", "b", "a", "a"], "ts": ts, "v": [1, 2, 3, 4]})
    minute = datetime.timedelta(minutes=1)
    applied = FixedWindowLogic("k", "ts", tumbling(minute), NUM_BINS, fn=stats, time_type=pa.timestamp("ms"))
    summed = FixedWindowLogic("k", "ts", tumbling(minute), NUM_BINS, aggs=[AggSpec("total", "sum", "v")],
                              time_type=pa.timestamp("ms"))
    out = pa.Table.from_batches(applied.process(batch, 0) + applied.finish())
    agg = pa.Table.from_batches(summed.process(batch, 0) + summed.finish())
    assert set(seen) == {(datetime.datetime, datetime.datetime, pa.Table)}
    assert out.schema.names == ["k", "window_start", "window_end", "n", "total"]
    assert out.schema.field("window_start").type == agg.schema.field("window_start").type == pa.timestamp("ms")
    key = ["k", "window_start", "window_end"]
    got = sorted(out.select(key + ["total"]).to_pylist(), key=lambda r: (r["k"], r["window_start"]))
    want = sorted(agg.select(key + ["total"]).to_pylist(), key=lambda r: (r["k"], r["window_start"]))
    assert got == want and len(got) == 3


def test_first_last_arg_max_and_count_distinct_per_window_move_with_their_bins():
    """The object-valued aggregates per key and window, bins moving mid-stream, against pandas."""
    aggs = [AggSpec("first_v", "first", "v"), AggSpec("last_v", "last", "v"),
            AggSpec("t_of_max", "arg_max", "v", "t"), AggSpec("distinct", "count_distinct", "v")]
    data = batches(7)
    instances = [FixedWindowLogic("k", "t", tumbling(40), NUM_BINS, aggs=aggs) for _ in range(2)]
    owner = np.array([b % 2 for b in range(NUM_BINS)])
    out: list[pa.RecordBatch] = []
    for i, batch in enumerate(data):
        for inst, part in zip(instances, route(batch, owner)):
            out += inst.process(part, 0)
        if i % 7 == 3:
            src = (i // 7) % 2
            move_bins(instances, owner, src, owned(owner, src)[:3])
    for inst in instances:
        out += inst.finish()
    got = pa.Table.from_batches([b for b in out if b.num_rows]).to_pandas()
    got = got.sort_values(["k", "window_start"]).reset_index(drop=True)
    df = pa.Table.from_batches(data).to_pandas()
    df["window_start"] = df["t"] - df["t"] % 40
    g = df.groupby(["k", "window_start"], sort=True)
    expected = pd.DataFrame({
        "first_v": g["v"].first(), "last_v": g["v"].last(),
        "t_of_max": df.loc[g["v"].idxmax(), "t"].to_numpy(), "distinct": g["v"].nunique(),
    }).reset_index()
    pd.testing.assert_frame_equal(got[["k", "window_start", "first_v", "last_v", "t_of_max", "distinct"]],
                                  expected, check_dtype=False)


def test_an_install_ahead_in_event_time_does_not_make_the_receivers_own_records_late():
    """The sender's watermark stays with the bins it sends: the receiver's own bins keep their event time."""
    sender, receiver = logic(tumbling(10)), logic(tumbling(10))
    keys = [f"k{i}" for i in range(40)]
    bins = bins_of(pa.array(keys), NUM_BINS)
    mine = next(k for k, b in zip(keys, bins) if b != bins[0])  # a key of another bin than the moving one
    moving = keys[0]
    receiver.process(pa.record_batch({"k": [mine], "t": [3], "v": [1]}), 0)
    receiver.on_watermark(5)
    sender.process(pa.record_batch({"k": [moving], "t": [4], "v": [1]}), 0)
    sender.process(pa.record_batch({"k": [moving], "t": [25], "v": [1]}), 0)
    fired = sender.on_watermark(22)  # window [0, 10) of the moving key fires at the sender
    assert [r["n"] for b in fired for r in b.to_pylist()] == [1]
    receiver.state.install_bins(sender.state.extract_bins([int(bins[0])]))
    assert receiver.process(pa.record_batch({"k": [mine], "t": [8], "v": [1]}), 0) == []
    assert receiver.late_records == 0  # its own record at 8 > its watermark 5: in time
    assert receiver.process(pa.record_batch({"k": [moving], "t": [9], "v": [1]}), 0) == []
    assert receiver.late_records == 1  # behind the watermark the moving bin came with
    out = pa.Table.from_batches(receiver.finish()).to_pylist()
    assert sorted((r["k"], r["window_start"], r["n"]) for r in out) == sorted([(mine, 0, 2), (moving, 20, 1)])
