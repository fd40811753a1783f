"""keptrows.py: per key, up to ``k`` rows in order: the state of ``top`` per key and of ``rolling``'s history.

A :class:`KeptRows` maps each key to a dense *slot* (a
:class:`~operators.keyindex.KeyIndex`) and each slot to the positions of its
rows, best (or oldest) first, in a ``k``-wide NumPy matrix; the rows
themselves are in the part ``"kept"`` of a :class:`~operators.rowbins.RowsState`,
so they travel per bin like any keyed state. The owner reads a batch's keys'
rows with :meth:`KeptRows.kept` and writes their new rows with
:meth:`KeptRows.assign`, both vectorised over every key of the batch. A slot
may carry one int64 *mark* (the ``top`` operator's last event time of the
key), written beside each of its rows in a serialised bin.

A key whose bin leaves, or that the owner lets go (:meth:`KeptRows.forget`),
keeps its slot in the index as a tombstone until the index is compacted, and
gets it back if it comes again.

Only the owning logic touches it (single thread).

Example:
    >>> kept = KeptRows(8, 2, "k")
    >>> rows = pa.table({"k": ["a", "a", "b"], "v": [1, 2, 3]})
    >>> slots = kept.slots(pa.array(["a", "b"]))
    >>> kept.assign(slots, np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([-1, -1, -1]), rows)
    >>> kept.rows(kept.kept(slots[:1])[0]).column("v").to_pylist()
    [1, 2]
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .hashing import bins_from_hashes
from .keyindex import KeyIndex, encode_keys
from .rowbins import DUE, RowsState

__all__ = ["KeptRows", "RANK", "MARK"]

KEPT = "kept"
COMPACT_SLOTS = 4096
"""The key index is compacted once its tombstoned slots are at least this many and half its slots."""
RANK, MARK = "__rank", "__mark"
"""The columns a serialised bin adds to each kept row: its place among its key's rows, its slot's mark."""


class KeptRows(RowsState):
    """Per key at most ``k`` rows, in order; other parts (``extra``) hold rows the owner keeps per bin.

    Args:
        num_bins: the operator's bins.
        k: rows per key, at least 1.
        key: the key column of the kept rows.
        format: the serialised bins' format tag.
        extra: names of further ``RowBins`` parts.
        sequence: as for ``RowsState``.
    """

    def __init__(self, num_bins: int, k: int, key: str, format: str = "chiray.KeptRows/1",
                 extra: tuple[str, ...] = (), sequence: str | None = None) -> None:
        super().__init__(num_bins, (KEPT, *extra), format, sequence)
        self.k, self.key = k, key
        self._index: KeyIndex | None = None
        self._refs = np.full((0, k), -1, dtype=np.int64)
        self._count = np.zeros(0, dtype=np.int64)
        self._slot_bin = np.zeros(0, dtype=np.int32)  # num_bins: a tombstone
        self.mark = np.zeros(0, dtype=np.int64)
        self._dead_slots = 0

    @property
    def held(self) -> int:
        """Keys held."""
        return 0 if self._index is None else len(self._index) - self._dead_slots

    def slots(self, keys: pa.Array) -> np.ndarray:
        """The slots of distinct ``keys``: found, revived from a tombstone, or new (with no rows)."""
        if self._index is None:
            self._index = KeyIndex(keys.type)
        slots, new = self._index.upsert(keys)
        if new.size:
            self._grow(len(self._index))
            self._slot_bin[slots[new]] = bins_from_hashes(self._index.hashes(slots[new]), self.num_bins)
        back = slots[self._slot_bin[slots] == self.num_bins]
        if back.size:
            self._slot_bin[back] = bins_from_hashes(self._index.hashes(back), self.num_bins)
            self._dead_slots -= len(back)
        return slots

    def bins_of(self, slots: np.ndarray) -> np.ndarray:
        return self._slot_bin[slots]

    def counts(self, slots: np.ndarray) -> np.ndarray:
        """Rows kept per slot."""
        return self._count[slots]

    def live_slots(self) -> np.ndarray:
        """Every slot holding a key, ascending."""
        n = 0 if self._index is None else len(self._index)
        return np.flatnonzero(self._slot_bin[:n] != self.num_bins)

    def keys_at(self, slots: np.ndarray) -> pa.Array:
        assert self._index is not None
        return self._index.keys_at(slots)

    def kept(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``slots``: ``(positions, slot, rank)`` per row, slot by slot, each in order."""
        refs = self._refs[slots]
        valid = refs >= 0
        which, rank = np.nonzero(valid)
        return refs[valid], slots[which], rank.astype(np.int64)

    def at_rank(self, slots: np.ndarray, rank: int) -> np.ndarray:
        """The position of each slot's row at ``rank`` (-1: none)."""
        return self._refs[slots, rank]

    def rows(self, positions: np.ndarray) -> pa.Table:
        return self.parts[KEPT].take(positions)

    def assign(self, slots: np.ndarray, slot: np.ndarray, rank: np.ndarray, position: np.ndarray,
               new_rows: pa.Table) -> None:
        """Give ``slots`` new rows: row ``i`` is ``slot[i]``'s at ``rank[i]``, the row kept at ``position[i]``
        or, where that is -1, the next row of ``new_rows``. The rows of ``slots`` not named go."""
        kept = self.parts[KEPT]
        old, _, _ = self.kept(slots)
        staying = position[position >= 0]
        kept.drop(np.setdiff1d(old, staying, assume_unique=True))
        fresh = position < 0
        if fresh.any():
            position = position.copy()
            position[fresh] = kept.add(new_rows, self._slot_bin[slot[fresh]])
        self._refs[slots] = -1
        self._refs[slot, rank] = position
        self._count[slots] = 0
        np.add.at(self._count, slot, 1)

    def forget(self, slots: np.ndarray) -> None:
        """Let the keys of ``slots`` go with their rows (their slots become tombstones)."""
        old, _, _ = self.kept(slots)
        self.parts[KEPT].drop(old)
        self._clear(slots)
        self.compact()

    def _clear(self, slots: np.ndarray) -> None:
        self._refs[slots] = -1
        self._count[slots] = 0
        self._slot_bin[slots] = self.num_bins
        self.mark[slots] = 0
        self._dead_slots += len(slots)

    def _grow(self, n: int) -> None:
        if n <= len(self._count):
            return
        capacity = max(n, 2 * len(self._count), 256)
        used = len(self._count)
        refs = np.full((capacity, self.k), -1, dtype=np.int64)
        refs[:used] = self._refs
        self._refs = refs
        self._count = np.concatenate([self._count, np.zeros(capacity - used, dtype=np.int64)])
        self.mark = np.concatenate([self.mark, np.zeros(capacity - used, dtype=np.int64)])
        self._slot_bin = np.concatenate([self._slot_bin, np.full(capacity - used, self.num_bins, dtype=np.int32)])

    # -- RowsState hooks ----------------------------------------------------------

    def _rows_in(self, part: str, bins: list[int]) -> dict[int, pa.Table]:
        """The kept rows of ``bins`` with their rank and their slot's mark (two columns more)."""
        if part != KEPT or self._index is None:
            return super()._rows_in(part, bins)
        slots = self.live_slots()
        slots = slots[np.isin(self._slot_bin[slots], bins)]
        slots = slots[np.argsort(self._slot_bin[slots], kind="stable")]
        positions, slot, rank = self.kept(slots)
        if not len(positions):
            return {}
        rows = (self.parts[KEPT].take(positions).append_column(RANK, pa.array(rank))
                .append_column(MARK, pa.array(self.mark[slot]))
                .append_column(DUE, pa.array(self.parts[KEPT].due_of(positions))))
        bounds = np.searchsorted(self._slot_bin[slot], np.append(bins, self.num_bins))
        return {b: rows.slice(bounds[i], bounds[i + 1] - bounds[i])
                for i, b in enumerate(bins) if bounds[i + 1] > bounds[i]}

    def _install(self, part: str, b: int, rows: pa.Table) -> np.ndarray:
        if part != KEPT:
            return super()._install(part, b, rows)
        rank, mark = rows.column(RANK).to_numpy(), rows.column(MARK).to_numpy()
        positions = super()._install(part, b, rows.drop_columns([RANK, MARK]))
        uniques, codes = encode_keys(rows.column(self.key))
        slot = self.slots(uniques)[codes]
        self._refs[slot, rank] = positions
        np.add.at(self._count, slot, 1)
        self.mark[slot] = mark
        return positions

    def _removed(self, bins: list[int]) -> None:
        slots = self.live_slots()
        self._clear(slots[np.isin(self._slot_bin[slots], bins)])

    def _renumbered(self, part: str, renumber: np.ndarray) -> None:
        if part == KEPT:
            self._refs = np.where(self._refs >= 0, renumber[np.maximum(self._refs, 0)], -1)

    def compact(self) -> None:
        super().compact()
        n = 0 if self._index is None else len(self._index)
        if self._index is None or self._dead_slots < COMPACT_SLOTS or self._dead_slots * 2 < n:
            return
        keep = self.live_slots()
        self._index.compact(keep)
        self._refs, self._count = self._refs[keep], self._count[keep]
        self._slot_bin, self.mark = self._slot_bin[keep], self.mark[keep]
        self._dead_slots = 0
