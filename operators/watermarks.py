"""watermarks.py: how sources make watermarks, and the source wrapper that carries them in its offsets.

A :class:`WatermarkStrategy` turns the batches a source reads into a
watermark: either ``max(time) - max_out_of_orderness - 1`` over everything
read so far (bounded disorder on a time column), or a user function
``fn(batch) -> watermark | None``. Each split keeps its own watermark, and it
is part of the split's offset, so a checkpoint holds it and a replay starts
from it: a source's watermark never goes backwards, also across recovery.

A source instance reads its splits one after the other. Its watermark is the
minimum over the splits assigned to it that have not finished: a finished
split no longer holds it back, and a split not started yet holds it at the
start (it may still hold old records), so the watermark appears once the
instance reads its last split. ``from_arrow`` cuts one split per instance by
default, so each instance's watermark moves from its first batch on. ``idle_after_s``: a source whose next batch is
not due for that long (a paced or quiet source) marks itself idle, so it does
not hold back the watermark of the operators it feeds.

Example:
    >>> from chiray.operators import Dataflow, from_items
    >>> flow = Dataflow("w")
    >>> s = flow.source(from_items([{"t": 5}, {"t": 3}]), watermarks=bounded_out_of_orderness("t", 2))
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import pyarrow as pa

from .eventtime import Duration, check_time_field, show_duration, ticks, time_values
from .logic import Source, SourceSplit, SplitAddress, SplitReader

__all__ = ["WatermarkStrategy", "bounded_out_of_orderness", "watermarks_from", "WatermarkedSource"]


@dataclasses.dataclass(frozen=True)
class WatermarkStrategy:
    """How a source derives watermarks from the batches it reads.

    Attributes:
        column: the event-time column (bounded disorder), or ``None`` with ``fn``.
        max_out_of_orderness: how far behind the largest time seen a record may still come.
        fn: ``fn(batch) -> int | None``, the watermark after ``batch`` (instead of ``column``).
        idle_after_s: mark the source idle while its next batch is not due for this long.
    """

    column: str | None = None
    max_out_of_orderness: Duration = 0
    fn: Callable[[pa.RecordBatch], Any] | None = None
    idle_after_s: float | None = None

    def __str__(self) -> str:
        """As the user wrote it: ``bounded_out_of_orderness('ts', timedelta(seconds=5))``."""
        if self.fn is not None:
            return f"watermarks_from({getattr(self.fn, '__qualname__', self.fn)!s})"
        return f"bounded_out_of_orderness({self.column!r}, {show_duration(self.max_out_of_orderness)})"

    def check(self, schema: pa.Schema | None, where: str) -> None:
        """Raise a clear error if the strategy does not fit the source's schema (when known)."""
        if (self.column is None) == (self.fn is None):
            raise ValueError(f"{where}: a watermark strategy needs a time column or a function, not both")
        if self.fn is not None and not callable(self.fn):
            raise TypeError(f"{where}: watermark function must be callable, got {type(self.fn).__name__}")
        if self.idle_after_s is not None and not self.idle_after_s >= 0:
            raise ValueError(f"{where}: idle_after_s must be >= 0 or None, got {self.idle_after_s!r}")
        if self.column is not None:
            check_time_field(schema, self.column, where)
            t = schema.field(self.column).type if schema is not None else None
            ticks(self.max_out_of_orderness, t, f"{where}: {self}", self.column)

    def advance(self, watermark: int | None, batch: pa.RecordBatch) -> int | None:
        """The watermark after ``batch``, given the one before (never smaller)."""
        if self.fn is not None:
            new = self.fn(batch)
            new = None if new is None else int(new)
        elif batch.num_rows == 0:
            new = None
        else:
            assert self.column is not None
            times = time_values(batch, self.column, "source watermarks")
            delay = ticks(self.max_out_of_orderness, batch.schema.field(self.column).type, f"source watermarks: {self}",
                          self.column)
            new = int(times.max()) - delay - 1
        if new is None:
            return watermark
        return new if watermark is None else max(watermark, new)


def bounded_out_of_orderness(column: str, max_out_of_orderness: Duration, *,
                             idle_after_s: float | None = None) -> WatermarkStrategy:
    """Watermark = largest ``column`` value read so far - ``max_out_of_orderness`` - 1.

    ``max_out_of_orderness`` is a ``timedelta`` on a timestamp column and an int (ticks) on an integer
    column; a bare number on a timestamp column is refused when the source is added.
    """
    return WatermarkStrategy(column, max_out_of_orderness, None, idle_after_s)


def watermarks_from(fn: Callable[[pa.RecordBatch], Any], *, idle_after_s: float | None = None) -> WatermarkStrategy:
    """Watermark = ``fn(batch)`` after each batch (``None``: unchanged); it never goes backwards."""
    return WatermarkStrategy(None, 0, fn, idle_after_s)


class _WatermarkedReader(SplitReader):
    """A split reader that also tracks the split's watermark; offset = (inner offset, watermark)."""

    def __init__(self, inner: SplitReader, strategy: WatermarkStrategy, watermark: int | None) -> None:
        self.inner = inner
        self.strategy = strategy
        self.watermark = watermark

    def read(self) -> pa.RecordBatch | None:
        batch = self.inner.read()
        if batch is not None:
            self.watermark = self.strategy.advance(self.watermark, batch)
        return batch

    def offset(self) -> Any:
        return (self.inner.offset(), self.watermark)

    def ready_at(self) -> float | None:
        return self.inner.ready_at()

    def idle(self) -> bool:
        """The next batch is not due for ``idle_after_s`` or more."""
        after = self.strategy.idle_after_s
        ready = self.inner.ready_at()
        return after is not None and ready is not None and ready - time.monotonic() >= after

    def backlog(self) -> int | None:
        return self.inner.backlog()

    def bind(self, address: SplitAddress) -> None:
        self.inner.bind(address)

    def receive(self, message: Any) -> Any:
        return self.inner.receive(message)

    def close(self) -> None:
        self.inner.close()


class WatermarkedSource(Source):
    """``source`` with watermarks made by ``strategy`` (what ``Dataflow.source(watermarks=...)`` builds)."""

    def __init__(self, source: Source, strategy: WatermarkStrategy) -> None:
        self.source = source
        self.strategy = strategy

    def schema(self) -> pa.Schema | None:
        return self.source.schema()

    def splits(self) -> list[SourceSplit]:
        return self.source.splits()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        inner_offset, watermark = offset if offset is not None else (None, None)
        return _WatermarkedReader(self.source.open_split(split, inner_offset), self.strategy, watermark)

    def read_ahead(self) -> int:
        return self.source.read_ahead()

    def bounded(self) -> bool | None:
        return self.source.bounded()

    def for_parallelism(self, parallelism: int) -> Source:
        inner = self.source.for_parallelism(parallelism)
        return self if inner is self.source else WatermarkedSource(inner, self.strategy)

    def fed_from_outside(self) -> bool:
        return self.source.fed_from_outside()

    def driver_bound(self) -> str | None:
        return self.source.driver_bound()

    def side(self) -> Any:
        return self.source.side()

    def checkpoint_complete(self, checkpoint_id: int, offsets: dict[str, Any]) -> None:
        """The inner source learns its own offsets (without the watermarks)."""
        inner = {k: (v[0] if isinstance(v, tuple) else v) for k, v in offsets.items()}
        self.source.checkpoint_complete(checkpoint_id, inner)

    def describe(self) -> str:
        return self.source.describe()
