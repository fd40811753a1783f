"""keptapart.py: ``KeptApart``, the data a sink took in after a checkpoint's barrier, before the barrier came on
every input.

A checkpoint holds no input of a sink (``control.op.InstanceHandler.keeps_input_apart``): the sink takes in
what comes after the barrier on a channel at once, so its sender is never held up, and keeps it here until
the checkpoint has staged its epoch there; then that data goes to the writer, as the next epoch's.
Data is kept by *depth*, the number of pending checkpoints it came after (``ControlProcessor.apart``):
depth 1 goes to the writer when the oldest pending one completes, depth 2 with the next, and so on.

Memory is bounded by ``limit`` bytes: above it, the instance holds back the channels it keeps data of (as an
aligned barrier would) until a completion takes some in. A writer that can write into later epochs at once
(``SinkWriter.write_ahead``) gets the data then instead; only its rows are counted here (``note_ahead``), so
that ``records`` says what waits for a checkpoint either way.

Example:
    >>> import pyarrow as pa
    >>> kept = KeptApart(limit=1 << 20)
    >>> kept.add(2, pa.record_batch({"x": [3]}), 0); kept.add(1, pa.record_batch({"x": [1, 2]}), 0)
    >>> [b.num_rows for b, _ in kept.take()], [b.num_rows for b, _ in kept.take()], kept.take()
    ([2], [1], [])
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["KeptApart", "KEEP_APART_BYTES"]

KEEP_APART_BYTES = 64 << 20
"""What a sink keeps apart at most while it waits for a barrier; above it, it holds back those channels."""


class KeptApart:
    """Batches kept apart by depth (see the module docstring); ``bytes``, what they hold; ``records``, their rows
    and those written ahead."""

    __slots__ = ("_levels", "_ahead", "bytes", "records", "limit")

    def __init__(self, limit: int = KEEP_APART_BYTES):
        self._levels: list[list[tuple[pa.RecordBatch, int]]] = []
        self._ahead: list[int] = []  # per depth, rows the writer took ahead
        self.bytes = 0
        self.records = 0
        self.limit = limit

    def __bool__(self) -> bool:
        return any(self._levels)

    @property
    def full(self) -> bool:
        return self.bytes > self.limit

    def add(self, depth: int, batch: pa.RecordBatch, input_index: int) -> None:
        """Keep ``batch`` (of input ``input_index``), which came after ``depth`` pending ops."""
        self._level(depth).append((batch, input_index))
        self.bytes += batch.nbytes
        self.records += batch.num_rows

    def note_ahead(self, depth: int, rows: int) -> None:
        """The writer took ``rows`` that came after ``depth`` pending ops into that epoch's output at once."""
        self._level(depth)
        self._ahead[depth - 1] += rows
        self.records += rows

    def _level(self, depth: int) -> list[tuple[pa.RecordBatch, int]]:
        if depth < 1:
            raise ValueError(f"bug: data kept apart at depth {depth}")
        while len(self._levels) < depth:
            self._levels.append([])
            self._ahead.append(0)
        return self._levels[depth - 1]

    def take(self) -> list[tuple[pa.RecordBatch, int]]:
        """The oldest pending op completed: what came after it and no later one, in arrival order."""
        if not self._levels:
            return []
        level = self._levels.pop(0)
        self.bytes -= sum(batch.nbytes for batch, _ in level)
        self.records -= sum(batch.num_rows for batch, _ in level) + self._ahead.pop(0)
        return level
