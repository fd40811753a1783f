"""joins.py: keyed two-input operators: co-process with timers, incremental equi-join, windowed equi-join.

Both inputs of a two-input keyed operator are routed by the same bin table
(one keyed operator, two hash edges with its bins), so a key's rows of both
sides meet in one instance and a bin moves both sides together. State is
per key, in bins:

* :class:`JoinLogic` (incremental, unbounded): per key the rows of each side
  seen so far (a :class:`~operators.dictstate.DictState`); each new batch is
  joined, with one Arrow hash join, against the stored rows of the other
  side for its keys, then stored.
* :class:`WindowJoinLogic`: per window a :class:`JoinPane` (per key, the rows
  of each side in that window) in a :class:`~operators.windowstate.WindowState`;
  when the watermark passes the window's end, one Arrow join over the pane.
* :class:`CoProcessLogic`: ``fn(key, rows, ctx, input)`` with per-key value
  and event-time timers (:class:`~operators.timers.TimerState`).

Output of the joins: the key (named as the left key), the left columns, then
the right columns (a right name that collides gets ``_right``); window joins
add ``window_start`` and ``window_end`` after the key.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from .batch import merge_runs, to_batches
from .callbacks import CoProcessFunction, OnTimerFunction
from .columns import check_arrival
from .eventtime import Duration, show_duration, ticks, time_values
from .hashing import bins_of, check_num_bins
from .keygroups import group_by_key
from .logic import OperatorLogic, SideOutput
from .dictstate import DictState
from .timers import KeyContext, TimerState
from .ttl import EXPIRED, StateTTL
from .valuettl import ExpiringValues, ValueExpiry
from .windows import WindowSpec, split_by_window, with_window
from .windowstate import WindowState

__all__ = ["JoinLogic", "WindowJoinLogic", "CoProcessLogic", "JoinPane", "join_tables", "check_key_types", "key_groups",
           "LATE_PORTS"]

LATE_PORTS = ("late_left", "late_right")
"""The side outputs of a window join's late rows, by input."""


def key_groups(batch: pa.RecordBatch, key: str, num_bins: int) -> list[tuple[Any, int, pa.RecordBatch]]:
    """``(key, bin, rows)`` per distinct key of ``batch``, in order of first appearance."""
    return list(group_by_key(batch, batch.column(key), num_bins).slices())


def join_tables(left: pa.Table, right: pa.Table, left_key: str, right_key: str) -> pa.Table:
    """Inner equi-join: the key (named ``left_key``), left columns, right columns (``_right`` on clashes)."""
    right = right.rename_columns([right_key if n == right_key else (f"{n}_right" if n in left.column_names else n)
                                  for n in right.column_names])
    joined = left.join(right, keys=left_key, right_keys=right_key, join_type="inner", coalesce_keys=True,
                       use_threads=False)
    names = [left_key] + [n for n in left.column_names if n != left_key]
    names += [n for n in right.column_names if n != right_key]
    return joined.select(names)


class _TwoInputKeyed(OperatorLogic):
    """Key columns per input and the bins."""

    def __init__(self, keys: tuple[str, str], num_bins: int) -> None:
        self.keys = keys
        self.num_bins = check_num_bins(num_bins)
        self._key_types: list[pa.DataType | None] = [None, None]

    def _key(self, batch: pa.RecordBatch, side: int) -> str:
        """The key column of input ``side``, checked: present, and of the other input's key type."""
        key = self.keys[side]
        index = batch.schema.get_field_index(key)
        if index < 0:
            raise ValueError(f"key column {key!r} of input {side} is not in its columns {batch.schema.names}")
        if self._key_types[side] is None:
            self._key_types[side] = batch.schema.field(index).type
            check_key_types(self.keys, self._key_types)
        return key


def check_key_types(keys: tuple[str, str], types: Sequence[pa.DataType | None], where: str = "") -> None:
    """Refuse two key columns of different types: their rows would never meet.

    Raises:
        TypeError: naming both keys and types.
    """
    left, right = types
    if left is None or right is None or left == right:
        return
    raise TypeError(
        f"{where}the key columns of the two inputs have different types: {keys[0]!r} of the left input is "
        f"{left}, {keys[1]!r} of the right input is {right}; equal keys of different types never meet, so "
        f"cast one of them (e.g. a map with pc.cast before connect()) to the other's type")


def _join_touch(sides: tuple) -> int | None:
    return sides[2] if len(sides) == 3 else None


def _join_sides(sides: tuple) -> tuple:
    return sides[:2]


def _join_retouch(sides: tuple, touch: int) -> tuple:
    return (*sides[:2], touch)


class JoinLogic(ExpiringValues, _TwoInputKeyed):
    """Incremental (unbounded) inner equi-join: every pair of rows with equal keys, emitted once.

    ``ttl``: a key whose rows (of either side) were not added for that long loses them
    (:mod:`operators.valuettl`; in event time its rows' largest ``ttl_on``, a column of both inputs): a row of
    it that comes later joins only the rows that came after. The side output ``"expired"`` gets the keys.

    Example:
        >>> j = JoinLogic(("k", "id"), 8)
        >>> j.process(pa.record_batch({"k": ["a"], "x": [1]}), 0)
        []
        >>> j.process(pa.record_batch({"id": ["a", "b"], "y": [2, 3]}), 1)[0].to_pylist()
        [{'k': 'a', 'x': 1, 'y': 2}]
    """

    def __init__(self, keys: tuple[str, str], num_bins: int, ttl: StateTTL | None = None) -> None:
        super().__init__(keys, num_bins)
        # key -> ([left batches], [right batches][, last touch]); every change puts a new tuple: checkpoints
        # write changed keys
        self._state = DictState(self.num_bins, track_changes=True)
        self._schemas: list[pa.Schema | None] = [None, None]
        self._ttl_verb = "join"
        self._ttl = (ValueExpiry(ttl, "join", self._state, _join_touch, _join_sides, _join_retouch)
                     if ttl is not None else None)
        self._key_type: pa.DataType | None = None

    @property
    def state(self) -> DictState:
        return self._state

    def _expired_output(self, gone: list[tuple[Any, Any]]) -> list[Any]:
        keys = pa.array([k for k, _ in gone], type=self._key_type)
        return [SideOutput(EXPIRED, pa.record_batch({self.keys[0]: keys}))]

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[Any]:
        key = self._key(batch, input_index)
        self._schemas[input_index] = batch.schema
        self._key_type = batch.schema.field(key).type
        out = self._expire()
        if batch.num_rows == 0:
            return out
        other = 1 - input_index
        matches: list[pa.RecordBatch] = []
        for k, b, rows in key_groups(batch, key, self.num_bins):
            sides: tuple = self._state.get(k, b) or ([], [])
            matches.extend(sides[other])
            new = list(sides[:2])
            new[input_index] = sides[input_index] + [rows]
            self._state.put(k, b, self._touched(tuple(new), _join_touch(sides), rows))
        if not matches:
            return out
        mine = pa.Table.from_batches([batch])
        theirs = pa.Table.from_batches(matches).combine_chunks()
        left, right = (mine, theirs) if input_index == 0 else (theirs, mine)
        return out + join_tables(left, right, *self.keys).combine_chunks().to_batches()

    def _touched(self, sides: tuple, before: int | None, rows: pa.RecordBatch) -> tuple:
        """The key's sides with its touch now (in event time the largest of its rows' times so far)."""
        if self._ttl is None:
            return sides
        touch = int(self._ttl.expiry.touches(rows, np.zeros(rows.num_rows, dtype=np.int64), 1)[0])
        return (*sides, touch if before is None else max(touch, before))


class JoinPane(_TwoInputKeyed):
    """One window of a window join: per key, the rows of each side; ``finish()`` joins them all at once."""

    def __init__(self, keys: tuple[str, str], num_bins: int) -> None:
        super().__init__(keys, num_bins)
        self.emit = "final"
        self._state = DictState(self.num_bins)

    @property
    def state(self) -> DictState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        """Keep the rows; once the window fired (``emit="updates"``, within the allowed lateness), a late
        row also joins at once with the other side's rows of its key, and that is emitted."""
        out: list[pa.RecordBatch] = []
        for k, b, rows in key_groups(batch, self._key(batch, input_index), self.num_bins):
            sides = list(self._state.get(k, b) or ([], []))
            other = sides[1 - input_index]
            if self.emit == "updates" and other:
                pair = [pa.Table.from_batches([rows]), pa.Table.from_batches(other).combine_chunks()]
                left, right = pair if input_index == 0 else pair[::-1]
                out.extend(join_tables(left, right, *self.keys).combine_chunks().to_batches())
            sides[input_index] = sides[input_index] + [rows]
            self._state.put(k, b, tuple(sides))
        return [b for b in out if b.num_rows]

    def finish(self) -> list[pa.RecordBatch]:
        left = [r for _, (ls, _) in self._state.items() for r in ls]
        right = [r for _, (_, rs) in self._state.items() for r in rs]
        if not left or not right:
            return []
        joined = join_tables(pa.Table.from_batches(left).combine_chunks(),
                             pa.Table.from_batches(right).combine_chunks(), *self.keys)
        return joined.combine_chunks().to_batches()


class WindowJoinLogic(_TwoInputKeyed):
    """Inner equi-join of rows of both inputs that fall in the same tumbling or sliding window.

    Args:
        keys: the key column of each input.
        times: the event-time column of each input.
        spec: ``tumbling(...)`` or ``sliding(...)``.
        num_bins: the operator's bins.
        time_type: the time columns' type, if known (for timedelta durations).
        allowed_lateness: how long (ticks or timedelta) a window still joins rows after it fired: a late
            row is joined at once with the other side's rows of its key in that window (an update).
        late_side_output: also emit the rows that came after their every window expired, as they came,
            on side output ``"late_left"`` or ``"late_right"`` (by input).
        time_note: where ``time_type`` came from, for the error about a time column of another type.
    """

    def __init__(self, keys: tuple[str, str], times: tuple[str, str], spec: WindowSpec, num_bins: int,
                 time_type: pa.DataType | None = None, allowed_lateness: Duration = 0,
                 late_side_output: bool = False, time_note: str = "") -> None:
        super().__init__(keys, num_bins)
        if spec.kind not in ("tumbling", "sliding"):
            raise ValueError(f"a window join takes tumbling or sliding windows, got {spec.kind!r}")
        self.times, self.spec, self._lateness = times, spec, allowed_lateness
        self._size, self._slide, lateness = self._resolve(time_type)
        self._time_type, self._time_note = time_type, time_note
        self.late_records = 0
        self.late_side_output = late_side_output
        self._state = WindowState(self.num_bins, lambda s, e: JoinPane(self.keys, self.num_bins), self._finalise,
                                  lateness)

    def _where(self) -> str:
        info = getattr(self, "info", None)
        return f"operator {info.operator!r}" if info is not None else "window join"

    def _resolve(self, time_type: pa.DataType | None) -> tuple[int, int, int]:
        """Size, slide and allowed lateness in ticks of a time column of ``time_type``."""
        where = self._where()
        size, slide, _ = self.spec.resolve(time_type, where, self.times[0])
        return size, slide, ticks(self._lateness, time_type,
                                  f"{where}: allowed_lateness={show_duration(self._lateness)}", self.times[0])

    @property
    def state(self) -> WindowState:
        return self._state

    def _finalise(self, start: int, end: int, batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
        return [with_window(b, start, end, self._window_type(b)) for b in batches if b.num_rows]

    def _window_type(self, joined: pa.RecordBatch) -> pa.DataType:
        """The type of ``window_start`` / ``window_end``: the inputs' time type. An instance that a rescale
        started fires the windows it was handed before it reads a batch of its own: the joined rows carry
        the time columns, so it learns the type from them (else its windows would be int64 where the old
        owners' are timestamps)."""
        if self._time_type is None:
            known = [joined.schema.field(t).type for t in self.times if t in joined.schema.names]
            if known:
                self._time_type = known[0]
        return self._time_type or pa.int64()

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        out = self._state.take_pending()
        if batch.num_rows == 0:
            return out
        self._key(batch, input_index)
        if self._time_type is None and self.times[input_index] in batch.schema.names:
            self._time_type = batch.schema.field(self.times[input_index]).type
            self._resolve(self._time_type)  # the durations were checked without the column's type
        check_arrival(batch, self.times[input_index], self._time_type, self._time_note, self._where())
        times = time_values(batch, self.times[input_index], "window join")
        per_row = self._size // self._slide
        starts = ((times - np.mod(times, self._slide))[None, :] - self._slide * np.arange(per_row)[:, None]).ravel()
        rows = np.tile(np.arange(batch.num_rows), per_row)
        bins = (bins_of(batch.column(self.keys[input_index]), self.num_bins)[rows]
                if self._state.has_floors else None)
        keep = ~self._state.expired(starts + self._size, bins)
        late = np.bincount(rows[~keep], minlength=batch.num_rows) == per_row
        self.late_records += int(late.sum())
        if self.late_side_output and late.any():
            out.append(SideOutput(LATE_PORTS[input_index], batch.filter(pa.array(late))))
        starts, rows = starts[keep], rows[keep]
        for start, members in (split_by_window(starts, self._slide) if len(starts) else []):
            end = start + self._size
            pane = self._state.pane(start, end)
            out.extend(self._finalise(start, end, pane.process(batch.take(rows[members]), input_index)))
        return out

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        return self._state.advance(watermark)

    def finish(self) -> list[pa.RecordBatch]:
        return self._state.fire_all()


class CoProcessLogic(_TwoInputKeyed):
    """Keyed co-process: ``fn(key, rows, ctx, input)`` per key, batch and input; ``ctx`` as for ``process``.

    With ``on_timer``, ``ctx.register(time)`` sets event-time timers and
    ``on_timer(key, time, ctx)`` runs once per (key, time), in time order.
    """

    def __init__(self, keys: tuple[str, str], fn: CoProcessFunction, num_bins: int,
                 on_timer: OnTimerFunction | None = None, output_schema: pa.Schema | None = None) -> None:
        super().__init__(keys, num_bins)
        self.fn, self.on_timer, self.output_schema = fn, on_timer, output_schema
        self._state = TimerState(self.num_bins)

    @property
    def state(self) -> TimerState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        out = self._fire()
        for k, b, rows in key_groups(batch, self._key(batch, input_index), self.num_bins):
            out += self._batches(self.fn(k, rows, KeyContext(self._state, k, b), input_index))
        return merge_runs(out + self._fire())

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        self._state.watermark = max(self._state.watermark, watermark)
        return merge_runs(self._fire())

    def finish(self) -> list[pa.RecordBatch]:
        return self.on_watermark(1 << 62)

    def _fire(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        while self.on_timer is not None and (due := self._state.pop_due()) is not None:
            k, b, time = due
            out += self._batches(self.on_timer(k, time, KeyContext(self._state, k, b)))
        return out

    def _batches(self, result: Any) -> list[pa.RecordBatch]:
        batches = [b for b in to_batches(result, self.output_schema) if b.num_rows]
        if self.output_schema is not None:
            batches = [b if b.schema.equals(self.output_schema) else b.select(self.output_schema.names)
                       .cast(self.output_schema) for b in batches]
        return batches


