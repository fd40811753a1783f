"""binslots.py: which slots of a columnar keyed state hold each bin, without a pass over every slot.

A columnar state (``columnarstate.ColumnarAggState``) keeps its keys in dense slots
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

A first use at a large state stalled its owner: 30-95 ms at 2.6-4M keys, in
the first step of every migration. :meth:`BinSlots.prepare` (the state calls
it when a rescale's planner asks for its metrics) sorts a copy of the bins on
a worker thread instead, while the owner goes on (NumPy's sort lets go of the
GIL); the changes meanwhile are kept as they come, and the first question
installs the run, waiting for it only if it is not done yet.
Only the owning state touches it (the worker thread touches only its copy).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from typing import Callable, Sequence

import numpy as np

__all__ = ["BinSlots"]

REBUILD_TAIL = 1 / 4
"""The run is rebuilt once the tail holds this share of the slots (and at least ``MIN_TAIL``)."""
MIN_TAIL = 1 << 14

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _sorter() -> concurrent.futures.ThreadPoolExecutor:
    """The process's one thread that sorts runs in the background (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chiray-binslots")
        return _pool


def _sorted_run(bins: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The slots ordered by bin (stable), and each bin's range in that order: ``(run, lo, hi)``."""
    run = np.argsort(bins, kind="stable").astype(np.int32)
    counts = np.bincount(bins, minlength=num_bins + 1)
    hi = np.cumsum(counts).astype(np.int64)
    return run, hi - counts, hi


@dataclasses.dataclass
class _Building:
    """A run being sorted in the background from ``bins``, a copy of the slots' bins when it began."""

    future: concurrent.futures.Future
    bins: np.ndarray
    removed: set[int]  # bins that left since the copy


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
        self._building: _Building | None = None

    def invalidate(self) -> None:
        """Slots were renumbered or dropped: rebuild on the next question."""
        self._valid = False
        self._tail_n = 0
        self._building = None  # sorted from the old numbering: its result is dropped

    def prepare(self, bin_of: np.ndarray) -> Callable[[], None]:
        """Bins may move soon: sort the run in the background now, from a copy of ``bin_of`` (the bin
        of every slot in use), if the next question would rebuild it. Returns a function that waits
        until the sort is done (any thread may call it)."""
        if self._building is None and self._due(len(bin_of)):
            copy = bin_of.astype(self._sort_dtype)
            self._building = _Building(_sorter().submit(_sorted_run, copy, self._num_bins), copy, set())
        pending = [self._building.future] if self._building is not None else []

        def wait() -> None:
            concurrent.futures.wait(pending)  # its outcome is the owner's to take (``_install``)

        return wait

    def _due(self, n: int) -> bool:
        return not self._valid or self._tail_n > max(MIN_TAIL, REBUILD_TAIL * n)

    def added(self, slots: np.ndarray) -> None:
        """``slots`` now hold keys of a live bin (new slots, or tombstones that came back)."""
        if not (self._valid or self._building is not None) or not len(slots):
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
        if self._building is not None:
            self._building.removed.update(int(b) for b in bins)
        elif not self._valid:
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
        if self._building is not None:
            self._install(bin_of)
        if self._due(len(bin_of)):
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
        self._run, self._lo, self._hi = _sorted_run(bin_of.astype(self._sort_dtype), self._num_bins)
        self._tail_n = 0
        self._valid = True
        self._building = None

    def _install(self, bin_of: np.ndarray) -> None:
        """Take the run sorted in the background (waiting for it if need be).

        It holds every slot of its copy under the bin the slot had then. Since then, bins left
        (their ranges are emptied: their slots that came back are in the tail), and slots were
        added to the tail; the tail keeps those the run does not place right.
        """
        building, self._building = self._building, None
        assert building is not None
        self._run, self._lo, self._hi = building.future.result()
        copied = building.bins
        gone = np.zeros(self._num_bins + 1, dtype=bool)
        gone[list(building.removed)] = True
        self._hi[gone] = self._lo[gone]
        tail = self._tail[: self._tail_n]
        old = tail < len(copied)
        placed = np.zeros(len(tail), dtype=bool)
        placed[old] = copied[tail[old]] == bin_of[tail[old]]
        placed &= ~gone[bin_of[tail]]
        kept = tail[~placed]
        self._tail[: len(kept)] = kept
        self._tail_n = len(kept)
        self._valid = True

    def nbytes(self) -> int:
        return int(self._run.nbytes + self._lo.nbytes + self._hi.nbytes + self._tail.nbytes)
