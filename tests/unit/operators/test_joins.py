"""Join logics without a runtime: both sides of a key move together with its bin, and the join stays exact."""

from __future__ import annotations

import datetime
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.eventtime import DurationUnitError
from chiray.operators.hashing import bins_of
from chiray.operators.joins import JoinLogic, WindowJoinLogic
from chiray.operators.windows import tumbling

from .support import move_bins, owned

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
            move_bins(instances, owner, src, owned(owner, src)[:4])
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


def test_window_join_with_allowed_lateness_joins_late_rows_and_sends_expired_ones_aside():
    """Window [0, 10): a right row within the lateness joins the left rows of its key at once (an update);
    one after the window expired is late: counted and sent to side output 'late_right'."""
    from chiray.operators.joins import LATE_PORTS
    from chiray.operators.logic import SideOutput

    logic = WindowJoinLogic(("k", "k"), ("t", "t"), tumbling(10), NUM_BINS, allowed_lateness=5,
                            late_side_output=True)
    left = pa.record_batch({"k": ["a", "a", "b"], "t": [1, 4, 2], "l": [10, 11, 12]})
    right = pa.record_batch({"k": ["a"], "t": [3], "r": [100]})
    assert logic.process(left, 0) == [] and logic.process(right, 1) == []
    fired = pa.Table.from_batches(logic.on_watermark(12)).to_pylist()  # the window fires: two pairs
    assert sorted((r["l"], r["r"]) for r in fired) == [(10, 100), (11, 100)]
    late = pa.record_batch({"k": ["a", "b", "c"], "t": [7, 8, 9], "r": [200, 201, 202]})  # 9 + 5 > 12: in time
    update = pa.Table.from_batches([b for b in logic.process(late, 1) if not isinstance(b, SideOutput)])
    assert sorted((r["k"], r["l"], r["r"], r["window_start"], r["window_end"]) for r in update.to_pylist()) == [
        ("a", 10, 200, 0, 10), ("a", 11, 200, 0, 10), ("b", 12, 201, 0, 10)]
    assert logic.on_watermark(20) == [] and logic.late_records == 0  # expired now: dropped
    out = logic.process(pa.record_batch({"k": ["a"], "t": [6], "r": [300]}), 1)
    assert [type(o) for o in out] == [SideOutput] and out[0].port == LATE_PORTS[1]
    assert out[0].batch.to_pylist() == [{"k": "a", "t": 6, "r": 300}] and logic.late_records == 1


def test_window_join_options_in_the_user_api():
    from chiray.operators import Dataflow, collect, from_items

    flow = Dataflow("wj")
    a = flow.source(from_items([{"k": "a", "t": 1}]), name="a")
    b = flow.source(from_items([{"k": "a", "t": 1, "x": 1}]), name="b")
    joined = a.connect(b).key_by("k").window_join(tumbling(10), on="t", allowed_lateness=5, late_side_output=True,
                                                  name="wj")
    joined.sink(collect(), name="out")
    assert joined.side_output("late_left").schema.names == ["k", "t"]
    assert joined.side_output("late_right").schema.names == ["k", "t", "x"]
    with pytest.raises(ValueError, match="no side output 'late'"):
        joined.side_output("late")


def test_join_keys_of_different_types_are_refused_at_build_and_at_the_first_batches():
    from chiray.operators import Dataflow, from_items

    flow = Dataflow("keys")
    left = flow.source(from_items([{"k": 1, "x": 1}]), name="left")
    right = flow.source(from_items([{"id": "1", "y": 1}]), name="right")
    with pytest.raises(TypeError, match=r"connect\('left', 'right'\).key_by\(\): the key columns of the two inputs "
                                        r"have different types: 'k' of the left input is int64, 'id' of the right "
                                        r"input is string.*cast one"):
        left.connect(right).key_by("k", "id")
    # schemas unknown at build time (a map without schema=): the logic refuses at the first batch of each side
    for logic in (JoinLogic(("k", "id"), 8), WindowJoinLogic(("k", "id"), ("t", "t"), tumbling(10), 8)):
        logic.process(pa.record_batch({"k": [1], "t": [1]}), 0)
        with pytest.raises(TypeError, match=r"'k' of the left input is int64, 'id' of the right input is string"):
            logic.process(pa.record_batch({"id": ["1"], "t": [2]}), 1)


def test_a_new_window_join_instance_fires_handed_windows_with_the_inputs_time_type():
    """A rescale's new instance may fire the windows it was handed before it reads a batch of its own:
    their window_start is the inputs' timestamp type, as the old owner's are (not int64)."""
    ms = pa.timestamp("ms")
    left = pa.record_batch([pa.array(["u1", "u2"]), pa.array([5, 12], ms)], names=["user", "t"])
    right = pa.record_batch([pa.array(["u1", "u2"]), pa.array([7, 15], ms)], names=["id", "t"])
    spec = tumbling(datetime.timedelta(milliseconds=30))
    old, new = (WindowJoinLogic(("user", "id"), ("t", "t"), spec, NUM_BINS, ms) for _ in range(2))
    old.process(left, 0)
    old.process(right, 1)
    new.state.install_bins(old.state.extract_bins(range(NUM_BINS)))
    fired = new.on_watermark(100)
    assert sum(b.num_rows for b in fired) == 2
    assert {b.schema.field("window_start").type for b in fired} == {ms}


def test_a_window_join_without_a_known_time_type_refuses_a_bare_number_at_its_first_timestamp_batch():
    left = pa.record_batch([pa.array(["u1"]), pa.array([5], pa.timestamp("ms"))], names=["user", "t"])
    logic = WindowJoinLogic(("user", "id"), ("t", "t"), tumbling(30), NUM_BINS)  # ints pass without a type
    with pytest.raises(DurationUnitError, match=r"tumbling\(30\) on timestamp\[ms\] column 't' would be 30 ms; "
                                                r"pass timedelta\(seconds=30\)"):
        logic.process(left, 0)


def test_a_window_join_restored_while_a_moved_bin_held_a_watermark_floor_loses_no_replayed_record():
    """A checkpoint cut while an instance holds a per-bin watermark floor (a bin moved in from an owner further
    in event time) restores at the instance's own watermark, the moved bin keeping its floor: the instance's own
    windows neither fire early nor drop the replayed records as late. Oracle: the live instance's output."""
    def logic():
        return WindowJoinLogic(("id", "seller"), ("t", "t"), tumbling(10), 64, pa.int64())

    def person(k, t):
        return pa.record_batch({"id": pa.array([k], pa.int64()), "name": [f"p{k}"], "t": pa.array([t], pa.int64())})

    def seller(k, t):
        return pa.record_batch({"seller": pa.array([k], pa.int64()), "t": pa.array([t], pa.int64())})

    bins = bins_of(pa.array(list(range(50)), pa.int64()), 64).tolist()
    moved, own = 7, next(k for k in range(50) if bins[k] != bins[7])
    ahead, behind = logic(), logic()
    ahead.process(person(moved, 12), 0)
    ahead.on_watermark(11)  # window [0, 10) is done there
    behind.process(person(own, 3), 0)
    behind.on_watermark(4)
    behind.state.install_bins(ahead.state.extract_bins([bins[moved]]))  # a floor of 11 for the moved bin only
    restored = logic()
    restored.state.restore_bins(behind.state.snapshot_bins(behind.state.bins()))  # the checkpoint, recovered
    assert restored.state.watermark == behind.state.watermark == 4
    replayed = restored.process(seller(own, 6), 1) + restored.finish()
    live = behind.process(seller(own, 6), 1) + behind.finish()
    rows = [r for b in replayed for r in b.to_pylist()]
    assert rows == [r for b in live for r in b.to_pylist()] and [r["id"] for r in rows] == [own]
    assert restored.late_records == 0
