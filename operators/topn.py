"""topn.py: the top ``n`` rows per window of a window's results (``Stream.top``).

Rows come from an event-time window (columns ``window_start`` and
``window_end``); the operator is keyed by ``window_end``, so each window's
rows meet in one instance, and it keeps, per window, only the ``n`` best
rows seen so far (bounded memory). A window's rows are emitted, best first
with a ``rank`` column (1 for the best), when the watermark reaches the
window's end, which is when the window upstream fired: the rows of every
upstream instance have arrived by then. Ties keep arrival order; nulls rank
last.

Example:
    >>> logic = TopLogic(2, "v", 8)
    >>> rows = pa.record_batch({"window_start": [0, 0, 0], "window_end": [10, 10, 10], "v": [5, 9, 7]})
    >>> _ = logic.process(rows, 0)
    >>> [(r["v"], r["rank"]) for b in logic.on_watermark(9) for r in b.to_pylist()]
    [(9, 1), (7, 2)]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .eventtime import time_values
from .hashing import bins_of
from .joins import key_groups
from .keyed import _KeyedLogic
from .dictstate import DictState
from .windows import WINDOW_COLUMNS
from .windowstate import WindowState

__all__ = ["TopLogic", "RANK", "top_output_schema"]

RANK = "rank"
"""The column ``top`` adds: 1 for a window's best row."""


def top_output_schema(schema: pa.Schema, by: str, where: str) -> pa.Schema:
    """The rows as they come, then ``rank``.

    Raises:
        ValueError: the window columns or ``by`` are missing, or a ``rank`` column is there already.
    """
    missing = [c for c in (*WINDOW_COLUMNS, by) if c not in schema.names]
    if missing:
        raise ValueError(f"{where}: top() ranks the rows of each window by {by!r}; the input lacks "
                         f"{missing} (it has columns {schema.names}); put it after a window's agg() or apply()")
    if RANK in schema.names:
        raise ValueError(f"{where}: the input already has a column {RANK!r}, which top() adds")
    if pa.types.is_nested(schema.field(by).type):
        raise TypeError(f"{where}: top() needs a column of orderable values to rank by; "
                        f"column {by!r} has type {schema.field(by).type}")
    return schema.append(pa.field(RANK, pa.int64()))


class _TopPane(_KeyedLogic):
    """One window's best rows so far: ``DictState`` key (the window's end) -> a table of at most ``n`` rows."""

    def __init__(self, n: int, by: str, descending: bool, num_bins: int) -> None:
        super().__init__(WINDOW_COLUMNS[1], num_bins)
        self.n, self.by, self.descending = n, by, descending
        self.emit = "final"
        self._state = DictState(num_bins)

    @property
    def state(self) -> DictState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        touched = []
        for key, b, group in key_groups(batch, self.key, self.num_bins):
            rows = pa.Table.from_batches([group])
            kept = self._state.get(key, b)
            if kept is not None:
                rows = pa.concat_tables([kept, rows.cast(kept.schema)])  # earlier rows first: ties keep them
            self._state.put(key, b, self._best(rows))
            touched.append((key, b))
        return self._emit(touched) if self.emit == "updates" else []

    def finish(self) -> list[pa.RecordBatch]:
        if self.emit != "final":
            return []
        # a kept table's own key column gives the key's bin (its Python value may hash as another type)
        return self._emit([(key, int(bins_of(rows.column(self.key).chunk(0), self.num_bins)[0]))
                           for key, rows in self._state.items()])

    def _best(self, rows: pa.Table) -> pa.Table:
        valid = pc.is_valid(rows.column(self.by))
        ranked = rows.filter(valid)
        order = pc.sort_indices(ranked, sort_keys=[(self.by, "descending" if self.descending else "ascending")])
        best = ranked.take(order[: self.n])
        if best.num_rows < self.n:  # nulls rank last, in arrival order
            best = pa.concat_tables([best, rows.filter(pc.invert(valid)).slice(0, self.n - best.num_rows)])
        return best.combine_chunks()

    def _emit(self, keys: list[tuple[Any, int]]) -> list[pa.RecordBatch]:
        out = []
        for key, b in keys:
            best = self._state.get(key, b)
            ranks = pa.array(np.arange(1, best.num_rows + 1, dtype=np.int64))
            out.extend(best.append_column(RANK, ranks).to_batches())
        return out


class TopLogic(_KeyedLogic):
    """The ``n`` best rows by ``by`` per window (descending: the greatest first), as the watermark passes it.

    Args:
        n: rows per window, at least 1.
        by: the column to rank by.
        num_bins: the operator's bins.
        descending: the greatest values first (else the least).
    """

    def __init__(self, n: int, by: str, num_bins: int, *, descending: bool = True) -> None:
        super().__init__(WINDOW_COLUMNS[1], num_bins)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"top() needs n >= 1 rows per window, got {n!r}")
        self.n, self.by, self.descending = n, by, descending
        self.late_records = 0
        self._state = WindowState(num_bins, lambda s, e: _TopPane(n, by, descending, num_bins),
                                  lambda s, e, batches: batches)

    @property
    def state(self) -> WindowState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = self._state.take_pending()
        if batch.num_rows == 0:
            return out
        starts = time_values(batch, WINDOW_COLUMNS[0], "top")
        ends = time_values(batch, WINDOW_COLUMNS[1], "top")
        late = self._state.expired(ends, bins_of(batch.column(self.key), self.num_bins)
                                   if self._state.has_floors else None)
        if late.any():  # a window that was emitted already (rows updated after the window fired upstream)
            self.late_records += int(late.sum())
            keep = np.flatnonzero(~late)
            batch, starts, ends = batch.take(pa.array(keep)), starts[keep], ends[keep]
        windows, first = np.unique(ends, return_index=True)
        for end, start in zip(windows.tolist(), starts[first].tolist()):
            rows = batch.filter(pa.array(ends == end))
            out.extend(self._state.pane(start, end).process(rows))
        return out

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        return self._state.advance(watermark)

    def finish(self) -> list[pa.RecordBatch]:
        return self._state.fire_all()
