"""The key index's ``hash -> slot`` table split into shards (``keyindex.SHARD_ABOVE``).

The oracle is a plain dict from key to the slot it was first given; the stall the split exists for is
read from pandas' own table state (its bucket count changes only when it rehashes).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import keyindex
from chiray.operators.keyindex import KeyIndex, _SlotTable


@pytest.fixture
def small_shards(monkeypatch):
    """Split above 200 keys, so that small inputs cross the line."""
    monkeypatch.setattr(keyindex, "SHARD_ABOVE", 200)


def test_a_table_made_for_many_keys_takes_them_without_a_rehash():
    """pandas caps a table's size hint at about 1.6M entries: one table made for 2M keys rehashed
    all of them in one stall on the way. Split, no shard grows before the 2M are in."""
    total = 2_000_000
    table = _SlotTable(total)
    assert table.shards == keyindex.SHARDS
    buckets = [t.get_state()["n_buckets"] for t in table._tables]
    drawn = np.unique(np.random.default_rng(1).integers(0, 2**63, total + 10_000, dtype=np.int64).view(np.uint64))
    drawn = np.random.default_rng(5).permutation(drawn)
    hashes, absent = drawn[:total], drawn[total:]
    table.put(hashes, np.arange(total))
    assert [t.get_state()["n_buckets"] for t in table._tables] == buckets, "a shard rehashed"
    probe = np.random.default_rng(2).integers(0, total, 5000)
    assert table.find(hashes[probe]).tolist() == probe.tolist()
    assert (table.find(absent) == -1).all()


@pytest.mark.parametrize("table_hash_bits", [64, 6])
def test_an_index_that_grows_past_the_line_splits_and_finds_every_key(small_shards, table_hash_bits):
    index = KeyIndex(pa.string(), table_hash_bits=table_hash_bits)  # 6 bits: most keys share a hash
    oracle: dict[str, int] = {}
    rng = np.random.default_rng(3)
    for _ in range(12):
        batch = sorted({f"k{v}" for v in rng.integers(0, 1500, 150)})
        slots, new = index.upsert(pa.array(batch))
        for i, key in enumerate(batch):
            if key not in oracle:
                assert i in set(new.tolist())
                oracle[key] = len(oracle)
            assert slots[i] == oracle[key]
    assert len(oracle) > 200 and index._table.shards == keyindex.SHARDS
    everything = list(oracle)
    found, new = index.upsert(pa.array(everything))
    assert len(new) == 0 and found.tolist() == list(range(len(everything)))
    assert index.keys_at(found).to_pylist() == everything


@pytest.mark.parametrize("table_hash_bits", [64, 3])
def test_a_split_index_reserves_and_compacts_like_a_single_table(small_shards, table_hash_bits):
    index = KeyIndex(pa.string(), table_hash_bits=table_hash_bits)
    keys = [f"key-{i}" for i in range(600)]
    index.upsert(pa.array(keys[:100]))
    index.reserve(1000)  # above the line: the table is remade split, from the keys held
    assert index._table.shards == keyindex.SHARDS
    index.upsert(pa.array(keys[100:]))
    keep = np.flatnonzero(np.random.default_rng(4).random(600) < 0.5)
    index.compact(keep)
    kept = [keys[i] for i in keep]
    slots, new = index.upsert(pa.array(keys))
    assert slots[keep].tolist() == list(range(len(keep)))
    dropped = np.setdiff1d(np.arange(600), keep)
    assert new.tolist() == dropped.tolist()
    assert index.keys_at(np.arange(len(index))).to_pylist() == kept + [keys[i] for i in dropped]


@pytest.mark.parametrize("expected", [100, 5000])  # one table, and shards
def test_insert_stores_each_hash_once_whoever_repeats_it(small_shards, expected):
    """``_SlotTable.insert`` against a dict: a hash already held keeps its slot, and of the slots that
    bring a new hash (several, when it repeats in one call) exactly one holds it; the call's result says
    which. An empty table (a restore's) and one holding hashes both go through it."""
    rng = np.random.default_rng(expected)
    table, oracle, slot = _SlotTable(expected), {}, 0
    for size in (3000, 0, 1, 2000, 2000):
        hashes = rng.integers(0, 2500, size, dtype=np.int64).view(np.uint64)  # repeats within and across calls
        slots = np.arange(slot, slot + size)
        slot += size
        stored = table.insert(hashes, slots)
        holders = {}
        for h, s in zip(hashes.tolist(), slots.tolist()):
            if h not in oracle:
                holders.setdefault(h, []).append(s)
        chosen = dict(zip(hashes[stored].tolist(), slots[stored].tolist()))
        assert sorted(chosen) == sorted(holders), "a new hash stored more or less than once"
        assert all(chosen[h] in holders[h] for h in holders)
        oracle.update(chosen)
        assert len(table) == len(oracle)
        keys = np.array(sorted(oracle), dtype=np.uint64)
        assert table.find(keys).tolist() == [oracle[h] for h in keys.tolist()]
