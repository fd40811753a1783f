"""deletedkeys.py: the keys a columnar state deleted one by one, so that its incremental changes carry them.

A columnar keyed state (``columnarstate.ColumnarAggState``) used to lose a key only with
its whole bin, so the changes of a bin since a version were just the rows
stamped later. State TTL deletes single keys: :class:`DeletedKeys` remembers
each such key with its bin and the version its bin took at the deletion (its
*stamp*), so that the changes since a version list the keys deleted after it.

The log forgets: a checkpoint that captured a bin needs no deletion older than
that capture (later changes build on it), and a log grown past its bound is
dropped whole. Either way it records, per bin, the newest stamp it forgot:
changes since an older version are then unknown here (``known_since``), and
the caller writes the bin whole. Only the owning state touches it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["DeletedKeys"]

MIN_BOUND = 4096
"""The log is dropped past this many keys, or past the state's live keys if more."""


class DeletedKeys:
    """Keys deleted from single bins, with their bins and stamps.

    Example:
        >>> log = DeletedKeys(4)
        >>> log.add(pa.array(["a", "b"]), np.array([1, 2]), np.array([5, 3]))
        >>> log.since({1: 4, 2: 3})[0].to_pylist(), log.known_since(1, 0)
        (['a'], True)
    """

    def __init__(self, num_bins: int) -> None:
        self._num_bins = num_bins
        self._keys: list[pa.Array] = []
        self._bins: list[np.ndarray] = []
        self._stamps: list[np.ndarray] = []
        self._count = 0
        self._forgot = np.full(num_bins, -1, dtype=np.int64)  # per bin: the newest stamp forgotten

    def __len__(self) -> int:
        return self._count

    def add(self, keys: pa.Array, bins: np.ndarray, stamps: np.ndarray) -> None:
        """``keys[i]`` left bin ``bins[i]``, which took version ``stamps[i]`` then."""
        if len(keys):
            self._keys.append(keys)
            self._bins.append(np.asarray(bins, dtype=np.int64))
            self._stamps.append(np.asarray(stamps, dtype=np.int64))
            self._count += len(keys)

    def known_since(self, bin: int, version: int) -> bool:
        """Whether every key deleted from ``bin`` after ``version`` is still here."""
        return version >= self._forgot[bin]

    def since(self, base: dict[int, int]) -> tuple[pa.Array | None, np.ndarray]:
        """The keys deleted from each bin ``b`` of ``base`` after version ``base[b]``, and their bins
        (``(None, [])`` where none)."""
        if not self._count or not base:
            return None, np.zeros(0, dtype=np.int64)
        keys, bins, stamps = self._merged()
        after = np.full(self._num_bins, np.iinfo(np.int64).max, dtype=np.int64)
        after[list(base)] = list(base.values())
        picked = np.flatnonzero(stamps > after[bins])
        return keys.take(picked), bins[picked]

    def forget(self, bins: Sequence[int]) -> None:
        """Drop what the log holds of ``bins`` (a checkpoint captured them, or they left)."""
        if not self._count or not len(bins):
            return
        keys, all_bins, stamps = self._merged()
        dropped = np.zeros(self._num_bins, dtype=bool)
        dropped[np.asarray(bins, dtype=np.int64)] = True
        gone = dropped[all_bins]
        np.maximum.at(self._forgot, all_bins[gone], stamps[gone])
        kept = np.flatnonzero(~gone)
        self._set(keys.take(kept), all_bins[kept], stamps[kept])

    def bound(self, live: int) -> None:
        """Drop the whole log once it holds more keys than ``max(MIN_BOUND, live)`` (a state whose bins no
        checkpoint captures: a full copy of a bin is then no larger than its changes)."""
        if self._count > max(MIN_BOUND, live):
            self.forget(range(self._num_bins))

    def _merged(self) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        if len(self._keys) > 1:
            self._set(pa.concat_arrays(self._keys), np.concatenate(self._bins), np.concatenate(self._stamps))
        return self._keys[0], self._bins[0], self._stamps[0]

    def _set(self, keys: pa.Array, bins: np.ndarray, stamps: np.ndarray) -> None:
        self._keys, self._bins, self._stamps = ([keys], [bins], [stamps]) if len(keys) else ([], [], [])
        self._count = len(keys)
