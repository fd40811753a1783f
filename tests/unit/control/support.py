"""Shared pieces of the control-plane tests: a gated sequence source and a recording control op.

Everything runs in one process under :class:`actors.harness.LocalRun`, which
hands source objects and control ops to instances without pickling them, so
a test can open a source's gate and read an op's log directly.

``SeqSource`` emits rows ``(split, seq, value)``: ``seq`` counts the rows of
its split from 0, ``value`` depends only on ``(seed, split, seq)``. Its gate
(``limit``: rows each split may emit so far; ``hold_end``: pause at the end
instead of ending) pauses readers through ``ready_at()`` without ending them,
so a pipeline can be made quiescent and resumed.

``Recording`` is a control op whose instance handlers append an :class:`Event`
to the op's ``log`` (a list the test owns, shared by all ops of one run).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable, Iterable

import pyarrow as pa

from chiray.actors.jobs.harness import LocalRun
from chiray.control.message import InstanceId
from chiray.control.op import ControlOp, InstanceHandler
from chiray.control.oprun import OpState
from chiray.operators.logic import Source, SourceSplit, SplitReader

SEQ_SCHEMA = pa.schema([("split", pa.int64()), ("seq", pa.int64()), ("value", pa.int64())])
FAR_FUTURE = 1e18
"""A ``ready_at`` no monotonic clock reaches: the reader is paused, not ended."""


# --------------------------------------------------------------------------- the source


class _SeqReader(SplitReader):
    def __init__(self, source: "SeqSource", split: int, offset: int):
        self._source = source
        self._split = split
        self._total = source.total(split)
        self._emitted = offset

    def _allowed(self) -> int:
        limit = self._source.limit
        return self._total if limit is None else min(self._total, limit)

    def ready_at(self) -> float | None:
        if self._emitted >= self._total:
            return FAR_FUTURE if self._source.hold_end else None
        return None if self._emitted < self._allowed() else FAR_FUTURE

    def read(self) -> pa.RecordBatch | None:
        if self._emitted >= self._total:
            return None
        stop = min(self._allowed(), self._emitted + self._source.batch_size)
        assert stop > self._emitted, "bug in test source: read() while paused"
        seqs = list(range(self._emitted, stop))
        values = [self._source.value(self._split, s) for s in seqs]
        self._emitted = stop
        return pa.RecordBatch.from_pydict(
            {"split": [self._split] * len(seqs), "seq": seqs, "value": values}, schema=SEQ_SCHEMA)

    def offset(self) -> int:
        return self._emitted


class SeqSource(Source):
    """Splits of ``(split, seq, value)`` rows with a gate a test can open and close.

    Split numbers run from ``first_split`` (give each source of a job its own
    range, so the ``split`` column names a record's origin uniquely); the split
    id of split ``s`` is ``"{name}-{s}"``.

    Args:
        rows_per_split: how many rows each split has (its length is the number of splits).
        batch_size: rows per batch.
        seed: picks the values.
        limit: rows each split may emit before pausing (None: all).
        hold_end: pause after the last row instead of ending.
        name: the source's name (and split id prefix).
        first_split: the number of its first split.
    """

    def __init__(self, rows_per_split: Iterable[int], batch_size: int = 3, seed: int = 0,
                 limit: int | None = None, hold_end: bool = False, name: str = "seq",
                 first_split: int = 0):
        self.rows_per_split = list(rows_per_split)
        self.batch_size = batch_size
        self.seed = seed
        self.limit = limit
        self.hold_end = hold_end
        self._name = name
        self.first_split = first_split

    @property
    def split_numbers(self) -> list[int]:
        return [self.first_split + i for i in range(len(self.rows_per_split))]

    def total(self, split: int) -> int:
        return self.rows_per_split[split - self.first_split]

    def value(self, split: int, seq: int) -> int:
        return random.Random(f"{self._name}/{self.seed}/{split}/{seq}").randint(0, 99)

    def rows(self, split: int, upto: int | None = None) -> list[dict[str, int]]:
        """The rows split ``split`` emits before offset ``upto`` (all by default)."""
        stop = self.total(split) if upto is None else upto
        return [{"split": split, "seq": s, "value": self.value(split, s)} for s in range(stop)]

    def schema(self) -> pa.Schema:
        return SEQ_SCHEMA

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit(f"{self._name}-{s}", s) for s in self.split_numbers]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _SeqReader(self, split.payload, 0 if offset is None else int(offset))

    def describe(self) -> str:
        return self._name


def track(batch: pa.RecordBatch, params: dict) -> pa.RecordBatch:
    """A map function that remembers, in its instance's own params, the (split, seq) it processed.

    ``map(..., params={})`` gives each instance its own params dict, which a
    control handler reads back with ``ctx.parameters()``.
    """
    seen = params.setdefault("seen", set())
    seen.update(zip(batch.column("split").to_pylist(), batch.column("seq").to_pylist()))
    return batch


# --------------------------------------------------------------------------- the recording op


@dataclasses.dataclass(frozen=True)
class Event:
    """One handler call at one instance.

    Attributes:
        instance: where it ran.
        event: "begin", "next", "complete" or "dispose".
        tag: the op's tag.
        records_in: the instance's records_in at that moment.
        sender: for "next", who sent the message.
        payload: for "next", what the sender attached.
        offsets: for a source's "complete", its split offsets.
        seen: for "complete" at an instance with ``track``'s params, the (split, seq) it processed.
    """

    instance: InstanceId
    event: str
    tag: str
    records_in: int
    sender: Any = None
    payload: Any = None
    offsets: dict | None = None
    seen: frozenset | None = None


class Recording(ControlOp):
    """A control op that logs every instance-side handler call.

    Args:
        log: the list events are appended to.
        tag: names the op in the log.
        blocking: blocking or not.
        extra: extra edges of the meta-topology (old -> new instance, say).
        attach: at every instance's on_complete, attach ``(instance, tag)`` for every downstream.
    """

    def __init__(self, log: list, tag: str, blocking: bool = True,
                 extra: Iterable[tuple[InstanceId, InstanceId]] = (), timeout_s: float | None = 60.0):
        super().__init__()
        self.log = log
        self.tag = tag
        self.blocking = blocking
        self.extra = list(extra)
        self.timeout_s = timeout_s

    def extra_edges(self, ctx: Any) -> list[tuple[InstanceId, InstanceId]]:
        return list(self.extra)

    class Instance(InstanceHandler):
        def _record(self, ctx: Any, event: str, **more: Any) -> None:
            op = self.op
            op.log.append(Event(ctx.instance, event, op.tag, ctx.statistics().records_in, **more))

        def on_begin(self, ctx: Any) -> None:
            self.received: list[Any] = []
            self._record(ctx, "begin")

        def on_next(self, ctx: Any, payload: Any, sender: Any) -> None:
            self.received.append((sender, payload))
            self._record(ctx, "next", sender=sender, payload=payload)

        def on_complete(self, ctx: Any) -> Any:
            seen = ctx.parameters().get("seen")
            self._record(ctx, "complete", offsets=ctx.source_offsets(),
                         seen=None if seen is None else frozenset(seen))
            return (ctx.instance, self.op.tag)

        def on_dispose(self, ctx: Any) -> None:
            self._record(ctx, "dispose")


def completions(log: list[Event], tag: str) -> dict[InstanceId, int]:
    """instance -> position in ``log`` of op ``tag``'s on_complete there."""
    out: dict[InstanceId, int] = {}
    for i, e in enumerate(log):
        if e.tag == tag and e.event == "complete":
            assert e.instance not in out, f"op {tag} completed twice at {e.instance}"
            out[e.instance] = i
    return out


def run_until(run: LocalRun, cond: Callable[[], bool], max_rounds: int = 200_000) -> None:
    """Step ``run`` until ``cond()``; fail (not hang) if it never holds."""
    for _ in range(max_rounds):
        if cond():
            return
        run.step_all()
    raise AssertionError(f"condition not reached in {max_rounds} rounds")


def ops_done(*runs: Any) -> Callable[[], bool]:
    return lambda: all(r.state is not OpState.RUNNING for r in runs)


def instance_edges(run: LocalRun) -> set[tuple[InstanceId, InstanceId]]:
    """Every edge of the job's instance graph, from its physical plan."""
    return {(c.src, c.dst) for c in run.plan.channels}


def all_instances(run: LocalRun) -> list[Any]:
    return [inst for host in run.hosts for inst in host.instances]


def emitted_before(log: list[Event], tag: str) -> dict[int, int]:
    """split -> rows its source had emitted when op ``tag`` completed there (the sources' cut)."""
    out: dict[int, int] = {}
    for e in log:
        if e.tag == tag and e.event == "complete" and e.offsets is not None:
            for split_id, offset in e.offsets.items():
                out[int(split_id.rsplit("-", 1)[1])] = int(offset or 0)
    return out
