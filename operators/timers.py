"""timers.py: keyed process with event-time timers; values and pending timers live in bins.

``key_by(k).process(fn, on_timer=...)`` runs :class:`TimerProcessLogic`:
``fn(key, rows, ctx)`` per key and batch, as for a plain keyed process, where
``ctx`` (a :class:`KeyContext`) also registers and deletes event-time timers
for that key; when the watermark reaches a timer's time, ``on_timer(key,
time, ctx)`` runs, once per (key, time), in time order. Pending timers are
part of the key's bin (Megaphone's pending records): a :class:`TimerState`
keeps ``key -> value`` and ``key -> sorted timer times`` in two
:class:`~operators.dictstate.DictState`s and the watermark beside them, so
extracting a bin moves both, and a bin installed elsewhere keeps its event
time.

Example:
    >>> def count(key, rows, ctx):
    ...     ctx.value = (ctx.value or 0) + rows.num_rows
    ...     ctx.register(10)
    >>> def emit(key, time, ctx):
    ...     return [{"k": key, "at": time, "n": ctx.value}]
    >>> logic = TimerProcessLogic("k", count, emit, 8)
    >>> _ = logic.process(pa.record_batch({"k": ["a", "a"]}), 0)
    >>> logic.on_watermark(10)[0].to_pylist()
    [{'k': 'a', 'at': 10, 'n': 2}]
"""

from __future__ import annotations

import bisect
import datetime
import heapq
import itertools
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from . import codec
from .callbacks import OnTimerFunction
from .batch import merge_runs, to_batches
from .keyed import ProcessLogic, _check_fn
from .dictstate import DictState
from .state import BinnedState

__all__ = ["TimerProcessLogic", "TimerState", "KeyContext"]

MIN_TIME = -(1 << 63)
_FORMAT = "chiray.TimerState/1"


class TimerState(BinnedState):
    """Per key a value and its pending timers, per bin; the watermark; a heap of due timers.

    The heap may hold stale entries (deleted timers, keys moved away): a
    timer fires only if it is still pending when popped.

    A bin travels as Arrow IPC (:mod:`operators.codec`): the watermark, the
    version and the bins of both dict states. The timers' bin is Arrow IPC
    too; the values' bin is pickled (``DictState(pickled=True)``), since they
    are whatever the user's functions store.
    """

    def __init__(self, num_bins: int) -> None:
        super().__init__(num_bins)
        self.values = DictState(num_bins, pickled=True)  # the user's values: any objects
        self.timers = DictState(num_bins)
        self.watermark = MIN_TIME
        self._heap: list[tuple[int, int, Any, int]] = []
        self._seq = itertools.count()
        self._remembered: set[int] = set()

    def register(self, key: Any, bin: int, time: int) -> None:
        pending = self.timers.get(key, bin) or []
        i = bisect.bisect_left(pending, time)
        if i < len(pending) and pending[i] == time:
            return  # one timer per (key, time)
        self.timers.put(key, bin, pending[:i] + [time] + pending[i:])
        heapq.heappush(self._heap, (time, next(self._seq), key, bin))

    def delete(self, key: Any, bin: int, time: int) -> None:
        pending = self.timers.get(key, bin) or []
        if time in pending:
            kept = [t for t in pending if t != time]
            if kept:
                self.timers.put(key, bin, kept)
            else:
                self.timers.delete(key, bin)

    def pop_due(self) -> tuple[Any, int, int] | None:
        """The next pending timer at or before the watermark, removed: ``(key, bin, time)``; None if none."""
        while self._heap and self._heap[0][0] <= self.watermark:
            time, _, key, b = heapq.heappop(self._heap)
            pending = self.timers.get(key, b) or []
            if pending and pending[0] == time:
                self.delete(key, b, time)
                self._remembered.add(b)
                return key, b, time
        return None

    def version(self, bin: int) -> int:
        return max(super().version(bin), self.values.version(bin) + self.timers.version(bin))

    def bins(self) -> list[int]:
        return sorted(set(self.values.bins()) | set(self.timers.bins()) | self._remembered)

    def bin_key_counts(self) -> dict[int, int]:
        counts = dict(self.timers.bin_key_counts())
        for b, n in self.values.bin_key_counts().items():
            counts[b] = max(counts.get(b, 0), n)
        return counts

    def bin_sizes(self) -> dict[int, int]:
        sizes = {b: 16 for b in self._remembered}
        for part in (self.values.bin_sizes(), self.timers.bin_sizes()):
            for b, n in part.items():
                sizes[b] = sizes.get(b, 0) + n
        return sizes

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        """Per bin one document; a part with no keys in the bin is left out (``None``): its version travels
        in the document's."""
        wanted = self._check_bins(bins)
        values = self.values.snapshot_bins(set(wanted).intersection(self.values.bins()))
        timers = self.timers.snapshot_bins(set(wanted).intersection(self.timers.bins()))
        return {b: codec.encode({"format": _FORMAT, "watermark": self.watermark, "version": self.version(b),
                                 "values": values.get(b), "timers": timers.get(b)}) for b in wanted}

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        out = self.snapshot_bins(bins)
        self.values.drop_bins(out)
        self.timers.drop_bins(out)
        self._remembered.difference_update(out)
        return out

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        docs = {self._check_bin(b): self._decode(b, p) for b, p in data.items()}
        self.timers.install_bins({b: d["timers"] for b, d in docs.items() if d["timers"] is not None})
        self.values.install_bins({b: d["values"] for b, d in docs.items() if d["values"] is not None})
        for b, doc in docs.items():
            for key, times in (self.timers._bins.get(b, {}) if doc["timers"] is not None else {}).items():
                for t in times:
                    heapq.heappush(self._heap, (t, next(self._seq), key, b))
            self.watermark = max(self.watermark, doc["watermark"])
            self._carry_version(b, doc["version"])
            self._remembered.add(b)

    def _decode(self, b: int, payload: bytes) -> dict[str, Any]:
        doc = codec.decode_document(payload, "TimerState", _FORMAT, b)
        if not all(isinstance(doc.get(part), (bytes, type(None))) for part in ("values", "timers")):
            raise ValueError(f"bin {b}: payload is not a TimerState bin (values and timers are not bytes)")
        return doc

    def __len__(self) -> int:
        return len(self.values) + len(self.timers)


class KeyContext:
    """One key's state and timers, handed to ``fn`` and ``on_timer``; valid only during that call.

    The public type of it is :class:`~operators.callbacks.KeyedTimerState` (``chiray.KeyedTimerState``).
    """

    __slots__ = ("_store", "_key", "_bin")

    def __init__(self, store: TimerState, key: Any, bin: int) -> None:
        self._store, self._key, self._bin = store, key, bin

    @property
    def value(self) -> Any:
        """The key's state (``None`` if none); assign to set, ``None`` to clear."""
        return self._store.values.get(self._key, self._bin)

    @value.setter
    def value(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self._store.values.put(self._key, self._bin, value)

    def clear(self) -> None:
        self._store.values.delete(self._key, self._bin)

    @property
    def watermark(self) -> int:
        """The operator's current watermark."""
        return self._store.watermark

    def register(self, time: int) -> None:
        """Call ``on_timer`` for this key once the watermark reaches ``time`` (once per time).

        ``time`` is in the unit of the watermarks, that is of the sources' event-time column: the
        integer itself for an integer column, and for a ``timestamp`` column its integer ticks
        (nanoseconds since the epoch for ``timestamp("ns")``, milliseconds for ``timestamp("ms")``):
        ``state.watermark`` is in that unit too, so ``state.register(state.watermark + delay)`` works.

        Raises:
            TypeError: ``time`` is not an integer (a ``datetime`` or a float), naming what to pass.
        """
        self._store.register(self._key, self._bin, _ticks(time, "register"))

    def delete(self, time: int) -> None:
        """Forget this key's timer at ``time`` if pending (the unit of :meth:`register`)."""
        self._store.delete(self._key, self._bin, _ticks(time, "delete"))

    @property
    def timers(self) -> list[int]:
        """This key's pending timer times, ascending."""
        return list(self._store.timers.get(self._key, self._bin) or [])


class TimerProcessLogic(ProcessLogic):
    """Keyed process with per-key state and event-time timers (see the module docstring)."""

    def __init__(self, key: str, fn: Callable[..., Any], on_timer: OnTimerFunction, num_bins: int,
                 output_schema: pa.Schema | None = None) -> None:
        super().__init__(key, fn, num_bins, output_schema)
        _check_fn(on_timer, "on_timer")
        self.on_timer = on_timer
        self._timers = TimerState(self.num_bins)

    @property
    def state(self) -> TimerState:  # type: ignore[override]
        return self._timers

    def replace_code(self, fn: Callable[..., Any], on_timer: Any = None,
                     schema: pa.Schema | None = None) -> tuple[Any, Any, Any]:
        """An upgrade: ``fn`` and ``on_timer`` (the current one if None) from now on; returns the code replaced."""
        old_timer = self.on_timer
        old = super().replace_code(fn, None, schema)
        if on_timer is not None:
            _check_fn(on_timer, "on_timer")
            self.on_timer = on_timer
        return (old[0], old_timer, old[2])

    def _key_state(self, key: Any, bin: int) -> KeyContext:
        return KeyContext(self._timers, key, bin)

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        out = self._fire()  # timers that installed bins or earlier calls left due
        return merge_runs(out + super().process(batch, input_index) + self._fire())

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        self._timers.watermark = max(self._timers.watermark, watermark)
        return merge_runs(self._fire())

    def finish(self) -> list[pa.RecordBatch]:
        """End of input: event time ends, every pending timer fires."""
        return self.on_watermark(1 << 62)

    def _fire(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        while (due := self._timers.pop_due()) is not None:
            key, b, time = due
            out.extend(self._conform(x) for x in to_batches(self.on_timer(key, time, KeyContext(self._timers, key, b)),
                                                            self.output_schema) if x.num_rows)
        return out


def _ticks(time: Any, verb: str) -> int:
    """A timer time as the integer ticks the watermarks use; anything else is refused, never truncated."""
    if isinstance(time, bool) or not isinstance(time, (int, np.integer)):
        hint = ""
        if isinstance(time, (datetime.datetime, datetime.date)) or type(time).__name__ == "Timestamp":
            hint = (" for a timestamp column pass its integer ticks, e.g. int(pd.Timestamp(t).value) for "
                    "timestamp('ns') or that // 10**6 for timestamp('ms');")
        raise TypeError(f"state.{verb}(time): expected an integer in the unit of the watermarks (the event-time "
                        f"column's ticks), got {type(time).__name__} {time!r};{hint} state.watermark is in that "
                        "unit")
    return int(time)
