"""Columns that grow inside a reservation (``operators.growable``) and the state and key index that
use them. Oracles: NumPy arrays built by plain concatenation, and a dict of what each key was given."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import growable, keyindex
from chiray.operators.growable import grown
from chiray.operators.keyindex import KeyIndex
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState


@pytest.fixture
def small_reservations(monkeypatch):
    """Reserve above 1 KiB, four times the room asked for: small arrays cross both lines."""
    monkeypatch.setattr(growable, "RESERVE_ABOVE", 1024)
    monkeypatch.setattr(growable, "RESERVE_FACTOR", 4)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint64", "float64", "bool", "object"])
def test_grown_keeps_what_was_used_and_the_rest_is_empty(small_reservations, dtype):
    rng = np.random.default_rng(7)
    values = rng.integers(1, 100, 5000).astype(dtype) if dtype != "object" else \
        np.array([frozenset({int(v)}) for v in rng.integers(1, 100, 5000)], dtype=object)
    empty = None if dtype == "object" else np.zeros(1, dtype=dtype)[0]
    array, used = np.zeros(10, dtype=dtype) if dtype != "object" else np.full(10, None, dtype=object), 0
    for capacity in (10, 20, 50, 130, 300, 700, 1500, 3000, 5000):  # up to and past a reservation, twice
        array[:used] = values[:used]  # writes land in the live view only
        array = grown(array, capacity, used)
        assert len(array) == capacity and array.dtype == np.dtype(dtype)
        assert array[:used].tolist() == values[:used].tolist()
        assert all(v == empty for v in array[used:].tolist()), "a slot past the used ones is not empty"
        used = capacity // 2 + 1


def test_a_large_column_grows_in_place_until_it_outgrows_its_reservation(small_reservations):
    array = np.arange(200, dtype=np.int64)  # 1,600 bytes: above the line
    first = grown(array, 256, 200)
    assert not np.shares_memory(first, array)  # the first reservation is a copy, four times the room
    second = grown(first, 1024, 256)
    assert np.shares_memory(first, second), "growing within the reservation copied"
    second[300] = 5
    third = grown(second, 1025, 1024)  # past 4 x 256 slots: a new reservation
    assert not np.shares_memory(second, third)
    assert third[:200].tolist() == list(range(200)) and third[300] == 5 and not third[1024]
    assert not np.shares_memory(grown(third[10:], 2000, 10), third)  # a view not at the start: copied


def test_where_no_memory_can_be_reserved_it_copies(small_reservations, monkeypatch):
    monkeypatch.setattr(growable, "_reserve", lambda nbytes: None)
    array = grown(np.arange(300, dtype=np.float64), 600, 300)
    assert array.base is None and array[:300].tolist() == list(map(float, range(300))) and not array[300:].any()


def test_a_large_state_grows_without_copying_its_columns(small_reservations):
    state = ColumnarAggState(64)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64"), Accumulator("x", "max", "float64")])
    oracle: dict[str, tuple[int, float]] = {}
    rng = np.random.default_rng(11)
    copies = in_place = 0
    for batch in range(60):
        keys = sorted({f"k{v}" for v in rng.integers(0, 3000 + 200 * batch, 150)})
        n, x = rng.integers(1, 5, len(keys)), rng.random(len(keys))
        before, capacity = state._cols["n"], len(state._bin)
        state.update(pa.array(keys), {"n": n, "x": x})
        for key, a, b in zip(keys, n.tolist(), x.tolist()):
            old = oracle.get(key, (0, -np.inf))
            oracle[key] = (old[0] + a, max(old[1], b))
        if len(state._bin) > capacity and capacity * 8 > 1024:
            if np.shares_memory(before, state._cols["n"]):
                in_place += 1
            else:
                copies += 1
    assert in_place >= 2 and in_place > copies, (in_place, copies)
    slots = state.slots()
    got = dict(zip(state.keys_at(slots).to_pylist(),
                   zip(state.values(slots)["n"].tolist(), state.values(slots)["x"].tolist())))
    assert got == oracle


@pytest.mark.parametrize("table_hash_bits", [64, 20])
def test_shards_grow_one_batch_at_a_time(monkeypatch, table_hash_bits):
    """Left alone, the shards of a split table fill evenly and all rehash within a few batches; grown
    ahead as they near their bound, no batch rehashes more than one once they are large beside it."""
    monkeypatch.setattr(keyindex, "SHARD_ABOVE", 1000)
    index = KeyIndex(pa.int64(), table_hash_bits=table_hash_bits)  # 20 bits: thousands of keys share a hash
    oracle: dict[int, int] = {}
    rng = np.random.default_rng(13)
    worst_late = 0
    for _ in range(400):
        keys = np.unique(rng.integers(0, 2**40, 200))
        buckets = [t.get_state()["n_buckets"] for t in index._table._tables]
        slots, new = index.upsert(pa.array(keys))
        for key, slot in zip(keys.tolist(), slots.tolist()):
            assert oracle.setdefault(key, len(oracle)) == slot
        after = [t.get_state()["n_buckets"] for t in index._table._tables]
        if len(buckets) == len(after) == keyindex.SHARDS and len(oracle) > 20_000:
            worst_late = max(worst_late, sum(a != b for a, b in zip(after, buckets)))
    assert index._table.shards == keyindex.SHARDS and len(oracle) > 70_000
    assert worst_late == 1, f"{worst_late} shards rehashed in one batch"
    everything = np.array(list(oracle), dtype=np.int64)
    found, new = index.upsert(pa.array(everything))
    assert len(new) == 0 and found.tolist() == list(range(len(everything)))
