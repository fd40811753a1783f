"""keyedtop.py: the ``n`` best rows of each key over a whole stream (``KeyedStream.top``), emitted once.

Per key the operator keeps at most ``n`` rows (a :class:`~operators.keptrows.KeptRows`):
each batch's rows are ranked with the kept rows of their keys in one Arrow
sort (by the ``by`` columns, then arrival: ties keep the earlier row; nulls
rank last), and the ``n`` first of each key stay. A row that cannot enter a
full key (worse on the first ``by`` column than the key's ``n``-th row) is
dropped before the sort, so once the keys are full a batch costs about a
pass over its own rows.

Each key's rows are emitted once, final, best first with a ``rank`` column
(1 for the best), never retracted: at end of input, or, with ``idle``, once
the watermark passes the key's latest event time (column ``on``) by
``idle``: the key is then let go, and a row of it that comes later starts
it anew.

Example:
    >>> logic = KeyedTopLogic("k", 2, ("v",), (True,), 8)
    >>> _ = logic.process(pa.record_batch({"k": ["a", "b", "a", "a"], "v": [5, 1, 9, 7]}), 0)
    >>> [(r["k"], r["v"], r["rank"]) for b in logic.finish() for r in b.to_pylist()]
    [('a', 9, 1), ('a', 7, 2), ('b', 1, 1)]
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .eventtime import ticks, time_values
from .keptrows import KeptRows
from .keyed import _KeyedLogic
from .keyindex import encode_keys
from .ordering import check_orderable, sort_keys
from .topn import RANK

__all__ = ["KeyedTopLogic", "keyed_top_schema"]

_MIN_TIME = np.iinfo(np.int64).min


def keyed_top_schema(schema: pa.Schema, by: Sequence[str], where: str) -> pa.Schema:
    """The rows as they come, then ``rank``.

    Raises:
        ValueError: a ``by`` column is missing, or the input has a ``rank`` column already.
        TypeError: a ``by`` column is nested.
    """
    check_orderable(schema, by, where, "top")
    if RANK in schema.names:
        raise ValueError(f"{where}: the input already has a column {RANK!r}, which top() adds; rename it first")
    return schema.append(pa.field(RANK, pa.int64()))


def _prunable(t: pa.DataType) -> bool:
    """Whether rows may be dropped before the sort by comparing this type's values as int64 (no NaN)."""
    if pa.types.is_integer(t):
        return not pa.types.is_uint64(t)
    return pa.types.is_temporal(t) and t.bit_width in (32, 64)


class KeyedTopLogic(_KeyedLogic):
    """The ``n`` best rows per key by ``by``, emitted once per key: at end of input, or ``idle`` after its last row.

    Args:
        key: the key column.
        n: rows per key, at least 1.
        by: the columns to rank by, the first deciding first.
        descending: per column of ``by``, whether the greatest value is best.
        num_bins: the operator's bins.
        idle: with ``on``: a key is emitted (and let go) once the watermark passes its latest ``on`` by this
            (ticks, or a ``timedelta`` on a timestamp column).
        on: the event-time column ``idle`` counts from.
    """

    def __init__(self, key: str, n: int, by: Sequence[str], descending: Sequence[bool], num_bins: int,
                 idle: Any = None, on: str | None = None) -> None:
        super().__init__(key, num_bins)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"top() needs n >= 1 rows per key, got {n!r}")
        self.n, self.by, self.descending = n, tuple(by), tuple(descending)
        self.idle, self.on = idle, on
        self._idle_ticks: int | None = None
        self._checked: pa.Schema | None = None
        self._state = KeptRows(self.num_bins, n, key, "chiray.KeyedTop/1")

    @property
    def state(self) -> KeptRows:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        if self._checked is not batch.schema:  # what the build could not check (a stream of unknown schema)
            keyed_top_schema(batch.schema, self.by, self.where("top"))
            self._checked = batch.schema
        if batch.num_rows == 0:
            return []
        uniques, codes = encode_keys(self._key_column(batch))
        slots = self._state.slots(uniques)
        if self.on is not None:
            if self._idle_ticks is None:
                self._idle_ticks = ticks(self.idle, batch.schema.field(self.on).type, self.where("top") + ": idle",
                                         self.on)
            fresh = self._state.counts(slots) == 0
            self._state.mark[slots[fresh]] = _MIN_TIME
            np.maximum.at(self._state.mark, slots[codes], time_values(batch, self.on, self.where("top")))
        rows = pa.Table.from_batches([batch])
        chosen = self._candidates(rows, slots, codes)
        if chosen is not None:
            rows, codes = rows.take(pa.array(chosen)), codes[chosen]
        if rows.num_rows:
            self._rank(rows, slots, codes)
        return []

    def _candidates(self, rows: pa.Table, slots: np.ndarray, codes: np.ndarray) -> np.ndarray | None:
        """The rows that may enter their key's best ``n`` (``None``: all): not worse on the first ``by``
        column than a full key's ``n``-th row (ties may enter: arrival decides them)."""
        column = rows.column(self.by[0])
        full = self._state.counts(slots) == self.n
        if not full.any() or not _prunable(column.type):
            return None
        nth = self._state.rows(self._state.at_rank(slots[full], self.n - 1)).column(self.by[0])
        floor = np.zeros(len(slots), dtype=np.int64)
        floor_null = np.zeros(len(slots), dtype=bool)
        floor[full] = _as_int64(nth)
        floor_null[full] = nth.is_null().to_numpy(zero_copy_only=False)
        values, valid = _as_int64(column), column.is_valid().to_numpy(zero_copy_only=False)
        row_floor = floor[codes]
        better = values >= row_floor if self.descending[0] else values <= row_floor
        keep = ~full[codes] | (valid & (floor_null[codes] | better))
        return None if keep.all() else np.flatnonzero(keep)

    def _rank(self, rows: pa.Table, slots: np.ndarray, codes: np.ndarray) -> None:
        """Rank the rows with the kept rows of their keys; keep the ``n`` best of each."""
        state = self._state
        touched = np.unique(slots[codes])
        positions, slot, rank = state.kept(touched)
        kept = state.rows(positions) if len(positions) else None
        if kept is not None and not rows.schema.equals(kept.schema):
            rows = rows.select(kept.schema.names).cast(kept.schema)
        owner = np.concatenate([slot, slots[codes]])
        tie = np.concatenate([rank - self.n, np.arange(rows.num_rows, dtype=np.int64)])
        columns = [pa.chunked_array([*(kept.column(c).chunks if kept is not None else []), *rows.column(c).chunks],
                                    rows.schema.field(c).type) for c in self.by]
        ranking = pa.table([pa.array(owner), *columns, pa.array(tie)],
                           names=["__slot", *(f"__by{i}" for i in range(len(self.by))), "__tie"])
        keys = sort_keys(ranking.column_names, (False, *self.descending, False))
        order = pc.sort_indices(ranking, sort_keys=keys).to_numpy()
        owners = owner[order]
        first = np.r_[True, owners[1:] != owners[:-1]]
        place = np.arange(len(order)) - np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        win = place < self.n
        chosen, place = order[win], place[win]
        old = len(positions)
        position = np.full(len(chosen), -1, dtype=np.int64)
        position[chosen < old] = positions[chosen[chosen < old]]
        fresh = rows.take(pa.array(chosen[chosen >= old] - old))
        state.assign(touched, owners[win], place, position, fresh)
        # The rows pushed out are tombstones: once they outnumber the kept ones, renumber (amortised O(1) a
        # row). Without it a stream whose keys never end kept every row that ever entered a top, and each
        # batch's appends and gathers grew with them.
        state.compact()

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        if self.on is None or self._idle_ticks is None:
            return []
        slots = self._state.live_slots()
        due = slots[self._state.mark[slots] <= watermark - self._idle_ticks]
        return self._emit(due, forget=True)

    def finish(self) -> list[pa.RecordBatch]:
        return self._emit(self._state.live_slots(), forget=False)

    def _emit(self, slots: np.ndarray, forget: bool) -> list[pa.RecordBatch]:
        if not len(slots):
            return []
        positions, _, rank = self._state.kept(slots)
        out = []
        if len(positions):
            rows = self._state.rows(positions).append_column(RANK, pa.array(rank + 1))
            out = rows.combine_chunks().to_batches(max_chunksize=1 << 16)
        if forget:
            self._state.forget(slots)
        return out


def _as_int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Integer or temporal values as int64 (nulls as 0)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_temporal(column.type):
        column = column.view(pa.int64() if column.type.bit_width == 64 else pa.int32())
    return np.asarray(column.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
