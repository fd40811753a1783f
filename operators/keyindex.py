"""keyindex.py: key identity in keyed state: grouping a key column, and distinct keys -> dense slots.

Keyed state identifies keys the same way everywhere: :func:`encode_keys`
groups a column (null is one key, NaNs are one key, ``-0.0`` is ``0.0``) and
:class:`KeyIndex` maps distinct keys to dense slots through their stable hash
(:func:`operators.hashing.hash_keys`).

Example:
    >>> import pyarrow as pa
    >>> uniques, codes = encode_keys(pa.array(["b", None, "b"]))
    >>> uniques.to_pylist(), codes.tolist()
    (['b', None], [0, 1, 0])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .growable import grown
from .hashing import _float_bits, _hash_array


def _int64_hash_table(expected: int) -> Any:
    """pandas' C hash table, imported on first use: a process without keyed state never loads pandas
    (about 35 MB). Internal to pandas, but stable for years; it fails loudly if it moves."""
    try:
        from pandas._libs.hashtable import Int64HashTable
    except ImportError as exc:  # pragma: no cover
        raise ImportError(f"chiray.operators.keyindex needs pandas' Int64HashTable: {exc}") from exc
    return Int64HashTable(expected)

__all__ = ["encode_keys", "KeyIndex"]


def encode_keys(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """Group a key column the way keyed state identifies keys.

    Null is one key; all NaNs are one key; ``-0.0`` is ``0.0``.

    Args:
        column: the key column.

    Returns:
        ``(uniques, codes)``: the distinct keys in first-appearance order and,
        per row, the index of its key in ``uniques`` (``int32``).
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_floating(column.type):
        column = pc.if_else(pc.equal(column, 0), pa.scalar(0, column.type), column)
    encoded = pc.dictionary_encode(column, null_encoding="encode")
    return encoded.dictionary, encoded.indices.to_numpy()


class KeyIndex:
    """Distinct keys -> dense slots ``0..n-1``, found through their stable hash.

    Slots are given in insertion order. A whole array of keys is looked up at
    once: their 64-bit hashes go through a C hash table (pandas'
    ``Int64HashTable``), each hit is confirmed by comparing the stored key
    (vectorised, in Arrow), and the rare key whose hash another key already
    holds lives in a small Python dict. Only the owning state touches an index.

    Example:
        >>> index = KeyIndex(pa.string())
        >>> slots, new = index.upsert(pa.array(["a", "b"]))
        >>> index.upsert(pa.array(["b", "c"]))[0].tolist()
        [1, 2]
    """

    def __init__(self, key_type: pa.DataType, *, table_hash_bits: int = 64, expected: int = 0) -> None:
        """Create an empty index.

        Args:
            key_type: the Arrow type of the keys.
            table_hash_bits: hash bits the table uses; lower it only to
                exercise the collision path in tests.
            expected: keys to make room for now (no table growth until then).
        """
        self.key_type = key_type
        self._table_mask = np.uint64((1 << table_hash_bits) - 1)
        self._reset(expected)

    def reserve(self, total: int) -> None:
        """Make room for ``total`` keys in all: a new table sized for them, refilled from the keys held
        (their cost, not the room's). Growing past ``total`` later works as before."""
        n = len(self)
        if total > len(self._hash):
            self._hash = grown(self._hash, total, n)
        if total > max(self._table.capacity, n):
            self._refill_table(total)

    def _refill_table(self, total: int) -> None:
        """A table sized for ``total`` keys, holding the entries of the one before."""
        n = len(self)
        masked = self._masked(n)
        slots = np.arange(n)
        held = self._holders(n)
        self._table = _SlotTable(total)
        self._table.put(masked[held], slots[held])

    def __len__(self) -> int:
        return len(self._keys)

    def _holders(self, n: int) -> np.ndarray:
        """Whether each of the first ``n`` slots holds its hash's table entry: all but the overflow
        dict's (a lookup of every key said the same, at 68 ms for 1M keys here)."""
        held = np.ones(n, dtype=bool)
        if self._overflow:
            held[np.fromiter(self._overflow.values(), dtype=np.int64, count=len(self._overflow))] = False
        return held

    def _masked(self, n: int) -> np.ndarray:
        """The first ``n`` slots' hashes as the table holds them (a view where it holds all 64 bits)."""
        hashes = self._hash[:n]
        return hashes if self._table_mask == np.uint64(0xFFFF_FFFF_FFFF_FFFF) else hashes & self._table_mask

    def upsert(self, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Find or add distinct keys (as :func:`encode_keys` returns them).

        Returns:
            ``(slots, new)``: the slot of each key, and the positions in
            ``keys`` of the keys that were added (their slots are consecutive).
        """
        if keys.type != self.key_type:
            keys = keys.cast(self.key_type)
        hashes = _hash_array(keys, distinct=True)
        slots = self._table.find(hashes & self._table_mask)
        found = np.flatnonzero(slots >= 0)
        if found.size:
            asked = keys if found.size == len(keys) else keys.take(found)
            wrong = found[~_keys_equal(asked, self._keys.take(slots[found]))]
            if wrong.size:  # another key holds this hash: look in the overflow dict
                canon = _canonical(keys.take(wrong)).to_pylist()
                slots[wrong] = [self._overflow.get(k, -1) for k in canon]
        new = np.flatnonzero(slots < 0)
        if new.size:
            slots[new] = self._add(keys.take(new), hashes[new])
        return slots, new

    def add(self, keys: pa.Array, hashes: np.ndarray | None = None) -> np.ndarray:
        """Add keys known to be absent and distinct; returns their (consecutive) slots.

        ``hashes``: their :func:`~operators.hashing.hash_keys` hashes, if the caller has them already.
        """
        if keys.type != self.key_type:
            keys, hashes = keys.cast(self.key_type), None
        return self._add(keys, _hash_array(keys, distinct=True) if hashes is None else hashes)

    def hashes(self, slots: np.ndarray) -> np.ndarray:
        """The stored :func:`~operators.hashing.hash_keys` hash of the keys at ``slots``."""
        return self._hash[slots]

    def keys_at(self, slots: np.ndarray) -> pa.Array:
        """The keys at ``slots``."""
        return self._keys.take(slots)

    def keys_reader(self) -> Callable[[np.ndarray], pa.Array]:
        """A function that gives the keys at slots as they are now, from any thread, whatever this index
        does meanwhile (adds, compactions: it reads a view that nothing changes)."""
        return self._keys.view().take

    def keys_nbytes(self) -> int:
        """Bytes the stored keys occupy."""
        return self._keys.nbytes()

    def memory_nbytes(self) -> int:
        """Bytes the index holds: the stored keys, their hashes (with spare capacity) and the hash table."""
        return self._keys.nbytes() + self._hash.nbytes + self._table.nbytes()

    def compact(self, keep: np.ndarray) -> None:
        """Keep only the keys at slots ``keep`` (ascending); they become slots ``0..len(keep)-1``.

        The kept keys are distinct, and so are the table entries they held: the table is refilled
        from them without a search for clashes. A kept key of the overflow dict whose hash's
        holder went takes the entry (the first such key per hash); the others stay in the dict.
        """
        hashes = self._hash[: len(self)][keep]
        masked = hashes & self._table_mask
        held = self._table.find(masked) == keep  # the key holds its hash's entry
        orphans = np.flatnonzero(~held)
        if orphans.size:  # overflow keys whose entry's holder is not kept
            orphans = orphans[~np.isin(masked[orphans], masked[held])]
            _, first = np.unique(masked[orphans], return_index=True)
            held[orphans[first]] = True
        keys = self._keys.take(keep)
        renumber = np.full(len(self), -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        overflow: dict[object, int] = {
            k: int(renumber[s]) for k, s in self._overflow.items() if renumber[s] >= 0 and not held[renumber[s]]}
        self._reset(len(keep))
        self._hash[: len(keep)] = hashes
        self._keys.append(keys)
        slots = np.arange(len(keep))
        self._table.put(masked[held], slots[held])
        self._overflow = overflow

    def _add(self, keys: pa.Array, hashes: np.ndarray) -> np.ndarray:
        start, end = len(self), len(self) + len(keys)
        if end > SHARD_ABOVE and self._table.shards == 1:  # split once; later growth rehashes a shard
            self._refill_table(max(end, 2 * SHARD_ABOVE))
        if end > len(self._hash):
            self._hash = grown(self._hash, max(end, 2 * len(self._hash)), start)
        self._hash[start:end] = hashes
        self._keys.append(keys)
        slots = np.arange(start, end)
        stored = self._table.insert(hashes & self._table_mask, slots)
        self._table.grow_ahead(lambda: self._masked(end))
        if not stored.all():
            clash = np.flatnonzero(~stored)
            canon = _canonical(keys.take(clash)).to_pylist()
            self._overflow.update(zip(canon, slots[clash].tolist()))
        return slots

    _hash: np.ndarray
    _keys: "_KeyStore"
    _table: "_SlotTable"
    _overflow: dict[object, int]

    def _reset(self, capacity: int) -> None:
        self._hash = np.zeros(capacity, dtype=np.uint64)
        self._keys = _KeyStore(self.key_type)
        self._table = _SlotTable(capacity)
        self._overflow = {}


def _canonical(keys: pa.Array) -> pa.Array:
    """Keys in a form where equality is value identity (floats and temporals as integers)."""
    t = keys.type
    if pa.types.is_floating(t):
        mask = keys.is_null().to_numpy(zero_copy_only=False) if keys.null_count else None
        return pa.array(_float_bits(keys).view(np.int64), mask=mask)
    if pa.types.is_temporal(t) and t.bit_width in (32, 64):
        return keys.view(pa.int32() if t.bit_width == 32 else pa.int64())
    return keys


def _keys_equal(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Element-wise key identity (null equals null)."""
    eq = pc.fill_null(pc.equal(_canonical(a), _canonical(b)), False)
    if a.null_count or b.null_count:
        eq = pc.or_(eq, pc.and_(a.is_null(), b.is_null()))
    return eq.to_numpy(zero_copy_only=False)


SHARD_ABOVE = 1 << 20
"""Keys above which the ``hash -> slot`` table is split into ``SHARDS`` tables by the hashes' low bits.

pandas sizes a table for at most about 1.6M entries up front (it caps the size hint), and each growth
past that rehashes every entry in one stall: 80-110 ms at 1.6M keys here, doubling with each growth
(a migration's new owner hit it in the middle of a step). Split, a growth rehashes one shard (grown
ahead, one per batch: ``GROW_AHEAD``), and a table made for more keys (``KeyIndex.reserve``) grows no
more until it holds them. The split itself refills every entry once (90-130 ms at 1M keys here);
splitting earlier would make it cheaper but cost every lookup in a state of 0.1-1M keys about 60 us
per 5,000 keys."""
SHARDS = 16

GROW_AHEAD = 0.8
"""A shard fuller than this (of the entries it holds before pandas grows it) is grown ahead of time,
one shard per batch that adds keys (``_SlotTable.grow_ahead``)."""


class _SlotTable:
    """``hash -> slot`` in pandas' C hash table (``Int64HashTable``: 10x a NumPy probing loop here).

    Tables made for more than ``SHARD_ABOVE`` keys are ``SHARDS`` tables, each holding the hashes
    whose low bits are its number (the top bits are the key's bin, shared by the keys of an instance).
    A lookup then groups its hashes by shard: about 40 us more per 5,000 keys.
    """

    def __init__(self, expected: int = 0) -> None:
        self.capacity = int(expected)
        self.shards = SHARDS if expected > SHARD_ABOVE else 1
        per = -(-self.capacity // self.shards)
        self._tables = [_int64_hash_table(per) for _ in range(self.shards)]

    def _by_shard(self, hashes: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The order that groups ``hashes`` by shard, and where each shard's group starts and ends."""
        shard = (hashes & np.uint64(self.shards - 1)).astype(np.uint8)
        order = np.argsort(shard, kind="stable")  # a radix sort of small integers
        return order, [0, *np.cumsum(np.bincount(shard, minlength=self.shards)).tolist()]

    def find(self, hashes: np.ndarray) -> np.ndarray:
        """The slot stored under each hash, or -1."""
        if self.shards == 1:
            return self._tables[0].lookup(hashes.view(np.int64))
        order, bounds = self._by_shard(hashes)
        grouped = hashes[order].view(np.int64)
        found = np.empty(len(hashes), dtype=np.int64)
        found[order] = np.concatenate([table.lookup(grouped[lo:hi]) for table, lo, hi
                                       in zip(self._tables, bounds[:-1], bounds[1:])])
        return found

    def insert(self, hashes: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Store ``hash -> slot`` pairs; returns False where the hash was already taken (by a slot stored
        before, or by another of ``slots``: one of them holds it, the others get False).

        The pairs whose hash no slot held are all put. If the table grew by fewer entries, a hash came
        twice: the pairs are read back, and the slot read back is the one that holds it. Finding the
        repeats first (``np.unique``, a sort) took 0.75-0.9 s of the 2-3 s a restore of 4M keys took to
        install them here. An empty table (a restore's) is not searched first."""
        held = len(self)
        fresh: np.ndarray | slice = slice(None) if not held else np.flatnonzero(self.find(hashes) < 0)
        new_hashes, new_slots = hashes[fresh], slots[fresh]  # views where the table was empty
        self.put(new_hashes, new_slots)
        stored = np.zeros(len(hashes), dtype=bool)
        stored[fresh] = True if len(self) - held == len(new_hashes) else self.find(new_hashes) == new_slots
        return stored

    def __len__(self) -> int:
        """Hashes held."""
        return sum(len(table) for table in self._tables)

    def put(self, hashes: np.ndarray, slots: np.ndarray) -> None:
        """Store ``hash -> slot`` pairs whose hashes are absent (a hash given twice: the later slot holds
        it)."""
        slots = slots.astype(np.int64)
        if self.shards == 1:
            self._tables[0].map_keys_to_values(hashes.view(np.int64), slots)
            return
        order, bounds = self._by_shard(hashes)
        grouped, slots = hashes[order].view(np.int64), slots[order]
        for table, lo, hi in zip(self._tables, bounds[:-1], bounds[1:]):
            if hi > lo:
                table.map_keys_to_values(grouped[lo:hi], slots[lo:hi])

    def grow_ahead(self, masked: Callable[[], np.ndarray]) -> None:
        """Grow the fullest shard now if it is near its bound (``GROW_AHEAD``), one shard a call.

        The shards fill evenly, so left to themselves they all grow in the same batch: one stall as
        long as a single table's (120 ms at 3.2M keys here). Grown one per batch as they near
        their bound, each batch pays for one shard. ``masked``: every slot's masked hash (the
        shard's entries are read back from it; an overflow key's slot is not the one its hash
        holds, and stays out).
        """
        if self.shards == 1:
            return
        states = [table.get_state() for table in self._tables]
        fill = [state["size"] / state["upper_bound"] for state in states]
        i = int(np.argmax(fill))
        if fill[i] < GROW_AHEAD:
            return
        hashes = masked()
        low = hashes.astype(np.uint8)  # the shard's bits, in an eighth of the bytes
        mine = np.flatnonzero((low & np.uint8(self.shards - 1)) == np.uint8(i))
        hashes = hashes[mine].view(np.int64)
        held = self._tables[i].lookup(hashes) == mine
        table = _int64_hash_table(states[i]["upper_bound"] + 1)  # twice the buckets
        table.map_keys_to_values(hashes[held], mine[held])
        self._tables[i] = table

    def nbytes(self) -> int:
        """The tables' allocated bytes."""
        return sum(int(table.sizeof()) for table in self._tables)


MERGE_LIMIT = 1 << 18
"""The key store merges chunks only while the merged chunk holds at most this many keys. Unbounded,
the merges of a binary counter copied the whole store at each power of two: 130 ms at 2M string keys
here, in a migration's new owner in the middle of a step (and in any job whose keys keep growing).
Bounded, an append copies at most this many keys (5-15 ms), and a lookup gathers from one chunk more
per ``MERGE_LIMIT`` keys held (about 6 us each: +0.1 ms for 5,000 keys out of 4M)."""

class _KeyStore:
    """The key of every slot, as Arrow chunks whose sizes at least halve from one chunk to the next,
    up to ``MERGE_LIMIT`` keys a chunk.

    An append merges the new chunk into the ones before it while the one before is under twice its
    size and the merged chunk stays within ``MERGE_LIMIT`` (a binary counter, capped): each key is
    copied O(log MERGE_LIMIT) times over the store's life, and an append of a few keys copies only
    chunks about that small. A store kept as one array, consolidated on the lookup after an append,
    copied every key it held whenever a batch brought a new key (and a migration's new owner, once
    per step): a stall that grew with the state. A lookup gathers from each chunk it hits: about
    ``n / MERGE_LIMIT + log2(MERGE_LIMIT)`` of them at most.

    The chunks are held as an immutable :class:`_KeyView`, replaced (not changed) by an append: a view
    taken once (:meth:`view`) reads the keys as they were then from another thread, whatever the store
    does meanwhile (a checkpoint's copier takes the keys of the rows it captured without a lock).
    """

    def __init__(self, key_type: pa.DataType) -> None:
        self._view = _KeyView(key_type, (), np.zeros(1, dtype=np.int64))

    def __len__(self) -> int:
        return len(self._view)

    def view(self) -> "_KeyView":
        """The keys as they are now (never changed later)."""
        return self._view

    def append(self, keys: pa.Array) -> None:
        if not len(keys):
            return
        chunks = [*self._view.chunks, keys]
        while (len(chunks) > 1 and len(chunks[-2]) < 2 * len(chunks[-1])
               and len(chunks[-2]) + len(chunks[-1]) <= MERGE_LIMIT):
            last = chunks.pop()
            chunks[-1] = pa.concat_arrays([chunks[-1], last])
        starts = np.concatenate([[0], np.cumsum([len(c) for c in chunks], dtype=np.int64)])
        self._view = _KeyView(self._view.type, tuple(chunks), starts)

    def take(self, slots: np.ndarray) -> pa.Array:
        return self._view.take(slots)

    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self._view.chunks)


class _KeyView:
    """A store's chunks at one moment (``_KeyStore``): never changed."""

    __slots__ = ("type", "chunks", "starts")

    def __init__(self, key_type: pa.DataType, chunks: tuple[pa.Array, ...], starts: np.ndarray) -> None:
        self.type, self.chunks, self.starts = key_type, chunks, starts

    def __len__(self) -> int:
        return int(self.starts[-1])

    def take(self, slots: np.ndarray) -> pa.Array:
        """The keys at ``slots``."""
        slots = np.asarray(slots, dtype=np.int64)
        chunks, starts = self.chunks, self.starts
        if len(chunks) <= 1 or not len(slots) or int(slots.max()) < starts[1]:
            return (chunks[0] if chunks else pa.array([], type=self.type)).take(slots)
        if int(slots.min()) < 0 or int(slots.max()) >= len(self):
            raise IndexError(f"slots out of range 0..{len(self) - 1}")
        which = np.searchsorted(starts, slots, side="right") - 1
        local = slots - starts[which]  # each slot within its chunk
        order = None  # already grouped by chunk (ascending slots): taken as they are, no second take back
        if not (which[1:] >= which[:-1]).all():
            small = np.int16 if len(chunks) < 1 << 15 else np.int64
            order = np.argsort(which.astype(small), kind="stable")  # a radix sort of small integers
            which, local = which[order], local[order]
        bounds = np.searchsorted(which, np.arange(len(chunks) + 1)).tolist()
        joined = pa.concat_arrays([pc.take(chunk, local[lo:hi], boundscheck=False)
                                   for chunk, lo, hi in zip(chunks, bounds[:-1], bounds[1:]) if hi > lo])
        if order is None:
            return joined
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pc.take(joined, inverse, boundscheck=False)
