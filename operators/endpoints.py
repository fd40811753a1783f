"""endpoints.py: what source and sink instances run: split reading with offsets, sink writing.

:class:`SourceLogic` reads the splits assigned to one source instance, one
batch per call, and remembers each split's offset so that a later issue's
checkpoints can record and replay them. :class:`SinkLogic` feeds a
:class:`~operators.logic.SinkWriter`.

Only the owning instance touches these objects.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from .logic import (
    InstanceInfo,
    OperatorLogic,
    Sink,
    SinkWriter,
    Source,
    SourceSplit,
    SplitAddress,
    SplitReader,
)
from .recent import RecentRows
from .watermarks import _WatermarkedReader

__all__ = ["SourceLogic", "SinkLogic", "assign_splits"]


def assign_splits(splits: Sequence[SourceSplit], parallelism: int, index: int) -> list[SourceSplit]:
    """Split ``i`` goes to source instance ``i % parallelism``."""
    return [s for i, s in enumerate(splits) if i % parallelism == index]


class SourceLogic:
    """Reads assigned splits in order, one batch per :meth:`poll`.

    Lifecycle: ``READING -> EXHAUSTED``. ``offsets()`` maps each split id to the
    offset after the last batch returned (``None`` for splits not started).
    The current split's reader is opened when first needed, together with the
    next ``source.read_ahead()`` ones (each told its :class:`SplitAddress`);
    :meth:`receive` hands a message from outside the dataflow to any open one.
    """

    def __init__(self, source: Source, splits: Sequence[SourceSplit], offsets: dict[str, Any] | None = None):
        self.source = source
        self.splits = list(splits)
        mine = {s.split_id for s in self.splits}  # a restore hands every instance all offsets: keep ours
        self._offsets: dict[str, Any] = {k: v for k, v in (offsets or {}).items() if k in mine}
        self._done: set[str] = set()
        self._position = 0
        self._readers: dict[int, SplitReader] = {}  # position -> open reader: the current one and those ahead
        read_ahead = getattr(source, "read_ahead", None)  # duck-typed sources may lack the optional parts
        self._ahead = max(0, int(read_ahead())) if read_ahead is not None else 0
        self.info: InstanceInfo | None = None

    def open(self, info: InstanceInfo) -> None:
        self.info = info

    @property
    def exhausted(self) -> bool:
        return self._position >= len(self.splits)

    def ready_at(self) -> float | None:
        """Monotonic time before which :meth:`poll` would produce nothing, if paced."""
        if self.exhausted:
            return None
        return self._current_reader().ready_at()

    def _current_reader(self) -> SplitReader:
        last = min(self._position + self._ahead, len(self.splits) - 1)
        for position in range(self._position, last + 1):
            if position not in self._readers:
                split = self.splits[position]
                reader = self.source.open_split(split, self._offsets.get(split.split_id))
                self._readers[position] = reader
                bind = getattr(reader, "bind", None)
                if self.info is not None and bind is not None:
                    bind(SplitAddress(self.info.operator, self.info.index, split.split_id))
        return self._readers[self._position]

    def poll(self) -> pa.RecordBatch | None:
        """Read the next batch; ``None`` once every split is exhausted."""
        while not self.exhausted:
            reader = self._current_reader()
            batch = reader.read()
            split_id = self.splits[self._position].split_id
            self._offsets[split_id] = reader.offset()
            if batch is not None:
                return batch
            reader.close()
            self._done.add(split_id)
            del self._readers[self._position]
            self._position += 1
        return None

    def backlog(self) -> int:
        """Records offered to the open splits but not read yet, as far as their readers can say."""
        total = 0
        for reader in self._readers.values():
            backlog = getattr(reader, "backlog", None)  # duck-typed readers may lack the optional parts
            total += (backlog() or 0) if backlog is not None else 0
        return total

    def receive(self, split_id: str, message: Any) -> Any:
        """Hand ``message`` to the open reader of split ``split_id``; its answer.

        Raises:
            LookupError: no reader of that split is open (not opened yet, or finished).
        """
        for position, reader in self._readers.items():
            if self.splits[position].split_id == split_id:
                return reader.receive(message)
        raise LookupError(f"{self.info}: no open reader of split {split_id!r}")

    def watermark(self) -> tuple[int | None, bool]:
        """``(watermark, idle)`` of this instance (``None``: none yet; see ``watermarks.py``)."""
        reader = self._readers.get(self._position)
        if self._position != len(self.splits) - 1 or not isinstance(reader, _WatermarkedReader):
            return None, False  # earlier splits may still hold old records, or no watermarks at all
        return reader.watermark, reader.idle()

    def offsets(self) -> dict[str, Any]:
        return dict(self._offsets)

    def close(self) -> None:
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()


class SinkLogic(OperatorLogic):
    """Writes every batch to the sink's writer; ``finish()`` yields the writer's result.

    ``recent`` keeps the newest rows written, for ``job.tail()`` (read by the host between steps).
    """

    def __init__(self, sink: Sink):
        self.sink = sink
        self.recent = RecentRows()
        self.writer: SinkWriter | None = None
        self.result: Any = None
        self.finished = False
        self.pending: list[tuple[int, Any]] = []  # (epoch, staged) not yet known committed, oldest first

    def open(self, info: InstanceInfo) -> None:
        super().open(info)
        self.writer = self.sink.create_writer(info)

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        assert self.writer is not None, "bug in SinkLogic: process() before open()"
        if batch.num_rows:
            self.writer.write(batch)
            self.recent.add(batch)
        return ()

    def write_ahead(self, batch: pa.RecordBatch, epochs: int) -> bool:
        """Write ``batch`` into the output ``epochs`` epochs ahead where the writer can
        (``SinkWriter.write_ahead``); whether it did."""
        assert self.writer is not None, "bug in SinkLogic: write_ahead() before open()"
        if not batch.num_rows:
            return True
        if not self.writer.write_ahead(batch, epochs):
            return False
        self.recent.add(batch)
        return True

    def stage(self, epoch: int, durable: int) -> list[Any]:
        """Stage epoch ``epoch`` (``prepare_commit``); returns what each epoch after checkpoint ``durable``
        staged, oldest first. A checkpoint that failed after this instance staged its epoch never committed
        that output, so the next checkpoint's manifest lists it again and commits it."""
        assert self.writer is not None, "bug in SinkLogic: stage() before open()"
        staged = self.writer.prepare_commit(epoch)
        self.pending = [(e, s) for e, s in self.pending if e > durable]
        self.pending.append((epoch, staged))
        return [s for _, s in self.pending]

    def finish(self) -> Sequence[pa.RecordBatch]:
        assert self.writer is not None, "bug in SinkLogic: finish() before open()"
        self.result = self.writer.finish()
        self.finished = True
        return ()

    def close(self) -> None:
        if self.writer is not None and not self.finished:
            self.writer.abort()
        self.writer = None
