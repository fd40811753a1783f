"""rowcapture.py: the rows a checkpoint cut holds, copied out of a columnar state after the cut (copy-on-write).

A checkpoint of a :class:`~operators.columnarstate.ColumnarAggState` used to copy, at the cut and on the
processing thread, every row it writes: the keys (a ``take`` of strings) and each column. For a full copy of
2M string keys that held the instance for 100-400 ms. A :class:`RowCapture` instead marks, at the cut, which
slots the checkpoint holds (``pending``), and a copier (the checkpoint's background thread) copies them in
chunks afterwards. A write to a slot still pending copies that slot's values first (copy-on-write by row),
so the capture holds each row as it was at the cut whatever the processing thread did since. One lock,
taken by the copier for a chunk's values and by the state for a write, keeps the two apart; the processing
thread waits at most for one chunk's values. The copier takes the chunk's keys after it lets the lock go,
from a view of the key store that nothing changes (``KeyIndex.keys_reader``).

Only the state's own writes of values (``update``) are copy-on-write; anything that moves, buries or
replaces slots (expiry, installs, moves, compaction, the next cut) first finishes the capture
(:meth:`RowCapture.finish`), which copies what is left at once, as the cut used to.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa

__all__ = ["RowCapture", "CHUNK_ROWS", "Pacer", "Foreground", "FOREGROUND"]

KeysReader = Callable[[], Callable[[np.ndarray], pa.Array]]
"""Gives, when called, a function that reads the keys at slots as they are then (``KeyIndex.keys_reader``)."""

CHUNK_ROWS = 1 << 17
"""Rows the copier copies under the lock at once (a few milliseconds)."""


class RowCapture:
    """Rows at ``slots`` as they were when the capture was made, copied later.

    Args:
        slots: the slots captured, in the order the copies keep (distinct, live).
        capacity: the state's slot capacity now (no slot of ``slots`` is at or above it).
        dtypes: per column, its dtype.

    Lifecycle: ``COPYING -> DONE`` (every slot copied: :attr:`done`). The state calls
    :meth:`before_write` under :attr:`lock` before it writes values; the copier calls
    :meth:`copy_some` (it takes the lock itself), or anyone :meth:`finish`; then :meth:`values`.
    The cut costs one boolean per slot of the state; the rest happens as the rows are copied.
    """

    def __init__(self, slots: np.ndarray, capacity: int, dtypes: Mapping[str, np.dtype]) -> None:
        self.slots = slots
        self.lock = threading.Lock()
        self._pending = np.zeros(capacity, dtype=bool)
        if len(slots) and int(slots.max()) == len(slots) - 1:  # (distinct) every slot below len(slots): a full
            self._pending[:len(slots)] = True                   # copy's; a scatter took 10 ms at 4M slots
        else:
            self._pending[slots] = True
        self._values = {name: np.empty(len(slots), dtype=dtype) for name, dtype in dtypes.items()}
        self._keys: dict[int, pa.Array] = {}  # first row of a chunk -> its keys
        self._taking = 0  # chunks whose keys are being taken (outside the lock)
        self._keys_taken = threading.Condition(self.lock)
        self._saved: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []  # rows a write copied first
        self._copied = 0  # rows [0, _copied) have been copied (those saved are taken from _saved)

    @property
    def done(self) -> bool:
        return self._copied == len(self.slots)

    @property
    def rescued(self) -> int:
        """Rows a write copied before the copier came to them."""
        return sum(len(slots) for slots, _ in self._saved)

    def before_write(self, slots: np.ndarray, cols: Mapping[str, np.ndarray]) -> None:
        """The state is about to write ``slots`` (``lock`` held): copy those still pending first."""
        if self.done or not len(slots):
            return
        inside = slots[slots < len(self._pending)]  # a slot made after the capture is not in it
        hit = inside[self._pending[inside]]
        if hit.size:
            self._saved.append((hit, {name: cols[name][hit] for name in self._values}))
            self._pending[hit] = False

    def copy_some(self, cols: Callable[[], Mapping[str, np.ndarray]], keys: KeysReader | None,
                  rows: int | None = None) -> bool:
        """Copy the next ``rows`` rows (default ``CHUNK_ROWS``; their keys too, with ``keys``); whether all
        are done.

        ``cols`` gives the state's columns as they are once the lock is held (a write may have replaced
        them with larger ones). A row a write saved first is copied too, and replaced by the saved one
        in :meth:`values`. ``keys()``, called under the lock, gives a function that reads the keys at
        slots as they are then, whatever the state does later: the keys are taken after the lock is let
        go (most of a chunk's time, for string keys), so a write waits only for the values' copy."""
        rows = CHUNK_ROWS if rows is None else rows  # (read now: a test makes chunks small)
        with self.lock:
            lo, hi = self._copied, min(self._copied + rows, len(self.slots))
            chunk = self.slots[lo:hi]
            columns = cols()
            for name, out in self._values.items():
                np.take(columns[name], chunk, out=out[lo:hi])
            self._pending[chunk] = False
            reader = keys() if keys is not None and hi > lo else None
            self._copied = hi
            done = self.done
            if reader is not None:
                self._taking += 1
        if reader is not None:
            taken = None
            try:
                taken = reader(chunk)
            finally:
                with self.lock:  # (stored before the count drops: values() waits for the count)
                    if taken is not None:
                        self._keys[lo] = taken
                    self._taking -= 1
                    self._keys_taken.notify_all()
        return done

    def reorder(self, start: int, arrange: Callable[[np.ndarray], np.ndarray]) -> bool:
        """Copy the rows from ``start`` on in another order, if no row was copied yet: ``arrange(slots)``
        gives those slots in their new order. Whether it did (a copy that began, e.g. a :meth:`finish`, keeps
        its order). ``arrange`` runs under :attr:`lock`, before any copy: the state moves no slot
        meanwhile (anything that does first finishes the copy, which waits for the lock)."""
        with self.lock:
            if self._copied:
                return False
            tail = self.slots[start:]
            if len(tail):
                arranged = arrange(tail)
                assert len(arranged) == len(tail), "bug: RowCapture.reorder() must keep every slot"
                self.slots[start:] = arranged
            return True

    def finish(self, cols: Callable[[], Mapping[str, np.ndarray]], keys: KeysReader | None) -> None:
        """Copy every row not copied yet now."""
        self.copy_some(cols, keys, len(self.slots))

    def copy_all(self, cols: Callable[[], Mapping[str, np.ndarray]], keys: KeysReader | None,
                 share: float = 0.5, floor: float | None = None) -> None:
        """Copy every row, a chunk at a time; between chunks, rest so that copying takes at most ``share`` of
        this thread's time, down to ``floor`` while the processing thread is busy (:class:`Pacer`; the
        processing thread gets the interpreter and the lock in between)."""
        pacer = Pacer(share, min_s=0.0, floor=floor)
        while not self.copy_some(cols, keys):
            pacer.rest()

    def values(self) -> tuple[pa.ChunkedArray | None, dict[str, np.ndarray]]:
        """Once :attr:`done`: the keys (``None`` if none were copied) and the values of the captured rows,
        in the order of ``slots``, as they were at the capture."""
        assert self.done, "bug: RowCapture.values() before every row was copied"
        with self.lock:  # keys another thread is still taking (it copied their rows' values)
            self._keys_taken.wait_for(lambda: not self._taking)
        if self._saved:
            where = np.empty(len(self._pending), dtype=np.int64)
            where[self.slots] = np.arange(len(self.slots))
            for slots, saved in self._saved:
                at = where[slots]
                for name, out in self._values.items():
                    out[at] = saved[name]
        keys = pa.chunked_array([self._keys[lo] for lo in sorted(self._keys)]) if self._keys else None
        # (not concatenated: a copy of them all)
        return keys, self._values


class Pacer:
    """Keeps a background thread's work to at most ``share`` of its time, and, while the process's
    processing thread is busy (:class:`Foreground`), down to ``floor``: call :meth:`rest` between two
    pieces of work. It sleeps as long as the work since the last rest calls for at ``share`` (``work *
    (1 - share) / share``), then, while the processing thread is busy, waits for it to go idle, for at
    most as long again as ``floor`` allows; all that once the work passed ``min_s`` (a rest after every
    small piece would cost more in wake-ups than it gives back).

    Python threads share one interpreter lock: a thread that encodes without pause takes it from the
    processing thread for a switch interval (5 ms) at every turn, which delays every batch behind it.
    Waiting for the processing thread to go idle gives the background work the time the operators
    leave: at 4M keys and 65 % load, a checkpoint every second, the latency p99 was 182-253 ms with a
    floor of 0.1 and 245-447 ms without (three runs each, in turn), and checkpoints took a fifth longer.
    The floor keeps a checkpoint going on a host that is never idle.

    Example:
        >>> pacer = Pacer(0.25)
        >>> pacer.rest()  # no work yet: no rest
    """

    def __init__(self, share: float, min_s: float = 0.002, floor: float | None = None,
                 foreground: Foreground | None = None) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        floor = share if floor is None else floor
        if not 0.0 < floor <= share:
            raise ValueError(f"floor must be in (0, share], got {floor}")
        self.share, self.floor, self.min_s = share, floor, min_s
        self.foreground = FOREGROUND if foreground is None else foreground
        self._since = time.perf_counter()
        self.rested_s = 0.0

    def rest(self) -> None:
        worked = time.perf_counter() - self._since
        if worked < self.min_s or self.share == 1.0:
            return
        pause = worked * (1 - self.share) / self.share
        time.sleep(pause)
        longest = worked * (1 - self.floor) / self.floor - pause
        if longest > 0:
            pause += self.foreground.wait_idle(longest)
        self.rested_s += pause
        self._since = time.perf_counter()


class Foreground:
    """Whether this process's processing thread is busy: background work (a checkpoint's copy and
    encoding) waits for it to go idle, up to its pacer's floor.

    A host marks itself :meth:`busy` while it steps its instances and :meth:`idle` while it waits for
    messages. A process without a host is always idle (nothing waits).
    """

    def __init__(self) -> None:
        self._idle = threading.Event()
        self._idle.set()

    def busy(self) -> None:
        self._idle.clear()

    def idle(self) -> None:
        self._idle.set()

    def wait_idle(self, timeout: float) -> float:
        """Wait until the processing thread is idle, at most ``timeout`` seconds; how long it waited."""
        if self._idle.is_set():
            return 0.0
        started = time.perf_counter()
        self._idle.wait(timeout)
        return time.perf_counter() - started


FOREGROUND = Foreground()
"""The process's foreground (its host's processing thread)."""
