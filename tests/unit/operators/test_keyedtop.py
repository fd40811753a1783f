"""``KeyedStream.top``: the n best rows of each key over the whole stream, emitted once, against DuckDB."""

from __future__ import annotations

import datetime
import random

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators import Dataflow, from_items
from chiray.operators import keptrows, rowbins
from chiray.operators.keyedtop import KeyedTopLogic

from .support import run_trading

NUM_BINS = 16


def bids(seed: int, rows: int = 3000, keys: int = 40) -> pa.Table:
    """Rows of ``keys`` keys (and a null key) with values 0-29 or null: many ties, keys fill up early."""
    rng = random.Random(seed)
    return pa.Table.from_pylist([{"k": rng.choice([*(f"k{i}" for i in range(keys)), None]),
                                  "v": rng.choice([None, *range(30)]), "t": rng.randrange(500), "id": i}
                                 for i in range(rows)])


def make() -> KeyedTopLogic:
    return KeyedTopLogic("k", 3, ("v", "t"), (True, False), NUM_BINS)


@pytest.mark.parametrize("seed", range(3))
def test_top_rows_per_key_equal_duckdb_while_bins_move(seed, monkeypatch):
    """Greatest v, then least t, then arrival (nulls last); the rows a full key cannot take are dropped on
    arrival; bins trade between two instances mid-stream (with compactions: small thresholds)."""
    monkeypatch.setattr(rowbins, "COMPACT_MIN", 8)
    monkeypatch.setattr(keptrows, "COMPACT_SLOTS", 4)
    rows = bids(seed)
    got, instances = run_trading(make, [(b, 0) for b in rows.to_batches(max_chunksize=97)], ("k",), NUM_BINS)
    want = duckdb.sql("""SELECT *, row_number() OVER (PARTITION BY k ORDER BY v DESC NULLS LAST, t, id) AS rank
                         FROM rows QUALIFY rank <= 3""").df()
    assert len(want) == 41 * 3
    pd.testing.assert_frame_equal(got.to_pandas().sort_values("id").reset_index(drop=True),
                                  want.sort_values("id").reset_index(drop=True), check_dtype=False)
    assert sum(i.state.held for i in instances) == 41


def test_a_restored_snapshot_goes_on_as_the_instance_would_have():
    batches = bids(5).to_batches(max_chunksize=100)
    whole, before = make(), make()
    for batch in batches:
        whole.process(batch)
    for batch in batches[:15]:
        before.process(batch)
    restored = make()
    restored.state.install_bins(before.state.snapshot_bins(before.state.bins()))
    for batch in batches[15:]:
        restored.process(batch)
    got, want = (pa.Table.from_batches(logic.finish()).to_pandas().sort_values("id", ignore_index=True)
                 for logic in (restored, whole))
    assert len(want) == 41 * 3
    pd.testing.assert_frame_equal(got, want)


def test_with_idle_a_key_is_emitted_once_the_watermark_passes_its_last_row_and_then_starts_anew():
    top = KeyedTopLogic("k", 2, ("v",), (True,), NUM_BINS, idle=10, on="t")
    top.process(pa.record_batch({"k": ["a", "a", "a", "b"], "v": [1, 5, 3, 7], "t": [0, 4, 8, 15]}))
    assert top.on_watermark(17) == []  # a's last row is at 8: due at 18
    rows = pa.Table.from_batches(top.on_watermark(18)).to_pylist()
    assert [(r["k"], r["v"], r["rank"]) for r in rows] == [("a", 5, 1), ("a", 3, 2)]
    top.process(pa.record_batch({"k": ["a"], "v": [0], "t": [30]}))  # a comes back: a new top
    rows = pa.Table.from_batches(top.finish()).to_pylist()
    assert sorted((r["k"], r["v"], r["rank"]) for r in rows) == [("a", 0, 1), ("b", 7, 1)]


def test_build_time_errors_name_the_operator_and_the_column():
    flow = Dataflow("top")
    keyed = flow.source(from_items([{"k": "a", "v": 1, "ts": datetime.datetime(2026, 1, 1), "tags": [1]}])).key_by("k")
    with pytest.raises(ValueError, match=r"operator 'best'.*'w'.*columns \['k', 'v', 'ts', 'tags'\]"):
        keyed.top(2, by="w", name="best")
    with pytest.raises(TypeError, match=r"operator 'best'.*'tags'"):
        keyed.top(2, by="tags", name="best")
    with pytest.raises(ValueError, match=r"operator 'best'.*n >= 1"):
        keyed.top(0, by="v", name="best")
    with pytest.raises(ValueError, match=r"operator 'best'.*idle= and on= together"):
        keyed.top(2, by="v", idle=datetime.timedelta(seconds=1), name="best")
    with pytest.raises(TypeError, match=r"operator 'best'.*idle"):
        keyed.top(2, by="v", idle=5, on="ts", name="best")  # a bare number on a timestamp column
    ranked = flow.source(from_items([{"k": "a", "rank": 1}])).key_by("k")
    with pytest.raises(ValueError, match=r"operator 'best'.*'rank'"):
        ranked.top(2, by="rank", name="best")
    assert keyed.top(2, by=["v", "ts"], descending=[True, False], name="best").schema.names == \
        ["k", "v", "ts", "tags", "rank"]


def test_a_column_the_build_could_not_check_is_named_at_the_first_batch():
    with pytest.raises(ValueError, match=r"top\(\) ranks by column 'v'"):
        make().process(pa.record_batch({"k": ["a"], "w": [1], "t": [0]}))
