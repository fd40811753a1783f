"""RowBins and RowsState: rows by position across chunks, tombstones and compaction, bins that travel."""

from __future__ import annotations

import cloudpickle
import numpy as np
import pyarrow as pa
import pytest

from chiray.operators.rowbins import RowBins, RowsState

NUM_BINS = 8


def filled(batches: int = 40, seed: int = 0) -> tuple[RowBins, pa.Table]:
    """A RowBins and, for the oracle, the same rows as one table (batches of 1-60 rows)."""
    rng = np.random.default_rng(seed)
    rows = RowBins(NUM_BINS, np.zeros(NUM_BINS, dtype=np.int64))
    parts = []
    for i in range(batches):
        n = int(rng.integers(1, 60))
        part = pa.table({"v": np.arange(n) + 1000 * i, "s": [f"r{i}-{j}" for j in range(n)]})
        rows.add(part, rng.integers(0, NUM_BINS, n), rng.integers(0, 100, n))
        parts.append(part)
    return rows, pa.concat_tables(parts).combine_chunks()


def test_take_gathers_across_chunks_in_the_order_asked():
    rows, table = filled()
    assert len(rows._chunks) < 10, "appended batches merge into a few chunks"
    positions = np.random.default_rng(1).integers(0, table.num_rows, 500)
    assert rows.take(positions).equals(table.take(pa.array(positions)))


def test_dropped_rows_go_at_compaction_and_positions_are_renumbered():
    rows, table = filled()
    dropped = np.arange(0, table.num_rows, 3)
    rows.drop(dropped)
    assert rows.compact() is None  # fewer tombstones than live rows
    renumber = rows.compact(force=True)
    live = np.setdiff1d(np.arange(table.num_rows), dropped)
    assert len(rows) == rows.size == len(live)
    assert (renumber[dropped] == -1).all() and renumber[live].tolist() == list(range(len(live)))
    assert rows.take(np.arange(len(live))).equals(table.take(pa.array(live)))


def test_due_rows_come_by_time():
    rows, _ = filled()
    due = rows.due_by(30)
    times = rows.due_of(due)
    assert (times <= 30).all() and (np.diff(times) >= 0).all()
    assert len(due) == int((rows._due[: rows.size] <= 30).sum())


class Pair(RowsState):
    def __init__(self) -> None:
        super().__init__(NUM_BINS, ("a", "b"), "test.Pair/1")


def test_bins_travel_with_both_parts_and_versions():
    src, dst = Pair(), Pair()
    src.parts["a"].add(pa.table({"x": [1, 2, 3]}), np.array([1, 2, 1]), np.array([5, 6, 7]))
    src.parts["b"].add(pa.table({"y": ["p"]}), np.array([1]))
    assert src.bins() == [1, 2] and src.bin_key_counts() == {1: 3, 2: 1}
    version = src.version(1)
    dst.install_bins(src.extract_bins([1]))
    assert src.bins() == [2] and dst.bins() == [1] and dst.version(1) >= version
    a = dst.parts["a"]
    assert a.take(a.live()).column("x").to_pylist() == [1, 3] and a.due_of(a.live()).tolist() == [5, 7]
    with pytest.raises(ValueError, match="bin 1: it is already present here with 3 rows"):
        dst.install_bins(dst.snapshot_bins([1]))


def test_a_payload_of_another_kind_or_a_pickle_is_refused():
    src = Pair()
    src.parts["a"].add(pa.table({"x": [1]}), np.array([3]))
    payload = src.snapshot_bins([3])[3]

    class Other(RowsState):
        def __init__(self) -> None:
            super().__init__(NUM_BINS, ("a",), "test.Other/1")

    with pytest.raises(ValueError, match="not a Other bin"):
        Other().install_bins({3: payload})
    with pytest.raises(ValueError, match="bin 4: payload is bin 3"):
        Pair().install_bins({4: payload})
    with pytest.raises(ValueError, match="pickled"):
        Pair().install_bins({3: cloudpickle.dumps({"format": "test.Pair/1"})})
