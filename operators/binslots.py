"""binslots.py: which slots of a columnar keyed state hold each bin, without a pass over every slot.

A columnar state (``state.ColumnarAggState``) keeps its keys in dense slots
and the bin of every slot in one array. Moving a few bins (a migration step)
used to find their slots with a pass over that array: a few milliseconds per
million keys on each side of every step, whatever the number of bins moved.
:class:`BinSlots` answers "the slots of these bins" in time proportional to
the answer:

* a *sorted run*: every slot at the last rebuild, ordered by bin, with each
  bin's range in it;
* a short *tail* of slots whose bin was set after the rebuild (new keys,
  keys of a moved bin that came back), filtered by bin when asked.

A bin that leaves the state loses its range at once; its slots are
tombstones (bin ``num_bins``) and never come back into a range. The run is
rebuilt (one linear radix sort of the bins) once the tail is a quarter of
the slots, when slots are renumbered (compaction), or on first use.
Only the owning state touches it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["BinSlots"]

REBUILD_TAIL = 1 / 4
"""The run is rebuilt once the tail holds this share of the slots (and at least ``MIN_TAIL``)."""
MIN_TAIL = 1 << 14


class BinSlots:
    """Per bin, the slots that hold its keys.

    Args:
        num_bins: the state's bins; slots of bin ``num_bins`` are tombstones.
    """

    def __init__(self, num_bins: int) -> None:
        self._num_bins = num_bins
        self._sort_dtype = np.uint16 if num_bins < (1 << 16) else np.int64  # a radix sort for uint16
        self._run = np.zeros(0, dtype=np.int32)
        self._lo = np.zeros(num_bins + 1, dtype=np.int64)
        self._hi = np.zeros(num_bins + 1, dtype=np.int64)
        self._tail = np.zeros(1024, dtype=np.int32)
        self._tail_n = 0
        self._valid = False  # the run matches the current slot numbering

    def invalidate(self) -> None:
        """Slots were renumbered or dropped: rebuild on the next question."""
        self._valid = False
        self._tail_n = 0

    def added(self, slots: np.ndarray) -> None:
        """``slots`` now hold keys of a live bin (new slots, or tombstones that came back)."""
        if not self._valid or not len(slots):
            return
        end = self._tail_n + len(slots)
        if end > len(self._tail):
            grown = np.zeros(max(end, 2 * len(self._tail)), dtype=np.int32)
            grown[: self._tail_n] = self._tail[: self._tail_n]
            self._tail = grown
        self._tail[self._tail_n:end] = slots
        self._tail_n = end

    def removed(self, bins: Sequence[int], bin_of: np.ndarray) -> None:
        """``bins`` left the state (their slots are tombstones in ``bin_of`` already)."""
        if not self._valid:
            return
        b = np.asarray(bins, dtype=np.int64)
        self._hi[b] = self._lo[b]
        tail = self._tail[: self._tail_n]
        kept = tail[bin_of[tail] != self._num_bins]
        self._tail[: len(kept)] = kept
        self._tail_n = len(kept)

    def slots_in(self, bins: Sequence[int], bin_of: np.ndarray) -> np.ndarray:
        """The slots of ``bins`` (distinct; by bin, then slot, for the run, the tail after).

        Args:
            bins: distinct bins below ``num_bins``.
            bin_of: the bin of every slot in use (tombstones: ``num_bins``).
        """
        n = len(bin_of)
        if not self._valid or self._tail_n > max(MIN_TAIL, REBUILD_TAIL * n):
            self._rebuild(bin_of)
        b = np.asarray(bins, dtype=np.int64)
        parts = [self._run[lo:hi] for lo, hi in zip(self._lo[b].tolist(), self._hi[b].tolist()) if hi > lo]
        if self._tail_n:
            wanted = np.zeros(self._num_bins + 1, dtype=bool)
            wanted[b] = True
            tail = self._tail[: self._tail_n]
            parts.append(tail[wanted[bin_of[tail]]])
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64)

    def _rebuild(self, bin_of: np.ndarray) -> None:
        self._run = np.argsort(bin_of.astype(self._sort_dtype), kind="stable").astype(np.int32)
        counts = np.bincount(bin_of, minlength=self._num_bins + 1)
        self._hi = np.cumsum(counts).astype(np.int64)
        self._lo = self._hi - counts
        self._tail_n = 0
        self._valid = True

    def nbytes(self) -> int:
        return int(self._run.nbytes + self._lo.nbytes + self._hi.nbytes + self._tail.nbytes)
