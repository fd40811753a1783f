"""The key index's key store: chunks that halve in size, lookups across them, and appends that leave the
keys held before them in place (a store that consolidated into one array copied them all)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import keyindex
from chiray.operators.keyindex import KeyIndex, _KeyStore


@pytest.mark.parametrize("kind", ["string", "int64"])
def test_the_store_returns_the_key_of_every_slot_across_appends_of_any_size(kind: str) -> None:
    rng = np.random.default_rng(7)
    store, oracle = _KeyStore(pa.string() if kind == "string" else pa.int64()), []
    for size in [1000, 3, 3, 500, 1, 0, 40, 2000, 7, 7, 7, 120, 4096, 1]:
        values = list(range(len(oracle), len(oracle) + size))
        keys = [f"k{v}" for v in values] if kind == "string" else values
        store.append(pa.array(keys, type=pa.string() if kind == "string" else pa.int64()))
        oracle.extend(keys)
        assert len(store) == len(oracle)
        slots = rng.integers(0, len(oracle), 300)
        assert store.take(slots).to_pylist() == [oracle[s] for s in slots]  # any order, repeats
        assert store.take(np.arange(len(oracle))).to_pylist() == oracle
        assert store.take(np.zeros(0, dtype=np.int64)).to_pylist() == []
    sizes = [len(chunk) for chunk in store.view().chunks]
    assert all(a >= 2 * b for a, b in zip(sizes, sizes[1:]))  # each chunk at least twice the next
    assert len(sizes) <= math.log2(len(oracle)) + 1
    with pytest.raises(IndexError):
        store.take(np.array([0, len(oracle)]))
    with pytest.raises(IndexError):
        store.take(np.array([len(oracle) - 1, -1]))


def test_a_small_append_leaves_the_keys_held_before_in_place() -> None:
    store = _KeyStore(pa.string())
    store.append(pa.array([f"k{i}" for i in range(100_000)]))
    first = store.view().chunks[0]
    for i in range(50):  # a batch bringing a few new keys, then the lookup of the next batch
        store.append(pa.array([f"new{i}-{j}" for j in range(5)]))
        assert store.take(np.array([0, 99_999, len(store) - 1])).to_pylist()[:2] == ["k0", "k99999"]
    assert store.view().chunks[0] is first  # not copied: 50 appends cost their own keys, not the 100,000 held


@pytest.mark.parametrize("kind", ["string", "int64"])
def test_no_append_copies_more_than_the_merge_limit(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Keys that keep coming (a migration's new owner: one append a step) never merge into one chunk
    holding them all: the merge at each power of two copied the whole store (130 ms at 2M keys)."""
    monkeypatch.setattr(keyindex, "MERGE_LIMIT", 1024)
    key_type = pa.string() if kind == "string" else pa.int64()
    store, oracle = _KeyStore(key_type), []
    store.append(pa.array([f"r{i}" for i in range(5000)] if kind == "string" else range(5000), type=key_type))
    oracle.extend([f"r{i}" for i in range(5000)] if kind == "string" else range(5000))
    restored = store.view().chunks[0]  # one chunk above the limit (a restored state): kept as it is
    rng = np.random.default_rng(3)
    for step in range(120):
        size = int(rng.integers(1, 200))
        keys = [f"s{step}-{j}" for j in range(size)] if kind == "string" else list(range(len(oracle), len(oracle) + size))
        before = list(store.view().chunks)  # held, so that no id is reused
        store.append(pa.array(keys, type=key_type))
        oracle.extend(keys)
        made = [c for c in store.view().chunks if not any(c is b for b in before)]
        assert sum(len(c) for c in made) <= 1024  # the keys this append copied, its own included
        assert all(len(c) <= 1024 for c in store.view().chunks[1:])
    assert store.view().chunks[0] is restored
    assert len(store.view().chunks) <= len(oracle) // 512 + 12
    slots = rng.integers(0, len(oracle), 2000)
    assert store.take(slots).to_pylist() == [oracle[s] for s in slots]
    assert store.take(np.arange(len(oracle))).to_pylist() == oracle
    with pytest.raises(IndexError):
        store.take(np.array([3, len(oracle)]))


def test_a_key_index_finds_every_key_after_many_small_additions() -> None:
    index = KeyIndex(pa.string())
    index.upsert(pa.array([f"k{i}" for i in range(20_000)]))
    for step in range(30):
        index.upsert(pa.array([f"k{i}" for i in range(step, 20_000, 997)] + [f"n{step}-{j}" for j in range(3)]))
    everything = [f"k{i}" for i in range(20_000)] + [f"n{s}-{j}" for s in range(30) for j in range(3)]
    slots, new = index.upsert(pa.array(everything))
    assert new.size == 0 and slots.tolist() == list(range(len(everything)))
    assert index.keys_at(slots[::-1]).to_pylist() == everything[::-1]


def test_slots_in_ascending_order_are_taken_once_per_chunk_without_a_take_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots already grouped by chunk (ascending: a full copy's, or changes found by slot) are taken chunk by
    chunk and joined as they come; others are grouped first and put back in their order with a second take
    (at 4M string keys in 8 chunks, a full copy's keys took 51 ms instead of 82)."""
    rng = np.random.default_rng(3)
    store, oracle = _KeyStore(pa.string()), []
    for size in [5000, 900, 60, 7]:
        keys = [f"k{v}" for v in range(len(oracle), len(oracle) + size)]
        store.append(pa.array(keys))
        oracle.extend(keys)
    chunks = len(store.view().chunks)
    assert chunks > 2
    takes = []
    real = keyindex.pc.take
    monkeypatch.setattr(keyindex.pc, "take", lambda *a, **k: takes.append(1) or real(*a, **k))
    ascending = np.sort(np.concatenate([rng.integers(0, len(oracle), 400), store.view().starts[:-1]]))  # every chunk
    assert store.take(ascending).to_pylist() == [oracle[s] for s in ascending]
    assert len(takes) == chunks
    takes.clear()
    ends = np.array([0, 1, len(oracle) - 1])  # the first chunk and the last, none between
    assert store.take(ends).to_pylist() == [oracle[s] for s in ends]
    assert len(takes) == 2
    takes.clear()
    shuffled = rng.permutation(ascending)
    assert store.take(shuffled).to_pylist() == [oracle[s] for s in shuffled]
    assert len(takes) == chunks + 1  # grouped, then taken back into order
