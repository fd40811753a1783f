"""rolling.py: aggregates over each key's last ``n`` rows, one result per row in event-time order (``KeyedStream.rolling``).

The SQL ``agg(x) OVER (PARTITION BY key ORDER BY on, tiebreak ROWS n - 1
PRECEDING)``: every input row comes out once, with the aggregates over it
and the ``n - 1`` rows of its key before it. Rows wait (part ``pending`` of
the state) until the watermark passes their time ``on``, so each key's rows
are taken in event-time order, equal times by the ``tiebreak`` columns, then
by arrival; at end of input every waiting row is taken. A row that comes at
or behind the watermark is taken at once, after the rows already taken
(counted in ``late_records``).

Per key the last ``n - 1`` rows taken are kept (a
:class:`~operators.keptrows.KeptRows`, oldest first: their key and the
aggregated columns). The rows due at a watermark are sorted by key and
order in one Arrow sort; each row's window is then a gather of ``n`` values
from the keys' histories and the due rows, aggregated with NumPy.

Functions (nulls skipped, as in SQL): ``count`` (rows, with ``None`` as the
column, else non-null values; int64), ``sum`` (int64 or float64), ``mean``
(float64), ``min`` / ``max`` (the column's type); null where the window has
no non-null value.

Example:
    >>> logic = RollingLogic("k", 2, "t", (), [("avg", "mean", "v")], 8)
    >>> _ = logic.process(pa.record_batch({"k": ["a", "a", "a"], "t": [3, 1, 2], "v": [30, 10, 20]}), 0)
    >>> [(r["t"], r["avg"]) for b in logic.on_watermark(3) for r in b.to_pylist()]
    [(1, 10.0), (2, 15.0), (3, 25.0)]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .eventtime import time_values
from .hashing import bins_of
from .keptrows import KeptRows
from .keyed import _KeyedLogic
from .keyindex import encode_keys
from .ordering import check_orderable

__all__ = ["RollingLogic", "ROLLING_FUNCS", "rolling_output_schema"]

ROLLING_FUNCS = ("count", "sum", "mean", "min", "max")
PENDING, ARRIVAL = "pending", "__arrival"
_FOREVER = 1 << 62

RollingAggregate = tuple[str, str, "str | None"]
"""``(output name, function, column)``; the column is ``None`` for ``count`` of rows."""


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def rolling_output_schema(schema: pa.Schema, aggregates: Sequence[RollingAggregate], where: str) -> pa.Schema:
    """The input's columns, then one per aggregate.

    Raises:
        ValueError: an unknown function or column, or an output name the input has already.
        TypeError: ``sum``, ``mean``, ``min`` or ``max`` of a column that is not an integer or a float.
    """
    fields = []
    for out, func, column in aggregates:
        if func not in ROLLING_FUNCS:
            raise ValueError(f"{where}: rolling() aggregate {out!r}: unknown function {func!r}; "
                             f"expected one of {ROLLING_FUNCS}")
        if column is None:
            if func != "count":
                raise ValueError(f"{where}: rolling() aggregate {out!r}: {func} needs a column")
            fields.append(pa.field(out, pa.int64()))
            continue
        if column not in schema.names:
            raise ValueError(f"{where}: rolling() aggregate {out!r}: unknown column {column!r}; the input has "
                             f"columns {schema.names}")
        t = schema.field(column).type
        if func != "count" and not _numeric(t):
            raise TypeError(f"{where}: rolling() aggregate {out!r}: {func} needs a column of integers or floats; "
                            f"column {column!r} has type {t}")
        if out in schema.names:
            raise ValueError(f"{where}: rolling() aggregate {out!r}: the input has a column of that name already")
        kind = {"count": pa.int64(), "mean": pa.float64()}.get(func)
        if func == "sum":
            kind = pa.float64() if pa.types.is_floating(t) else pa.int64()
        fields.append(pa.field(out, kind or t))
    return pa.schema(list(schema) + fields)


class RollingLogic(_KeyedLogic):
    """Per key and row, in event-time order, aggregates over the key's last ``n`` rows (the row's own included).

    Args:
        key: the key column.
        n: rows per window, at least 1.
        on: the event-time column that orders each key's rows.
        tiebreak: columns that order rows of equal time (then arrival).
        aggregates: ``(output name, function, column)`` each.
        num_bins: the operator's bins.
    """

    def __init__(self, key: str, n: int, on: str, tiebreak: Sequence[str], aggregates: Sequence[RollingAggregate],
                 num_bins: int) -> None:
        super().__init__(key, num_bins)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"rolling() needs n >= 1 rows, got {n!r}")
        self.n, self.on, self.tiebreak = n, on, tuple(tiebreak)
        self.aggregates: list[RollingAggregate] = [(str(o), str(f), c) for o, f, c in aggregates]
        self.columns = list(dict.fromkeys(c for _, _, c in self.aggregates if c is not None))
        self.watermark = -(1 << 63)
        self.late_records = 0
        self._checked: pa.Schema | None = None
        self._state = KeptRows(self.num_bins, max(n - 1, 1), key, "chiray.Rolling/1", extra=(PENDING,),
                               sequence=ARRIVAL)

    @property
    def state(self) -> KeptRows:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        if self._checked is not batch.schema:  # what the build could not check (a stream of unknown schema)
            check_orderable(batch.schema, self.tiebreak, self.where("rolling"), "rolling")
            rolling_output_schema(batch.schema, self.aggregates, self.where("rolling"))
            self._checked = batch.schema
        if batch.num_rows == 0:
            return []
        times = time_values(batch, self.on, self.where("rolling"))
        rows = pa.Table.from_batches([batch]).append_column(ARRIVAL, pa.array(self._state.numbers(batch.num_rows)))
        late = times <= self.watermark
        if late.any():
            self.late_records += int(late.sum())
            waiting = rows.filter(pa.array(~late))
            self._wait(waiting, times[~late])
            return self._roll(rows.filter(pa.array(late)))
        self._wait(rows, times)
        return []

    def _wait(self, rows: pa.Table, times: np.ndarray) -> None:
        if rows.num_rows:
            self._state.parts[PENDING].add(rows, bins_of(rows.column(self.key), self.num_bins), times)

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        self.watermark = max(self.watermark, watermark)
        return self._take_due(self.watermark)

    def finish(self) -> list[pa.RecordBatch]:
        return self._take_due(_FOREVER)

    def _take_due(self, time: int) -> list[pa.RecordBatch]:
        pending = self._state.parts[PENDING]
        due = pending.due_by(time)
        if not len(due):
            return []
        rows = pending.take(due)
        pending.drop(due)
        out = self._roll(rows)
        self._state.compact()
        return out

    def _roll(self, rows: pa.Table) -> list[pa.RecordBatch]:
        """Aggregate each row's window; keep each key's last ``n - 1`` rows."""
        state, n = self._state, self.n
        uniques, codes = encode_keys(rows.column(self.key))
        slots = state.slots(uniques)
        ordering = pa.table([pa.array(slots[codes]), pa.array(time_values(rows, self.on, self.where("rolling"))),
                             *(rows.column(c) for c in self.tiebreak), rows.column(ARRIVAL)],
                            names=["__slot", "__t", *(f"__tie{i}" for i in range(len(self.tiebreak))), ARRIVAL])
        order = pc.sort_indices(ordering, sort_keys=[(c, "ascending") for c in ordering.column_names])
        rows = rows.take(order).drop_columns([ARRIVAL])
        row_slot = slots[codes][order.to_numpy()]
        touched = np.unique(row_slot)
        positions, hist_slot, _ = state.kept(touched) if n > 1 else (np.zeros(0, np.int64),) * 3
        history = state.rows(positions) if len(positions) else None
        kept_columns = [self.key, *self.columns]
        seq_slot = np.concatenate([hist_slot, row_slot])
        seq = np.argsort(seq_slot, kind="stable")  # per key: its history (oldest first), then its due rows
        slot_seq = seq_slot[seq]
        first = np.r_[True, slot_seq[1:] != slot_seq[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(len(seq)), 0))
        is_row = seq >= len(positions)
        window = np.flatnonzero(is_row)[:, None] - np.arange(n)[None, :]  # positions in seq of each row's window
        inside = window >= start[is_row][:, None]
        window = np.maximum(window, 0)
        results = []
        for out, func, column in self.aggregates:
            if column is None:
                results.append(pa.array(inside.sum(axis=1).astype(np.int64)))
                continue
            values, valid = _values(history, rows, column, seq)
            results.append(_aggregate(func, values[window], valid[window] & inside, rows.schema.field(column).type))
        out_rows = rows
        for (name, _, _), result in zip(self.aggregates, results):
            out_rows = out_rows.append_column(name, result)
        if n > 1:
            self._keep_last(touched, slot_seq, first, seq, positions, rows.select(kept_columns))
        return out_rows.combine_chunks().to_batches()

    def _keep_last(self, touched: np.ndarray, slot_seq: np.ndarray, first: np.ndarray, seq: np.ndarray,
                   positions: np.ndarray, rows: pa.Table) -> None:
        """Each key's history becomes its last ``n - 1`` rows of the sequence (history, then rows taken)."""
        k = self.n - 1
        index = np.arange(len(seq))
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], len(seq))
        group = np.cumsum(first) - 1
        begin = np.maximum(starts, ends - k)[group]
        tail = index >= begin
        rank = (index - begin)[tail]
        taken = seq[tail]
        position = np.full(len(taken), -1, dtype=np.int64)
        old = taken < len(positions)
        position[old] = positions[taken[old]]
        fresh = rows.take(pa.array(taken[~old] - len(positions)))
        self._state.assign(touched, slot_seq[tail], rank, position, fresh)


def _values(history: pa.Table | None, rows: pa.Table, column: str, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``column`` of the history rows then the rows taken, in ``seq`` order: values (nulls as 0) and validity."""
    parts = [rows.column(column)] if history is None else [history.column(column), rows.column(column)]
    joined = pa.chunked_array([c for p in parts for c in p.chunks], rows.schema.field(column).type).combine_chunks()
    valid = joined.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_integer(joined.type) or pa.types.is_floating(joined.type):
        values = np.asarray(joined.fill_null(0).to_numpy(zero_copy_only=False))
    else:  # count of a column of another type: only validity matters
        values = np.zeros(len(joined), dtype=np.int64)
    return values[seq], valid[seq]


def _aggregate(func: str, values: np.ndarray, valid: np.ndarray, t: pa.DataType) -> pa.Array:
    """One aggregate per row of the ``(rows, n)`` window matrix ``values`` where ``valid``."""
    count = valid.sum(axis=1)
    if func == "count":
        return pa.array(count.astype(np.int64))
    none = count == 0
    if func in ("sum", "mean"):
        wide = np.float64 if pa.types.is_floating(t) or func == "mean" else np.int64
        total = np.where(valid, values, 0).astype(wide).sum(axis=1)
        result: Any = total / np.maximum(count, 1) if func == "mean" else total
        return pa.array(result, mask=none)
    fill = _extreme(values.dtype, func)
    picked = np.where(valid, values, fill)
    result = picked.min(axis=1) if func == "min" else picked.max(axis=1)
    return pa.array(result, mask=none).cast(t)


def _extreme(dtype: np.dtype, func: str) -> Any:
    """The value that never wins a ``func`` (``min``: the greatest)."""
    if dtype.kind == "f":
        return np.inf if func == "min" else -np.inf
    info = np.iinfo(dtype)
    return info.max if func == "min" else info.min
