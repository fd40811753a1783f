"""callsinks.py: sinks that hand each batch to code as it arrives: ``to_callable(fn)`` and the print sink.

Neither has a two-phase commit: a batch is handed over when it reaches the
sink instance, so after a recovery the batches since the last checkpoint are
handed over again (at-least-once). For exactly-once output use ``collect()``
or ``to_parquet``. Both run inside the sink's host process (a Ray actor), not
in the driver: ``fn`` is pickled there, and what the print sink prints goes to
that process's standard output, which Ray forwards to the driver's terminal
(a detached job's to its host's log).

Example:
    >>> seen = []
    >>> sink = to_callable(seen.append)
    >>> w = sink.create_writer(InstanceInfo("out", 0, 1))
    >>> w.write(pa.record_batch({"x": [1, 2]}))
    >>> [b.num_rows for b in seen]
    [2]
    >>> print(format_batch(pa.record_batch({"word": ["a", "be"], "count": [4, 12]}), "out[0]"))
    out[0]: 2 rows
    word  count
    a         4
    be       12
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable

import pyarrow as pa

from .logic import InstanceInfo, Sink, SinkWriter
from .validation import _require

__all__ = ["to_callable", "CallableSink", "PrintSink", "format_batch"]

MAX_CELL = 40
"""A printed value longer than this is cut (with ``...``)."""


class _CallWriter(SinkWriter):
    """Calls ``fn(batch)`` for each batch that reaches one sink instance."""

    def __init__(self, fn: Callable[[pa.RecordBatch], Any]) -> None:
        self._fn = fn

    def write(self, batch: pa.RecordBatch) -> None:
        self._fn(batch)


class CallableSink(Sink):
    """``fn(batch)`` per batch, in the sink's host; see :func:`to_callable`."""

    def __init__(self, fn: Callable[[pa.RecordBatch], Any]) -> None:
        self.fn = fn

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return _CallWriter(self.fn)

    def combine(self, results: Iterable[Any]) -> None:
        """There is no result: ``fn`` had the output."""
        return None

    def describe(self) -> str:
        return f"to_callable({getattr(self.fn, '__qualname__', type(self.fn).__name__)})"


def to_callable(fn: Callable[[pa.RecordBatch], Any]) -> Sink:
    """A sink that calls ``fn(batch)`` for each batch as it arrives: at-least-once.

    ``fn`` runs in the sink instance's host process (a Ray actor), one batch at
    a time in arrival order per instance, between the steps of the operators
    there: keep it short, and make it idempotent or tolerant of repeats, since
    after a failure the job recovers from its last checkpoint and the batches
    since then reach ``fn`` again. It is pickled (cloudpickle) into that process,
    so it cannot fill a list of the driver's; use ``collect()`` or ``job.tail()``
    for that. An exception it raises fails the job, naming the sink. The job's
    ``result()`` for this sink is ``None``.

    Args:
        fn: called with each ``pyarrow.RecordBatch`` (never an empty one).

    Returns:
        A :class:`CallableSink`.

    Raises:
        TypeError: ``fn`` is not callable.

    Example::

        def alert(batch):
            for row in batch.filter(pc.greater(batch["errors"], 10)).to_pylist():
                requests.post(WEBHOOK, json=row)   # may post a row twice after a recovery

        flow.source(...).key_by("host").count(emit="updates").sink(chiray.to_callable(alert))
    """
    if not callable(fn):
        raise TypeError(f"to_callable(): expected a function, got {type(fn).__name__}")
    return CallableSink(fn)


class _Printer:
    """Prints each batch as a table headed by the sink instance and its row count."""

    def __init__(self, title: str, max_rows: int) -> None:
        self.title, self.max_rows = title, max_rows

    def __call__(self, batch: pa.RecordBatch) -> None:
        print(format_batch(batch, self.title, self.max_rows), file=sys.stdout, flush=True)


class PrintSink(Sink):
    """Prints each batch as it arrives (``Stream.print()``): at-least-once, as :func:`to_callable`."""

    def __init__(self, max_rows: int = 20) -> None:
        _require("print(): max_rows", max_rows)
        self.max_rows = max_rows

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        title = info.operator if info.parallelism == 1 else str(info)
        return _CallWriter(_Printer(title, self.max_rows))

    def combine(self, results: Iterable[Any]) -> None:
        return None

    def describe(self) -> str:
        return "print()"


def format_batch(batch: pa.RecordBatch | pa.Table, title: str, max_rows: int = 20) -> str:
    """``batch`` (or a table) as a person reads it: a header line, the column names, up to ``max_rows`` rows.

    Numbers are right-aligned, other values left-aligned; nulls print as ``null``; a value longer than
    :data:`MAX_CELL` characters is cut.
    """
    shown = batch.slice(0, max_rows)
    columns = []
    for name, column in zip(batch.schema.names, shown.columns):
        cells = [_cell(v) for v in column.to_pylist()]
        width = max([len(name), *map(len, cells)])
        numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or \
            pa.types.is_decimal(column.type)
        pad = str.rjust if numeric else str.ljust
        columns.append([pad(name, width), *(pad(c, width) for c in cells)])
    lines = [f"{title}: {batch.num_rows} row{'' if batch.num_rows == 1 else 's'}"]
    lines.extend("  ".join(row).rstrip() for row in zip(*columns))
    if batch.num_rows > max_rows:
        lines.append(f"... {batch.num_rows - max_rows} more")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text if len(text) <= MAX_CELL else text[:MAX_CELL - 3] + "..."
