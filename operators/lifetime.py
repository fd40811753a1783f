"""lifetime.py: the lifetime join: each row of the left input with the best right row of its key within its lifetime.

A left row (an auction) lives from its ``start`` to its ``end`` time; a
right row (a bid) of the same key *matches* it when the right row's time
``on`` is within ``[start, end]``. Per left row the operator keeps only the
best match so far (the greatest ``by``, or the least with
``descending=False``; ties go to the earliest match by its time, then by
arrival), and emits the left row joined with it once the watermark reaches
``end``: no right row of the lifetime can come after that. Left rows without
a match emit nothing (an inner join); at end of input every open left row
with a match is emitted.

State (a :class:`LifetimeState`, in bins) has three parts:

* ``open``: the left rows whose lifetime has not ended (due at ``end``);
* ``best``: per open row, its best right row so far (linked by position);
* ``pending``: right rows that a left row still to come could match: those
  after the watermark (a left row starts at its event time, so one that has
  not come yet starts after the watermark). They leave as the watermark
  passes their time.

A batch is matched with one Arrow hash join against the candidate rows of
the other side (those of its keys), the best match per left row taken with
one sort; nothing runs per record in Python.

Example:
    >>> j = LifetimeJoinLogic(("id", "auction"), "start", "end", "t", ("price",), (True,), 8)
    >>> _ = j.process(pa.record_batch({"id": [1], "start": [0], "end": [10]}), 0)
    >>> _ = j.process(pa.record_batch({"auction": [1, 1, 1], "t": [3, 5, 12], "price": [7, 9, 99]}), 1)
    >>> [r["price"] for b in j.on_watermark(10) for r in b.to_pylist()]
    [9]
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .eventtime import time_values
from .hashing import bins_of
from .joins import _TwoInputKeyed
from .ordering import check_orderable, sort_keys
from .rowbins import DUE, RowBins, RowsState

__all__ = ["LifetimeJoinLogic", "LifetimeState", "lifetime_output_schema"]

OPEN, BEST, PENDING = "open", "best", "pending"
START, END, TIME, SEQ = "__start", "__end", "__t", "__seq"
_LINK = "__best"  # in a serialised bin: an open row's best row, as an index into the bin's best rows
_POS, _ROW = "__pos", "__row"
_FOREVER = 1 << 62


def lifetime_output_schema(left: pa.Schema, right: pa.Schema, keys: tuple[str, str]) -> pa.Schema:
    """The output: the key (named as the left key), the left columns, then the right ones but their key
    (a name the left side has too gets ``_right``), as ``join`` names them."""
    fields = [left.field(keys[0])] + [f for f in left if f.name != keys[0]]
    fields += [f.with_name(f"{f.name}_right" if f.name in left.names else f.name) for f in right if f.name != keys[1]]
    return pa.schema(fields)


class LifetimeState(RowsState):
    """Open left rows, their best right rows and pending right rows, per bin.

    ``best_of[p]`` is the position in ``best`` of open row ``p``'s best match (-1: none yet); it travels
    in a serialised bin as the index of that row among the bin's best rows.
    """

    def __init__(self, num_bins: int) -> None:
        super().__init__(num_bins, (OPEN, BEST, PENDING), "chiray.LifetimeJoin/1", sequence=SEQ)
        self.best_of = np.zeros(0, dtype=np.int64)
        self._installing: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def add_open(self, rows: pa.Table, bins: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Open lifetimes (rows with their ``__start`` and ``__end``), due at ``end``, with no match yet."""
        positions = self.parts[OPEN].add(rows, bins, end)
        self._unlinked(positions)
        return positions

    def _unlinked(self, positions: np.ndarray) -> None:
        size = self.parts[OPEN].size
        if size > len(self.best_of):
            grown = np.full(max(size, 2 * len(self.best_of)), -1, dtype=np.int64)
            grown[: len(self.best_of)] = self.best_of
            self.best_of = grown
        self.best_of[positions] = -1

    def close(self, positions: np.ndarray) -> None:
        """Drop open rows (and their best rows)."""
        best = self.best_of[positions]
        self.parts[BEST].drop(best[best >= 0])
        self.parts[OPEN].drop(positions)
        self.best_of[positions] = -1

    def _open_in(self, bins: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The open rows of ``bins``, bin by bin in position order, and their bins."""
        part = self.parts[OPEN]
        found = part.positions_in(bins)
        found = found[np.argsort(part.bins_of(found), kind="stable")]
        return found, part.bins_of(found)

    def _rows_in(self, part: str, bins: list[int]) -> dict[int, pa.Table]:
        if part == PENDING or not len(self.parts[OPEN]):
            return super()._rows_in(part, bins)
        found, found_bins = self._open_in(bins)
        best = self.best_of[found]
        bounds = np.searchsorted(found_bins, np.append(bins, self.num_bins))
        out: dict[int, pa.Table] = {}
        if part == OPEN:
            rows = self.parts[OPEN].take(found)
            rows = rows.append_column(DUE, pa.array(self.parts[OPEN].due_of(found)))
            for i, b in enumerate(bins):
                lo, hi = bounds[i], bounds[i + 1]
                if hi > lo:
                    has = best[lo:hi] >= 0
                    link = np.where(has, np.cumsum(has) - 1, -1)
                    out[b] = rows.slice(lo, hi - lo).append_column(_LINK, pa.array(link))
            return out
        rows = self.parts[BEST].take(best[best >= 0]) if (best >= 0).any() else None
        linked = np.cumsum(np.append(0, best >= 0))  # best rows before each open row
        for i, b in enumerate(bins):
            lo, hi = linked[bounds[i]], linked[bounds[i + 1]]
            if hi > lo and rows is not None:
                out[b] = rows.slice(lo, hi - lo).append_column(DUE, pa.array(np.zeros(hi - lo, np.int64)))
        return out

    def _install(self, part: str, b: int, rows: pa.Table) -> np.ndarray:
        if part == OPEN:
            link = rows.column(_LINK).to_numpy()
            positions = super()._install(part, b, rows.drop_columns([_LINK]))
            self._unlinked(positions)
            self._installing[b] = (positions, link)
            return positions
        positions = super()._install(part, b, rows)
        if part == BEST:
            opened, link = self._installing.pop(b)
            self.best_of[opened[link >= 0]] = positions[link[link >= 0]]
        return positions

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        try:
            super().install_bins(data)
        finally:
            self._installing.clear()

    def _renumbered(self, part: str, renumber: np.ndarray) -> None:
        if part == OPEN:
            kept = renumber >= 0
            moved = np.full(max(len(renumber), 1024), -1, dtype=np.int64)
            moved[renumber[kept]] = self.best_of[: len(renumber)][kept]
            self.best_of = moved
        elif part == BEST:
            live = self.best_of >= 0
            self.best_of[live] = renumber[self.best_of[live]]

    def compact(self) -> None:
        for name in (OPEN, BEST, PENDING):  # open first: the links it moves still point at old best rows
            renumber = self.parts[name].compact()
            if renumber is not None:
                self._renumbered(name, renumber)


class LifetimeJoinLogic(_TwoInputKeyed):
    """Each left row with its best right row within its lifetime, emitted when the lifetime ends.

    Args:
        keys: the key column of each input.
        start, end: the left input's columns of each row's lifetime (inclusive bounds).
        on: the right input's time column.
        by: the right columns that rank matches, the first deciding first.
        descending: per column of ``by``, whether the greatest value is best.
        num_bins: the operator's bins.
    """

    def __init__(self, keys: tuple[str, str], start: str, end: str, on: str, by: Sequence[str],
                 descending: Sequence[bool], num_bins: int) -> None:
        super().__init__(keys, num_bins)
        self.start, self.end, self.on = start, end, on
        self.by, self.descending = tuple(by), tuple(descending)
        self.watermark = -(1 << 63)
        self.late_records = 0
        self._checked: pa.Schema | None = None
        self._state = LifetimeState(self.num_bins)

    @property
    def state(self) -> LifetimeState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        key = self._key(batch, input_index)
        if batch.num_rows == 0:
            return []
        if input_index == 0:
            self._open(batch, key)
        else:
            self._arrive(batch, key)
        return []

    def _open(self, batch: pa.RecordBatch, key: str) -> None:
        """New lifetimes: kept open, and matched with the pending right rows of their keys."""
        where = self.where("lifetime_join")
        start, end = time_values(batch, self.start, where), time_values(batch, self.end, where)
        live = end > self.watermark  # a lifetime that ended already would match nothing more
        self.late_records += int((~live).sum())
        rows = pa.Table.from_batches([batch]).append_column(START, pa.array(start)).append_column(END, pa.array(end))
        if not live.all():
            rows, end = rows.filter(pa.array(live)), end[live]
        if not rows.num_rows:
            return
        positions = self._state.add_open(rows, bins_of(rows.column(key), self.num_bins), end)
        pending = self._state.parts[PENDING]
        if not len(pending):
            return
        candidates = self._with_keys(pending, self.keys[1], rows.column(key))
        if not len(candidates):
            return
        theirs = pending.take(candidates)
        lifetimes = pa.table({key: rows.column(key), _POS: pa.array(positions), START: rows.column(START),
                              END: rows.column(END)})
        self._offer(*self._pairs(lifetimes, theirs.select([self.keys[1], TIME]), theirs))

    def _arrive(self, batch: pa.RecordBatch, key: str) -> None:
        """Right rows: offered to the open lifetimes of their keys; kept pending if after the watermark."""
        if self._checked is not batch.schema:  # what the build could not check (a stream of unknown schema)
            check_orderable(batch.schema, self.by, self.where("lifetime_join"), "lifetime_join")
            self._checked = batch.schema
        t = time_values(batch, self.on, self.where("lifetime_join"))
        rows = (pa.Table.from_batches([batch]).append_column(TIME, pa.array(t))
                .append_column(SEQ, pa.array(self._state.numbers(len(t)))))
        opened = self._state.parts[OPEN]
        if len(opened):
            candidates = self._with_keys(opened, self.keys[0], batch.column(key))
            if len(candidates):
                lifetimes = opened.take(candidates).select([self.keys[0], START, END])
                lifetimes = lifetimes.append_column(_POS, pa.array(candidates))
                self._offer(*self._pairs(lifetimes, rows.select([key, TIME]), rows))
        after = t > self.watermark
        self.late_records += int((~after).sum())
        if after.any():
            kept = rows if after.all() else rows.filter(pa.array(after))
            self._state.parts[PENDING].add(kept, bins_of(kept.column(key), self.num_bins), t[after])

    @staticmethod
    def _with_keys(part: RowBins, key: str, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The live positions of ``part`` whose key is among ``keys``."""
        found = pc.is_in(part.column(key), value_set=pc.unique(keys)).to_numpy(zero_copy_only=False)
        return np.flatnonzero(found & part.is_live())

    def _pairs(self, lifetimes: pa.Table, times: pa.Table, rows: pa.Table) -> tuple[np.ndarray, pa.Table]:
        """Each (open row, right row) of one key with the right row's time in the lifetime: the open row's
        position and the right row (a row of ``rows``, whose key and time ``times`` holds)."""
        left_key = lifetimes.schema.names[0]
        times = times.append_column(_ROW, pa.array(np.arange(times.num_rows, dtype=np.int64)))
        joined = lifetimes.join(times.rename_columns(["__k", TIME, _ROW]), keys=left_key, right_keys="__k",
                                join_type="inner", use_threads=False)
        t = joined.column(TIME).to_numpy()
        inside = (joined.column(START).to_numpy() <= t) & (t <= joined.column(END).to_numpy())
        positions = joined.column(_POS).to_numpy()[inside]
        return positions, rows.take(pa.array(joined.column(_ROW).to_numpy()[inside]))

    def _offer(self, positions: np.ndarray, candidates: pa.Table) -> None:
        """Make each candidate the best match of the open row at its position where it beats the one held."""
        if not len(positions):
            return
        state, best = self._state, self._state.parts[BEST]
        touched = np.unique(positions)
        held = state.best_of[touched]
        has = held >= 0
        if best.schema is not None and not candidates.schema.equals(best.schema):
            candidates = candidates.select(best.schema.names).cast(best.schema)
        current = best.take(held[has]) if has.any() else candidates.slice(0, 0)
        rivals = pa.concat_tables([current, candidates])
        owner = np.concatenate([touched[has], positions])
        ranking = pa.table([pa.array(owner)] + [rivals.column(c) for c in (*self.by, TIME, SEQ)],
                           names=[_POS, *(f"__by{i}" for i in range(len(self.by))), TIME, SEQ])
        keys = sort_keys(ranking.column_names, (False, *self.descending, False, False))
        order = pc.sort_indices(ranking, sort_keys=keys).to_numpy()
        first = order[np.r_[True, owner[order][1:] != owner[order][:-1]]]
        won = first[first >= len(current)]  # a candidate beat what its open row held
        if not len(won):
            return
        winners = owner[won]
        old = state.best_of[winners]
        best.drop(old[old >= 0])
        state.best_of[winners] = best.add(rivals.take(pa.array(won)), state.parts[OPEN].bins_of(winners))

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        self.watermark = max(self.watermark, watermark)
        return self._close_until(self.watermark)

    def finish(self) -> list[pa.RecordBatch]:
        return self._close_until(_FOREVER)

    def _close_until(self, time: int) -> list[pa.RecordBatch]:
        state = self._state
        opened, pending = state.parts[OPEN], state.parts[PENDING]
        pending.drop(pending.due_by(time))
        due = opened.due_by(time)
        if not len(due):
            state.compact()
            return []
        matched = due[state.best_of[due] >= 0]
        out = self._joined(opened.take(matched), state.parts[BEST].take(state.best_of[matched])) \
            if len(matched) else []
        state.close(due)
        state.compact()
        return out

    def _joined(self, left: pa.Table, right: pa.Table) -> list[pa.RecordBatch]:
        left = left.drop_columns([START, END])
        right = right.drop_columns([TIME, SEQ])
        schema = lifetime_output_schema(left.schema, right.schema, self.keys)
        columns = [left.column(self.keys[0])] + [left.column(n) for n in left.column_names if n != self.keys[0]]
        columns += [right.column(n) for n in right.column_names if n != self.keys[1]]
        return pa.Table.from_arrays(columns, schema=schema).combine_chunks().to_batches()
