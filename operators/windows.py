"""windows.py: event-time windows over a keyed stream: tumbling, sliding and session, their specs and logics.

A window spec says how records are assigned to windows (``tumbling(size)``,
``sliding(size, slide)``, ``session(gap)``). Fixed windows (tumbling and
sliding) are run by :class:`FixedWindowLogic` over a
:class:`~operators.windowstate.WindowState`: each record goes to the panes of
its windows, vectorised per batch (a record's windows are computed with NumPy
and the batch is split once per window it touches); a pane is a built-in
:class:`~operators.keyed.AggregateLogic` (count, sum, min, max, mean) or, for
a user function over each window's rows, a :class:`RowsPane`. Session windows
live in :mod:`operators.sessions`.

Results are emitted when the watermark passes a window's end: one row per key
and window with columns ``key, window_start, window_end, <aggregates>``. With
``allowed_lateness`` a window stays open that much longer and a record that
arrives after it fired updates it (the new row of that key is emitted
again). A record whose every window has expired is *late*: it is dropped and
counted (``late_records``, in the instance's statistics).

Example:
    >>> logic = FixedWindowLogic("k", "t", tumbling(10), 8, aggs=[AggSpec("n", "count")])
    >>> _ = logic.process(pa.record_batch({"k": ["a", "a", "b"], "t": [1, 12, 5]}), 0)
    >>> [r for b in logic.on_watermark(9) for r in b.to_pylist()]
    [{'k': 'a', 'window_start': 0, 'window_end': 10, 'n': 1}, {'k': 'b', 'window_start': 0, 'window_end': 10, 'n': 1}]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from .aggregates import AggSpec
from .batch import to_batches
from .columns import check_arrival
from .eventtime import Duration, show_duration, ticks, time_values
from .keyed import AggregateLogic, _KeyedLogic
from .logic import SideOutput
from .keyindex import encode_keys
from .hashing import bins_of
from .dictstate import DictState
from .windowstate import WindowState

__all__ = ["WindowSpec", "tumbling", "sliding", "session", "FixedWindowLogic", "RowsPane",
           "window_output_schema", "WINDOW_COLUMNS"]

WINDOW_COLUMNS = ("window_start", "window_end")
LATE = "late"
"""The side output of late records."""


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """How records are assigned to windows.

    Attributes:
        kind: ``"tumbling"``, ``"sliding"`` or ``"session"``.
        size: window length (tumbling, sliding).
        slide: distance between window starts (sliding; ``size`` for tumbling).
        gap: inactivity that closes a session.
    """

    kind: str
    size: Duration = 0
    slide: Duration = 0
    gap: Duration = 0

    def __str__(self) -> str:
        """As the user wrote it: ``tumbling(60)``, ``sliding(timedelta(seconds=600), timedelta(seconds=60))``."""
        if self.kind == "session":
            return f"session({show_duration(self.gap)})"
        if self.kind == "tumbling":
            return f"tumbling({show_duration(self.size)})"
        return f"{self.kind}({show_duration(self.size)}, {show_duration(self.slide)})"

    def resolve(self, t: pa.DataType | None, where: str, column: str | None = None) -> tuple[int, int, int]:
        """``(size, slide, gap)`` in ticks of a time column of type ``t`` (named ``column``), checked.

        Raises:
            DurationUnitError: a bare number on a timestamp column (or a timedelta on an integer one).
            DurationRangeError: a duration too long for 64-bit ticks.
            ValueError: a size, slide or gap that is not positive, or a size that is not a multiple of the slide.
        """
        if self.kind == "session":
            gap = ticks(self.gap, t, f"{where}: {self}", column)
            if gap <= 0:
                raise ValueError(f"{where}: session gap must be positive, got {self.gap!r}")
            return 0, 0, gap
        if self.kind == "tumbling":
            size = slide = ticks(self.size, t, f"{where}: {self}", column)
        else:
            size = ticks(self.size, t, f"{where}: the size of {self}", column)
            slide = ticks(self.slide, t, f"{where}: the slide of {self}", column)
        if size <= 0 or slide <= 0:
            raise ValueError(f"{where}: window size and slide must be positive, got {self.size!r}, {self.slide!r}")
        if size % slide:
            raise ValueError(f"{where}: a sliding window's size must be a multiple of its slide, "
                             f"got size {self.size!r} and slide {self.slide!r}")
        return size, slide, 0


def tumbling(size: Duration) -> WindowSpec:
    """Back-to-back windows ``[k * size, (k + 1) * size)``.

    ``size`` is a ``timedelta`` on a timestamp column (``tumbling(timedelta(minutes=1))``) and an int on
    an integer column (ticks of the column: ``tumbling(60)``); a bare number on a timestamp column is
    refused when the window is added, naming what it would have meant.
    """
    return WindowSpec("tumbling", size, size)


def sliding(size: Duration, slide: Duration) -> WindowSpec:
    """Windows of length ``size`` starting every ``slide`` (a record is in ``size / slide`` of them).

    Both are ``timedelta``s on a timestamp column, ints on an integer column (as for :func:`tumbling`).
    """
    return WindowSpec("sliding", size, slide)


def session(gap: Duration) -> WindowSpec:
    """Per key, records closer than ``gap`` share a window ``[first, last + gap)``.

    ``gap`` is a ``timedelta`` on a timestamp column, an int on an integer column (as for :func:`tumbling`).
    """
    return WindowSpec("session", gap=gap)


def window_output_schema(time_type: pa.DataType, key_field: pa.Field, values: Sequence[pa.Field]) -> pa.Schema:
    """``key, window_start, window_end, *values``; bounds have the time column's type."""
    bound = time_type if pa.types.is_timestamp(time_type) else pa.int64()
    return pa.schema([key_field, pa.field(WINDOW_COLUMNS[0], bound), pa.field(WINDOW_COLUMNS[1], bound),
                      *values])


def with_window(batch: pa.RecordBatch, start: int, end: int, time_type: pa.DataType) -> pa.RecordBatch:
    """``batch`` (key first) with the window's bounds inserted after the key."""
    bound = time_type if pa.types.is_timestamp(time_type) else pa.int64()
    n = batch.num_rows
    starts = pa.array(np.full(n, start, dtype=np.int64)).cast(bound)
    ends = pa.array(np.full(n, end, dtype=np.int64)).cast(bound)
    arrays = [batch.column(0), starts, ends, *batch.columns[1:]]
    fields = [batch.schema.field(0), pa.field(WINDOW_COLUMNS[0], bound), pa.field(WINDOW_COLUMNS[1], bound),
              *list(batch.schema)[1:]]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def window_bounds(start: int, end: int, time_type: pa.DataType | None) -> tuple[Any, Any]:
    """A window's bounds as ``apply`` functions get them: timestamps for a timestamp column, else integers."""
    if time_type is not None and pa.types.is_timestamp(time_type):
        return pa.scalar(start, time_type).as_py(), pa.scalar(end, time_type).as_py()
    return start, end


def with_key_and_window(batch: pa.RecordBatch, key_name: str, key: Any, key_type: pa.DataType, start: int,
                        end: int, time_type: pa.DataType | None) -> pa.RecordBatch:
    """An ``apply`` result with the key and the window's bounds first, as ``agg`` emits them.

    Columns of the result with those names are replaced (they can only hold the same values).
    """
    rest = [name for name in batch.schema.names if name not in (key_name, *WINDOW_COLUMNS)]
    keyed = pa.RecordBatch.from_arrays([pa.array([key] * batch.num_rows, key_type),
                                        *(batch.column(name) for name in rest)],
                                       schema=pa.schema([pa.field(key_name, key_type),
                                                         *(batch.schema.field(name) for name in rest)]))
    return with_window(keyed, start, end, time_type or pa.int64())


def split_by_window(starts: np.ndarray, slide: int, max_scan: int = 32) -> list[tuple[int, np.ndarray]]:
    """``(window start, positions)`` per distinct start, ascending (``starts`` are multiples of ``slide``).

    A batch usually touches a few windows: then one comparison per candidate
    start is cheaper than sorting; a wide spread falls back to a sort.
    """
    lo, hi = int(starts.min()), int(starts.max())
    if (hi - lo) // slide < max_scan:
        found = ((s, np.flatnonzero(starts == s)) for s in range(lo, hi + 1, slide))
        return [(s, members) for s, members in found if len(members)]
    windows, inverse = np.unique(starts, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(windows) + 1))
    return [(int(w), order[bounds[i]:bounds[i + 1]]) for i, w in enumerate(windows.tolist())]


class RowsPane(_KeyedLogic):
    """A window's rows per key (``DictState``: key -> list of batches); ``fn`` runs over them when it fires.

    ``fn(key, window_start, window_end, rows) -> rows``: ``rows`` is a
    ``pyarrow.Table`` of the key's rows in the window, the bounds are
    timestamps for a timestamp time column (else integers), and the result (a
    RecordBatch / Table, a list of dicts or None) is emitted with the key and
    the window's bounds first, as ``agg`` emits them. In update mode each
    ``process`` re-runs ``fn`` over every row so far of the keys it touched.
    """

    def __init__(self, key: str, fn: Callable[..., Any], num_bins: int, window: tuple[int, int] = (0, 0),
                 time_type: pa.DataType | None = None) -> None:
        super().__init__(key, num_bins)
        self.fn = fn
        self.window = window
        self.time_type = time_type
        self.emit = "final"
        self._state = DictState(num_bins)

    @property
    def state(self) -> DictState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        uniques, codes = encode_keys(self._key_column(batch))
        bins = bins_of(uniques, self.num_bins).tolist()
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(uniques)))])
        touched = []
        grouped = batch.take(order)
        for i, key in enumerate(uniques.to_pylist()):
            rows = grouped.slice(bounds[i], bounds[i + 1] - bounds[i])
            self._state.put(key, bins[i], [*self._state.get(key, bins[i], []), rows])
            touched.append((key, bins[i]))
        if self.emit == "updates":
            return self._run(touched)
        return []

    def finish(self) -> list[pa.RecordBatch]:
        if self.emit != "final":
            return []
        return self._run([(k, b) for b in self._state.bins() for k in self._state._bins[b]])

    def _run(self, keys: list[tuple[Any, int]]) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        start, end = self.window
        for key, b in keys:
            rows = pa.Table.from_batches(self._state.get(key, b)).combine_chunks()
            result = self.fn(key, *window_bounds(start, end, self.time_type), rows)
            key_type = rows.schema.field(self.key).type
            out.extend(with_key_and_window(r, self.key, key, key_type, start, end, self.time_type)
                       for r in to_batches(result) if r.num_rows)
        return out


class FixedWindowLogic(_KeyedLogic):
    """Tumbling or sliding windows per key, by event time, with built-in aggregates or a user function.

    Args:
        key: the key column.
        time: the event-time column (integer or timestamp).
        spec: ``tumbling(...)`` or ``sliding(...)``.
        num_bins: the operator's bins.
        aggs: built-in aggregates (the fast path), or
        fn: ``fn(key, window_start, window_end, rows) -> rows`` per key and window (slow path).
        allowed_lateness: how long (ticks or timedelta) a window accepts records after it fired.
        time_type: the time column's type if known (needed for timedelta durations); a batch whose time
            column has another type is refused (``ColumnTypeError``).
        late_side_output: also emit late records, as they came, on side output ``"late"``.
        time_note: where ``time_type`` came from, for that error (``ColumnType.describe()``).
    """

    def __init__(self, key: str, time: str, spec: WindowSpec, num_bins: int, *,
                 aggs: Sequence[AggSpec] = (), fn: Callable[..., Any] | None = None,
                 allowed_lateness: Duration = 0, time_type: pa.DataType | None = None,
                 late_side_output: bool = False, time_note: str = "") -> None:
        super().__init__(key, num_bins)
        if spec.kind not in ("tumbling", "sliding"):
            raise ValueError(f"FixedWindowLogic runs tumbling and sliding windows, got {spec.kind!r}")
        if bool(aggs) == (fn is not None):
            raise ValueError("a window needs built-in aggregates or a function, not both")
        self.time, self.spec, self.aggs, self.fn = time, spec, tuple(aggs), fn
        self.late_records = 0
        self.late_side_output = late_side_output
        self._time_type, self._time_note = time_type, time_note
        self._lateness = allowed_lateness
        self._size, self._slide, lateness = self._resolve(time_type)
        self._state = WindowState(num_bins, self._new_pane, self._finalise, lateness)

    def _where(self) -> str:
        info = getattr(self, "info", None)
        return f"operator {info.operator!r}" if info is not None else f"window on {self.time!r}"

    def _resolve(self, time_type: pa.DataType | None) -> tuple[int, int, int]:
        """Size, slide and allowed lateness in ticks of a time column of ``time_type``."""
        where = self._where()
        size, slide, _ = self.spec.resolve(time_type, where, self.time)
        return size, slide, ticks(self._lateness, time_type,
                                  f"{where}: allowed_lateness={show_duration(self._lateness)}", self.time)

    @property
    def state(self) -> WindowState:
        return self._state

    def _new_pane(self, start: int, end: int) -> Any:
        if self.fn is not None:
            return RowsPane(self.key, self.fn, self.num_bins, (start, end), self._time_type)
        return AggregateLogic(self.key, self.aggs, self.num_bins)

    def _finalise(self, start: int, end: int, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        if self.fn is not None:
            return batches
        return [with_window(b, start, end, self._time_type or pa.int64()) for b in batches if b.num_rows]

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[Any]:
        out: list[Any] = self._state.take_pending()
        if batch.num_rows == 0:
            return out
        if self._time_type is None and self.time in batch.schema.names:
            self._time_type = batch.schema.field(self.time).type
            self._resolve(self._time_type)  # the durations were checked without the column's type
        check_arrival(batch, self.time, self._time_type, self._time_note, self._where())
        times = time_values(batch, self.time, f"window on {self.time!r}")
        per_row = self._size // self._slide
        last_start = times - np.mod(times, self._slide)
        starts = (last_start[None, :] - self._slide * np.arange(per_row)[:, None]).ravel()
        rows = np.tile(np.arange(batch.num_rows), per_row)
        bins = bins_of(batch.column(self.key), self.num_bins)[rows] if self._state.has_floors else None
        keep = ~self._state.expired(starts + self._size, bins)
        if not keep.all():
            late = np.bincount(rows[~keep], minlength=batch.num_rows) == per_row
            self.late_records += int(late.sum())
            if self.late_side_output and late.any():
                out.append(SideOutput(LATE, batch.filter(pa.array(late))))
            starts, rows = starts[keep], rows[keep]
        if len(starts) == 0:
            return out
        for start, members in split_by_window(starts, self._slide):
            end = start + self._size
            pane = self._state.pane(start, end)
            out.extend(self._finalise(start, end, list(pane.process(batch.take(rows[members])))))
        return out

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        return self._state.advance(watermark)

    def finish(self) -> list[pa.RecordBatch]:
        return self._state.fire_all()
