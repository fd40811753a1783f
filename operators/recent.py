"""recent.py: the newest rows that reached a sink instance, kept for ``job.tail()``, and their merge across instances.

Each sink instance keeps references to the newest batches it wrote, with when
they arrived, until they hold :data:`TAIL_ROWS` rows: no copy, and no more
memory than the last few batches. ``job.tail(sink, n)`` asks every instance for
its newest ``n`` rows and :func:`newest_rows` merges them by arrival time.
Rows count as they reach the sink, committed or not: a tail is a look at a
running job, not its exactly-once output.

Example:
    >>> recent = RecentRows(limit=3, clock=iter([1.0, 2.0]).__next__)
    >>> recent.add(pa.record_batch({"x": [1, 2]}))
    >>> recent.add(pa.record_batch({"x": [3, 4]}))
    >>> newest_rows(recent.last(3), 3).column("x").to_pylist()
    [2, 3, 4]
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterable

import pyarrow as pa

__all__ = ["TAIL_ROWS", "RecentRows", "newest_rows", "check_tail_rows"]

TAIL_ROWS = 1000
"""The most rows a tail returns (what each sink instance keeps)."""


def check_tail_rows(n: object) -> int:
    """``n`` if it is an int in ``1..TAIL_ROWS``; else ``ValueError``."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= TAIL_ROWS:
        raise ValueError(f"tail: n must be an int from 1 to {TAIL_ROWS} (the rows each sink instance keeps), "
                         f"got {n!r}")
    return n


class RecentRows:
    """The newest batches one sink instance wrote (at least ``limit`` rows once that many came), with their
    arrival times. Only the owning sink instance adds; ``last`` may be read between its steps."""

    def __init__(self, limit: int = TAIL_ROWS, clock: Callable[[], float] = time.time) -> None:
        self.limit = limit
        self._clock = clock
        self._batches: collections.deque[tuple[float, pa.RecordBatch]] = collections.deque()
        self._rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Keep ``batch`` (arrived now); drop the oldest batches the newest ``limit`` rows do not need."""
        if not batch.num_rows:
            return
        self._batches.append((self._clock(), batch))
        self._rows += batch.num_rows
        while self._rows - self._batches[0][1].num_rows >= self.limit:
            self._rows -= self._batches.popleft()[1].num_rows

    def last(self, n: int) -> list[tuple[float, pa.RecordBatch]]:
        """The newest ``n`` rows (fewer if fewer came) as ``(arrival time, batch)``, oldest first."""
        out: list[tuple[float, pa.RecordBatch]] = []
        need = n
        for at, batch in reversed(self._batches):
            if need <= 0:
                break
            take = min(need, batch.num_rows)
            out.append((at, batch.slice(batch.num_rows - take)))
            need -= take
        return out[::-1]


def newest_rows(parts: Iterable[tuple[float, pa.RecordBatch]], n: int,
                schema: pa.Schema | None = None) -> pa.Table:
    """The newest ``n`` rows of ``parts`` (from any instances) by arrival time, oldest first.

    Returns:
        A table; without rows, an empty one of ``schema`` (or with no columns when it is unknown).
    """
    ordered = sorted(parts, key=lambda part: part[0])
    if not ordered:
        return schema.empty_table() if schema is not None else pa.table({})
    table = pa.Table.from_batches([b for _, b in ordered])
    return table.slice(max(table.num_rows - n, 0))
