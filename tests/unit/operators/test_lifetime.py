"""The lifetime join (``lifetime_join``): each left row with its best right row within its lifetime, against DuckDB."""

from __future__ import annotations

import random

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators import Dataflow, from_items
from chiray.operators import rowbins
from chiray.operators.lifetime import LifetimeJoinLogic

from .support import run_trading

NUM_BINS = 16
DELAY = 10  # how far behind the rows' times the watermark trails: no row is late


def streams(seed: int, lifetimes: int = 60, events: int = 600) -> tuple[pa.Table, pa.Table]:
    """Lifetimes ``[s, e]`` of 8 keys and events with prices 0-5 (many ties) arriving in time order, within DELAY."""
    rng = random.Random(seed)
    left = [{"k": rng.randrange(8), "id": i, "s": i * 10 + rng.randrange(5), "name": f"L{i}"} for i in range(lifetimes)]
    for row in left:
        row["e"] = row["s"] + rng.randrange(0, 80)
    right = [{"kk": rng.randrange(8), "t": i + rng.randrange(6), "price": rng.choice([None, *range(6)]), "seq": i}
             for i in range(events)]
    return pa.Table.from_pylist(left), pa.Table.from_pylist(right)


def interleaved(left: pa.Table, right: pa.Table, seed: int) -> tuple[list[tuple[pa.RecordBatch, int]], list[int]]:
    """Both inputs' batches in one arrival order, and the watermark after each: DELAY behind the earlier input."""
    rng = random.Random(seed)
    lb, rb = left.to_batches(max_chunksize=5), right.to_batches(max_chunksize=50)
    inputs, marks, high = [], [], [-100, -100]
    while lb or rb:
        side = 0 if lb and (not rb or rng.random() < 0.15) else 1
        batch = (lb if side == 0 else rb).pop(0)
        high[side] = max(high[side], max(batch.column("s" if side == 0 else "t").to_pylist()))
        inputs.append((batch, side))
        marks.append(min(h for h, rest in zip(high, (lb, rb)) if rest) - DELAY if lb or rb else max(high))
    return inputs, marks


def expected(left: pa.Table, right: pa.Table) -> pd.DataFrame:
    left_rows, right_rows = left, right  # noqa: F841 (DuckDB reads them by name)
    return duckdb.sql("""
        SELECT k, id, s, name, e, t, price, seq FROM (
            SELECT L.*, R.*, row_number() OVER (PARTITION BY L.id ORDER BY R.price DESC NULLS LAST, R.t, R.seq) AS rn
            FROM left_rows L JOIN right_rows R ON L.k = R.kk AND R.t BETWEEN L.s AND L.e)
        WHERE rn = 1""").df()


def by_id(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values("id").reset_index(drop=True)


def make() -> LifetimeJoinLogic:
    return LifetimeJoinLogic(("k", "kk"), "s", "e", "t", ("price",), (True,), NUM_BINS)


@pytest.mark.parametrize("seed", range(4))
def test_best_match_per_lifetime_equals_duckdb_while_bins_move(seed, monkeypatch):
    """Highest price within [s, e], the earliest on ties, then the first to arrive; lifetimes without a match
    emit nothing; bins trade between two instances mid-stream (with compactions: a small threshold)."""
    monkeypatch.setattr(rowbins, "COMPACT_MIN", 8)
    left, right = streams(seed)
    inputs, marks = interleaved(left, right, seed)
    got, instances = run_trading(make, inputs, ("k", "kk"), NUM_BINS, watermark=marks.__getitem__)
    want = expected(left, right)
    assert len(want) > 30
    pd.testing.assert_frame_equal(by_id(got.to_pandas()[list(want.columns)]), by_id(want), check_dtype=False)
    assert sum(i.late_records for i in instances) == 0
    assert all(len(i.state) == 0 for i in instances), "closed lifetimes and passed events must be let go"


def test_a_restored_snapshot_goes_on_as_the_instance_would_have():
    left, right = streams(7)
    inputs, marks = interleaved(left, right, 7)
    cut = len(inputs) // 2
    whole, before = make(), make()
    out_whole, out_cut = [], []
    for i, (batch, side) in enumerate(inputs):
        out_whole += whole.process(batch, side) + whole.on_watermark(marks[i])
        if i < cut:
            out_cut += before.process(batch, side) + before.on_watermark(marks[i])
    restored = make()
    restored.state.install_bins(before.state.snapshot_bins(before.state.bins()))
    for i, (batch, side) in enumerate(inputs[cut:], start=cut):
        out_cut += restored.process(batch, side) + restored.on_watermark(marks[i])
    out_whole += whole.finish()
    out_cut += restored.finish()
    assert len(out_whole) and pa.Table.from_batches(out_cut).equals(pa.Table.from_batches(out_whole))


def test_events_before_their_lifetime_wait_and_ends_are_inclusive():
    j = make()
    assert j.process(pa.record_batch({"kk": [1, 1, 1, 2], "t": [4, 5, 9, 5], "price": [3, 8, 8, 1],
                                      "seq": [0, 1, 2, 3]}), 1) == []
    assert j.process(pa.record_batch({"k": [1, 2], "id": [10, 11], "s": [5, 6], "name": ["a", "b"],
                                      "e": [9, 20]}), 0) == []
    assert j.on_watermark(8) == []  # neither lifetime has ended
    rows = pa.Table.from_batches(j.on_watermark(9)).to_pylist()
    assert [(r["id"], r["price"], r["t"]) for r in rows] == [(10, 8, 5)]  # t=4 is before s=5; 8 at t=5 wins the tie
    assert j.finish() == []  # key 2's event came before its lifetime: no match


def test_a_lifetime_that_ended_behind_the_watermark_is_late():
    j = make()
    j.on_watermark(50)
    j.process(pa.record_batch({"k": [1, 1], "id": [1, 2], "s": [10, 45], "name": ["x", "y"], "e": [40, 60]}), 0)
    j.process(pa.record_batch({"kk": [1], "t": [55], "price": [4], "seq": [0]}), 1)
    assert j.late_records == 1
    assert [r["id"] for r in pa.Table.from_batches(j.finish()).to_pylist()] == [2]


def _flow(auctions: list[dict], bids: list[dict]):  # type: ignore[no-untyped-def]
    flow = Dataflow("lifetime")
    a = flow.source(from_items(auctions), name="auctions")
    b = flow.source(from_items(bids), name="bids")
    return a.connect(b).key_by("id", "auction")


def test_build_time_errors_name_the_operator_and_the_column():
    keyed = _flow([{"id": 1, "start": 0, "end": 5}], [{"auction": 1, "t": 3, "price": 2, "tags": [1]}])
    with pytest.raises(ValueError, match=r"operator 'winners'.*'stop'"):
        keyed.lifetime_join(start="start", end="stop", on="t", by="price", name="winners")
    with pytest.raises(ValueError, match=r"operator 'winners'.*'cost'"):
        keyed.lifetime_join(start="start", end="end", on="t", by="cost", name="winners")
    with pytest.raises(TypeError, match=r"operator 'winners'.*'tags'"):
        keyed.lifetime_join(start="start", end="end", on="t", by="tags", name="winners")
    with pytest.raises(ValueError, match=r"operator 'winners'.*2 descending flags for 1"):
        keyed.lifetime_join(start="start", end="end", on="t", by="price", descending=[True, False], name="winners")
    mixed = _flow([{"id": 1, "start": pd.Timestamp(0), "end": pd.Timestamp(5)}], [{"auction": 1, "t": 3, "price": 2}])
    with pytest.raises(ValueError, match=r"operator 'winners'.*one type"):
        mixed.lifetime_join(start="start", end="end", on="t", by="price", name="winners")
    stream = keyed.lifetime_join(start="start", end="end", on="t", by="price", name="winners")
    assert stream.schema.names == ["id", "start", "end", "t", "price", "tags"]


def test_a_column_the_build_could_not_check_is_named_at_the_first_batch():
    with pytest.raises(ValueError, match=r"lifetime_join\(\) ranks by column 'price'"):
        make().process(pa.record_batch({"kk": [1], "t": [4], "cost": [3]}), 1)
