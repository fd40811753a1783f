"""``KeyedStream.rolling``: aggregates over each key's last n rows in event-time order, against DuckDB's window SQL."""

from __future__ import annotations

import random

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators import Dataflow, from_items
from chiray.operators import keptrows, rowbins
from chiray.operators.rolling import RollingLogic

from .support import run_trading

NUM_BINS = 16
BATCH = 23
AGGREGATES = [("avg", "mean", "p"), ("n", "count", None), ("hi", "max", "p"), ("lo", "min", "f"),
              ("total", "sum", "p"), ("priced", "count", "p")]


def rows(seed: int, count: int = 900) -> pa.Table:
    """Rows of 6 keys in roughly increasing time (3 a tick, up to 3 ticks out of order), null values among them;
    ``id`` leaves ties (``arrival`` numbers the rows)."""
    rng = random.Random(seed)
    return pa.Table.from_pylist([{"k": rng.randrange(6), "t": i // 3 + rng.randrange(4), "id": rng.randrange(3),
                                  "p": rng.choice([None, *range(100)]), "f": rng.choice([None, rng.random()]),
                                  "arrival": i} for i in range(count)])


def watermark(i: int) -> int:
    """After batch ``i``: behind every row still to come (their times are at least (row number) // 3)."""
    return (i + 1) * BATCH // 3 - 1


def make(n: int = 4) -> RollingLogic:
    return RollingLogic("k", n, "t", ("id",), AGGREGATES, NUM_BINS)


def expected(table_rows: pa.Table, n: int) -> pd.DataFrame:
    return duckdb.sql(f"""
        SELECT *, avg(p) OVER w AS avg, count(*) OVER w AS n, max(p) OVER w AS hi, min(f) OVER w AS lo,
               sum(p) OVER w AS total, count(p) OVER w AS priced
        FROM table_rows WINDOW w AS (PARTITION BY k ORDER BY t, id, arrival ROWS {n - 1} PRECEDING)""").df()


@pytest.mark.parametrize("seed,n", [(0, 4), (1, 11), (2, 1)])
def test_rolling_aggregates_equal_duckdb_while_bins_move(seed, n, monkeypatch):
    """Each row once, with the aggregates over its key's last n rows by (t, id, arrival); nulls skipped; a key's
    history and waiting rows trade between two instances mid-stream (with compactions: small thresholds)."""
    monkeypatch.setattr(rowbins, "COMPACT_MIN", 8)
    monkeypatch.setattr(keptrows, "COMPACT_SLOTS", 2)
    table = rows(seed)
    got, instances = run_trading(lambda: make(n), [(b, 0) for b in table.to_batches(max_chunksize=BATCH)], ("k",),
                                 NUM_BINS, watermark=watermark)
    assert sum(i.late_records for i in instances) == 0
    want = expected(table, n).sort_values("arrival", ignore_index=True)
    pd.testing.assert_frame_equal(got.to_pandas().sort_values("arrival", ignore_index=True), want, check_dtype=False)


def test_a_restored_snapshot_goes_on_as_the_instance_would_have():
    batches = rows(3).to_batches(max_chunksize=BATCH)
    whole, before = make(), make()
    out_whole, out_cut = [], []
    for i, batch in enumerate(batches):
        out_whole += whole.process(batch) + whole.on_watermark(watermark(i))
        if i < 20:
            out_cut += before.process(batch) + before.on_watermark(watermark(i))
    restored = make()
    restored.state.install_bins(before.state.snapshot_bins(before.state.bins()))
    for i, batch in enumerate(batches[20:], start=20):
        out_cut += restored.process(batch) + restored.on_watermark(watermark(i))
    out_whole += whole.finish()
    out_cut += restored.finish()
    got, want = (pa.Table.from_batches(out).to_pandas().sort_values("arrival", ignore_index=True)
                 for out in (out_cut, out_whole))
    assert len(want) == 900
    pd.testing.assert_frame_equal(got, want)


def test_a_row_behind_the_watermark_is_taken_at_once_and_counted_late():
    logic = RollingLogic("k", 2, "t", (), [("s", "sum", "v")], NUM_BINS)
    assert logic.process(pa.record_batch({"k": [1, 1], "t": [5, 9], "v": [1, 2]})) == []
    assert [r["s"] for b in logic.on_watermark(6) for r in b.to_pylist()] == [1]
    late = logic.process(pa.record_batch({"k": [1], "t": [4], "v": [10]}))
    assert [(r["t"], r["s"]) for b in late for r in b.to_pylist()] == [(4, 11)] and logic.late_records == 1
    assert [(r["t"], r["s"]) for b in logic.finish() for r in b.to_pylist()] == [(9, 12)]


def test_build_time_errors_name_the_operator_and_the_column():
    flow = Dataflow("rolling")
    keyed = flow.source(from_items([{"k": "a", "t": 1, "p": 2.5, "name": "x"}])).key_by("k")
    with pytest.raises(ValueError, match=r"operator 'avg'.*'q'.*columns \['k', 't', 'p', 'name'\]"):
        keyed.rolling(3, on="t", avg=("q", "mean"), name="avg")
    with pytest.raises(TypeError, match=r"operator 'avg'.*mean needs a column of integers or floats.*'name'"):
        keyed.rolling(3, on="t", avg=("name", "mean"), name="avg")
    with pytest.raises(ValueError, match=r"operator 'avg'.*unknown function 'median'"):
        keyed.rolling(3, on="t", avg=("p", "median"), name="avg")
    with pytest.raises(ValueError, match=r"operator 'avg'.*'p'.*already"):
        keyed.rolling(3, on="t", p=("p", "mean"), name="avg")
    with pytest.raises(ValueError, match=r"operator 'avg'.*'when'"):
        keyed.rolling(3, on="when", avg=("p", "mean"), name="avg")
    with pytest.raises(ValueError, match=r"operator 'avg'.*'nope'"):
        keyed.rolling(3, on="t", tiebreak="nope", avg=("p", "mean"), name="avg")
    with pytest.raises(ValueError, match=r"operator 'avg'.*at least one aggregate"):
        keyed.rolling(3, on="t", name="avg")
    stream = keyed.rolling(3, on="t", tiebreak="name", avg=("p", "mean"), n=(None, "count"), name="avg")
    assert stream.schema.names == ["k", "t", "p", "name", "avg", "n"]
    assert [str(f.type) for f in stream.schema][-2:] == ["double", "int64"]


def test_a_column_the_build_could_not_check_is_named_at_the_first_batch():
    logic = RollingLogic("k", 2, "t", ("id",), [("s", "sum", "v")], NUM_BINS)
    with pytest.raises(ValueError, match=r"rolling\(\) aggregate 's': unknown column 'v'"):
        logic.process(pa.record_batch({"k": [1], "t": [5], "w": [1], "id": [0]}))
    with pytest.raises(ValueError, match=r"rolling\(\) ranks by column 'id'"):
        logic.process(pa.record_batch({"k": [1], "t": [5], "v": [1]}))
