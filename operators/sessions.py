"""sessions.py: session windows per key by event time, their state kept per bin with the watermark.

A key's records closer than ``gap`` share a session ``[first, last + gap)``;
a record that bridges two sessions merges them. Sessions are kept per key in
a :class:`~operators.dictstate.DictState` (key -> sorted list of
``[start, end, row batches]``), so they live in bins and move with them; the
operator's watermark travels in every bin it snapshots, as for fixed windows
(:mod:`operators.windowstate`). Bins travel as Arrow IPC (:mod:`operators.codec`),
never pickled.

A session fires when the watermark reaches ``end - 1``: built-in aggregates
are then computed with one vectorised Arrow group-by over the rows of every
session that fires; a user function gets each session's rows. A record is
late (dropped, counted) if its own window ``[t, t + gap)`` is past the
allowed lateness. With lateness, a record that reaches a session that has
fired re-emits it (a changed ``window_end`` is a new row).

Example:
    >>> logic = SessionWindowLogic("k", "t", session(5), 8, aggs=[AggSpec("n", "count")])
    >>> _ = logic.process(pa.record_batch({"k": ["a", "a", "a"], "t": [1, 3, 20]}), 0)
    >>> [(r["window_start"], r["window_end"], r["n"]) for b in logic.on_watermark(30) for r in b.to_pylist()]
    [(1, 8, 2), (20, 25, 1)]
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import codec
from .aggregates import AggSpec, aggregate_output_schema
from .batch import to_batches
from .columns import check_arrival
from .eventtime import Duration, show_duration, ticks, time_values
from .hashing import bins_of
from .keyed import _KeyedLogic
from .keyindex import encode_keys
from .dictstate import DictState
from .state import BinnedState
from .logic import SideOutput
from .windows import LATE, WINDOW_COLUMNS, WindowSpec, session, window_bounds, window_output_schema, with_key_and_window

__all__ = ["SessionWindowLogic", "SessionState", "session"]

MIN_TIME = -(1 << 63)
_FORMAT = "chiray.SessionState/1"
Session = list  # [start, end, [RecordBatch, ...]]


class SessionState(BinnedState):
    """Sessions per key (a ``DictState``), the watermark, and a queue of when sessions fire or expire.

    Lifecycle of a session: ``OPEN --watermark >= end - 1--> FIRED --watermark >=
    end - 1 + lateness--> dropped``. Only the owning logic touches it.
    """

    def __init__(self, num_bins: int, allowed_lateness: int = 0) -> None:
        super().__init__(num_bins)
        self.sessions = DictState(num_bins)
        self.allowed_lateness = allowed_lateness
        self.watermark = MIN_TIME
        self.fired_upto = MIN_TIME
        self._due: list[tuple[int, int, Any, int]] = []  # (time, seq, key, bin): check the key then
        self._seq = itertools.count()
        self._remembered: set[int] = set()
        self.pending: list[tuple[Any, Session]] = []  # sessions to emit at the owner's next call

    def fired(self, end: int) -> bool:
        return end - 1 <= self.fired_upto

    def schedule(self, key: Any, bin: int, end: int) -> None:
        for t in (end - 1, end - 1 + self.allowed_lateness):
            heapq.heappush(self._due, (t, next(self._seq), key, bin))

    def advance(self, watermark: int) -> list[tuple[Any, Session]]:
        """Raise the watermark; return the sessions that fire (in end order), dropping expired ones."""
        self.watermark = max(self.watermark, watermark)
        fired, self.pending = self.pending, []
        keys: dict[tuple[Any, int], None] = {}
        while self._due and self._due[0][0] <= self.watermark:
            _, _, key, b = heapq.heappop(self._due)
            keys[(key, b)] = None
        for key, b in keys:
            sessions = self.sessions.get(key, b) or []
            fired += [(key, s) for s in sessions if self.fired_upto < s[1] - 1 <= self.watermark]
            kept = [s for s in sessions if s[1] - 1 + self.allowed_lateness > self.watermark]
            if len(kept) != len(sessions):
                self._remembered.add(b)
                self._store(key, b, kept)
        self.fired_upto = max(self.fired_upto, self.watermark)
        return sorted(fired, key=lambda ks: (ks[1][1], ks[1][0]))

    def _store(self, key: Any, bin: int, sessions: list[Session]) -> None:
        if sessions:
            self.sessions.put(key, bin, sessions)
        else:
            self.sessions.delete(key, bin)

    # -- BinnedState --------------------------------------------------------------

    def version(self, bin: int) -> int:
        return max(super().version(bin), self.sessions.version(bin))

    def bins(self) -> list[int]:
        return sorted(set(self.sessions.bins()) | self._remembered)

    def bin_key_counts(self) -> dict[int, int]:
        return self.sessions.bin_key_counts()

    def bin_sizes(self) -> dict[int, int]:
        sizes = {b: 16 for b in self._remembered}
        sizes.update(self.sessions.bin_sizes())
        return sizes

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        inner = self.sessions.snapshot_bins(bins)
        return {b: codec.encode({"format": _FORMAT, "watermark": self.watermark,
                                 "version": self.version(b), "sessions": payload})
                for b, payload in inner.items()}

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        out = self.snapshot_bins(bins)
        self.sessions.drop_bins(out)
        self._remembered.difference_update(out)
        return out

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        docs = {self._check_bin(b): self._decode(b, p) for b, p in data.items()}
        carried = max((d["watermark"] for d in docs.values()), default=MIN_TIME)
        if carried > self.watermark:  # local sessions the carried watermark passes fire first
            self.pending = self.advance(carried)  # (advance takes the pending sessions too)
        incoming = DictState(self._num_bins)
        incoming.install_bins({b: d["sessions"] for b, d in docs.items()})
        for b, doc in docs.items():
            for key, sessions in incoming._bins.get(b, {}).items():
                for s in sessions:
                    if doc["watermark"] < s[1] - 1 and self.fired(s[1]):  # the sender had not fired it
                        self.pending.append((key, s))
                    self.schedule(key, b, s[1])
        self.sessions.install_bins({b: d["sessions"] for b, d in docs.items()})
        for b, doc in docs.items():
            self._carry_version(b, doc["version"])
            self._remembered.add(b)
        self.pending = self.advance(self.watermark)  # drop what is already expired here

    def _decode(self, b: int, payload: bytes) -> dict[str, Any]:
        return codec.decode_document(payload, "SessionState", _FORMAT, b)

    def __len__(self) -> int:
        return len(self.sessions)


def merge_sessions(sessions: list[Session], times: np.ndarray, rows: pa.RecordBatch, gap: int) -> tuple[
        list[Session], list[int]]:
    """Add one key's new rows (``times`` sorted) to its sessions; returns them and the indexes changed."""
    cuts = np.flatnonzero(np.diff(times) >= gap) + 1
    bounds = [0, *cuts.tolist(), len(times)]
    new = [[int(times[lo]), int(times[hi - 1]) + gap, [rows.slice(lo, hi - lo)]]
           for lo, hi in zip(bounds[:-1], bounds[1:])]
    merged: list[Session] = []
    touched: list[bool] = []
    for s, is_new in sorted([(s, False) for s in sessions] + [(s, True) for s in new], key=lambda x: x[0][0]):
        if merged and s[0] < merged[-1][1]:
            last = merged[-1]
            merged[-1] = [last[0], max(last[1], s[1]), last[2] + s[2]]
            touched[-1] = touched[-1] or is_new or len(s[2]) > 0
        else:
            merged.append(list(s))
            touched.append(is_new)
    return merged, [i for i, t in enumerate(touched) if t]


class SessionWindowLogic(_KeyedLogic):
    """Session windows per key by event time with built-in aggregates (``aggs``) or ``fn`` per session.

    ``fn(key, window_start, window_end, rows) -> rows``. Arguments as for
    :class:`~operators.windows.FixedWindowLogic`.
    """

    def __init__(self, key: str, time: str, spec: WindowSpec, num_bins: int, *,
                 aggs: Sequence[AggSpec] = (), fn: Callable[..., Any] | None = None,
                 allowed_lateness: Duration = 0, time_type: pa.DataType | None = None,
                 late_side_output: bool = False, time_note: str = "") -> None:
        super().__init__(key, num_bins)
        if spec.kind != "session":
            raise ValueError(f"SessionWindowLogic runs session windows, got {spec.kind!r}")
        if bool(aggs) == (fn is not None):
            raise ValueError("a window needs built-in aggregates or a function, not both")
        self.time, self.aggs, self.fn = time, tuple(aggs), fn
        self.spec, self._lateness = spec, allowed_lateness
        self.gap, lateness = self._resolve(time_type)
        self._time_type, self._time_note = time_type, time_note
        self._state = SessionState(num_bins, lateness)
        self._schema: pa.Schema | None = None
        self.late_records = 0
        self.late_side_output = late_side_output

    def _where(self) -> str:
        info = getattr(self, "info", None)
        return f"operator {info.operator!r}" if info is not None else f"window on {self.time!r}"

    def _resolve(self, time_type: pa.DataType | None) -> tuple[int, int]:
        """The gap and the allowed lateness in ticks of a time column of ``time_type``."""
        where = self._where()
        _, _, gap = self.spec.resolve(time_type, where, self.time)
        return gap, ticks(self._lateness, time_type, f"{where}: allowed_lateness={show_duration(self._lateness)}",
                          self.time)

    @property
    def state(self) -> SessionState:
        return self._state

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[Any]:
        out: list[Any] = self._emit(self._state.pending)
        self._state.pending = []
        if batch.num_rows == 0:
            return out
        self._schema = batch.schema
        if self._time_type is None and self.time in batch.schema.names:
            self._time_type = batch.schema.field(self.time).type
            self._resolve(self._time_type)  # the durations were checked without the column's type
        check_arrival(batch, self.time, self._time_type, self._time_note, self._where())
        times = time_values(batch, self.time, f"window on {self.time!r}")
        late = times + self.gap - 1 + self._state.allowed_lateness <= self._state.watermark
        if late.any():
            self.late_records += int(late.sum())
            if self.late_side_output:
                out.append(SideOutput(LATE, batch.filter(pa.array(late))))
            keep = np.flatnonzero(~late)
            batch, times = batch.take(keep), times[keep]
            if batch.num_rows == 0:
                return out
        uniques, codes = encode_keys(self._key_column(batch))
        order = np.lexsort((times, codes))
        bounds = np.searchsorted(codes[order], np.arange(len(uniques) + 1))
        bins = bins_of(uniques, self.num_bins).tolist()
        updates: list[tuple[Any, Session]] = []
        for i, key in enumerate(uniques.to_pylist()):
            idx = order[bounds[i]:bounds[i + 1]]
            sessions, touched = merge_sessions(self._state.sessions.get(key, bins[i]) or [], times[idx],
                                               batch.take(idx), self.gap)
            self._state.sessions.put(key, bins[i], sessions)
            for j in touched:
                self._state.schedule(key, bins[i], sessions[j][1])
                if self._state.fired(sessions[j][1]):
                    updates.append((key, sessions[j]))
        return out + self._emit(updates)

    def on_watermark(self, watermark: int) -> list[pa.RecordBatch]:
        return self._emit(self._state.advance(watermark))

    def finish(self) -> list[pa.RecordBatch]:
        return self._emit(self._state.advance(1 << 62))

    def _emit(self, fired: list[tuple[Any, Session]]) -> list[pa.RecordBatch]:
        if not fired:
            return []
        if self.fn is not None:
            out: list[pa.RecordBatch] = []
            for key, (start, end, pieces) in fired:
                rows = pa.Table.from_batches(pieces).combine_chunks()
                result = self.fn(key, *window_bounds(start, end, self._time_type), rows)
                key_type = rows.schema.field(self.key).type
                out.extend(with_key_and_window(b, self.key, key, key_type, start, end, self._time_type)
                           for b in to_batches(result) if b.num_rows)
            return out
        return [self._aggregate(fired)]

    def _aggregate(self, fired: list[tuple[Any, Session]]) -> pa.RecordBatch:
        """One Arrow group-by over the rows of every fired session (the vectorised part)."""
        pieces = [p for _, s in fired for p in s[2]]
        table = pa.Table.from_batches(pieces)
        sid = np.repeat(np.arange(len(fired)), [sum(p.num_rows for p in s[2]) for _, s in fired])
        table = table.append_column("__session", pa.array(sid))
        named: list[tuple] = []
        for agg in self.aggs:
            if agg.func == "count":
                named.append((agg.column or "__session", "count", pc.CountOptions("only_valid")))
            else:
                named.append((agg.column, agg.func))  # type: ignore[arg-type]
        grouped = table.group_by("__session").aggregate(named).sort_by("__session")
        ids = grouped.column("__session").to_numpy()
        schema = aggregate_output_schema(table.schema, self.key, self.aggs)
        out_schema = window_output_schema(self._time_type or pa.int64(), schema.field(0), list(schema)[1:])
        keys = pa.array([fired[i][0] for i in ids], schema.field(0).type)
        bound = out_schema.field(WINDOW_COLUMNS[0]).type
        starts = pa.array([fired[i][1][0] for i in ids], pa.int64()).cast(bound)
        ends = pa.array([fired[i][1][1] for i in ids], pa.int64()).cast(bound)
        first = 1 if grouped.schema.names[0] == "__session" else 0  # where the key goes depends on the version
        values = [grouped.column(first + j) for j in range(len(self.aggs))]
        arrays = [keys, starts, ends] + [v.cast(f.type) for v, f in zip(values, list(schema)[1:])]
        return pa.RecordBatch.from_arrays([a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
                                          for a in arrays], schema=out_schema)
