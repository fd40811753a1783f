"""sinks.py: the built-in sinks (in-memory collect, Parquet files with staged commit).

A :class:`logic.Sink` is cloudpickled into the sink's host actors; each sink
instance gets one :class:`logic.SinkWriter` from ``create_writer`` and the
driver merges their ``finish()`` results with ``combine``.

The Parquet writer separates *staging* (hidden ``.inprogress`` files) from
*commit* (atomic rename to ``part-*.parquet``) so that a checkpoint epoch can
later commit exactly the files it covers (two-phase commit).

Example:
    >>> from operators.logic import InstanceInfo
    >>> sink = collect()
    >>> w = sink.create_writer(InstanceInfo("out", 0, 1))
    >>> w.write(pa.record_batch({"x": [1, 2]}))
    >>> sink.combine([w.finish()]).num_rows
    2
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from operators.logic import InstanceInfo, Sink, SinkWriter

__all__ = ["collect", "to_parquet", "CollectSink", "CollectWriter", "ParquetSink", "ParquetWriter"]


def _check_schema(where: str, expected: pa.Schema | None, batch: pa.RecordBatch) -> pa.Schema:
    """Return the writer's schema, fixing it on the first batch; raise if ``batch`` differs."""
    if not isinstance(batch, pa.RecordBatch):
        raise TypeError(f"{where}: expected a pyarrow.RecordBatch, got {type(batch).__name__}")
    if expected is None:
        return batch.schema
    if not batch.schema.equals(expected):
        raise ValueError(
            f"{where}: batch schema differs from the first batch's schema\n"
            f"expected:\n{expected}\ngot:\n{batch.schema}"
        )
    return expected


# --------------------------------------------------------------------------- collect


class CollectWriter(SinkWriter):
    """Keeps one instance's batches in memory; ``finish()`` returns them as a list.

    Lifecycle: ``write()* -> finish() | abort()``; ``abort`` drops the batches.
    """

    def __init__(self, info: InstanceInfo) -> None:
        self._where = f"collect sink {info}"
        self._schema: pa.Schema | None = None
        self._batches: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        self._schema = _check_schema(self._where, self._schema, batch)
        self._batches.append(batch)

    def finish(self) -> list[pa.RecordBatch]:
        return list(self._batches)

    def abort(self) -> None:
        self._batches.clear()


class CollectSink(Sink):
    """Collects every batch into one ``pa.Table`` on the driver (for tests and small results)."""

    def __init__(self, schema: pa.Schema | None = None) -> None:
        self._schema = schema

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return CollectWriter(info)

    def bind_schema(self, schema: pa.Schema | None) -> "CollectSink":
        """A copy that knows the stream's schema, so an empty result keeps its columns."""
        return self if self._schema is not None or schema is None else CollectSink(schema)

    def combine(self, results: Iterable[Any]) -> pa.Table:
        """Concatenate the instances' batches in instance order.

        Returns:
            One table; when there are no batches, an empty table with the
            sink's schema if known, else ``pa.table({})``.

        Raises:
            ValueError: two instances produced different schemas.
        """
        batches = [b for result in results for b in (result or [])]
        if not batches:
            return self._schema.empty_table() if self._schema is not None else pa.table({})
        schema = self._schema or batches[0].schema
        for b in batches:
            if not b.schema.equals(schema):
                raise ValueError(
                    f"collect sink: sink instances produced different schemas\nexpected:\n{schema}\ngot:\n{b.schema}"
                )
        return pa.Table.from_batches(batches, schema=schema)


def collect(schema: pa.Schema | None = None) -> Sink:
    """A sink that gathers the whole output into one ``pa.Table`` (the job's result).

    Args:
        schema: the output schema, used for the empty result when no batch
            arrives; ``None``: taken from the batches.

    Returns:
        A :class:`CollectSink`.

    Example:
        >>> collect().combine([]).num_rows
        0
    """
    return CollectSink(schema)


# --------------------------------------------------------------------------- parquet


def _safe_name(name: str) -> str:
    """``name`` with every character other than letters, digits, ``-``, ``_`` and ``.`` replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class ParquetWriter(SinkWriter):
    """Writes one instance's batches to staged Parquet files and commits them by rename.

    Files are written as ``.{op}-{index}-{n}.parquet.inprogress`` in the
    target directory, a new one every ``max_rows_per_file`` rows; ``commit()``
    renames every closed staged file to ``part-{op}-{index}-{n}.parquet``.

    Lifecycle: ``write()* [commit()]* -> finish() | abort()``. Only the owning
    sink instance touches a writer. ``abort()`` is idempotent and deletes
    staged files, never committed ones.
    """

    def __init__(self, sink: ParquetSink, info: InstanceInfo) -> None:
        self._sink = sink
        self._where = f"parquet sink {info}"
        self._prefix = f"{_safe_name(info.operator)}-{info.index}"
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | None = None
        self._open: tuple[str, str] | None = None  # (staging path, final path) of the open file
        self._rows_in_file = 0
        self._next_file = 0
        self._staged: list[tuple[str, str]] = []  # (staging path, final path), closed files
        self._committed: list[str] = []
        sink._makedirs()

    def write(self, batch: pa.RecordBatch) -> None:
        self._schema = _check_schema(self._where, self._schema, batch)
        limit = self._sink.max_rows_per_file
        start = 0
        while start < batch.num_rows:
            if self._writer is None:
                self._open_file()
            take = min(batch.num_rows - start, limit - self._rows_in_file)
            self._writer.write_batch(batch.slice(start, take))
            self._rows_in_file += take
            start += take
            if self._rows_in_file >= limit:
                self._close_file()

    def _open_file(self) -> None:
        n = self._next_file
        self._next_file += 1
        staging = self._sink._path(f".{self._prefix}-{n}.parquet.inprogress")
        self._open = (staging, self._sink._path(f"part-{self._prefix}-{n}.parquet"))
        self._writer = pq.ParquetWriter(staging, self._schema, filesystem=self._sink.filesystem)
        self._rows_in_file = 0

    def _close_file(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._staged.append(self._open)
        self._writer, self._open, self._rows_in_file = None, None, 0

    def commit(self) -> list[str]:
        """Close the open file and atomically rename every staged file to its final name.

        Returns:
            The paths committed by this call, in the order they were written.
        """
        self._close_file()
        done = []
        for staging, final in self._staged:
            self._sink._rename(staging, final)
            done.append(final)
        self._staged.clear()
        self._committed.extend(done)
        return done

    def finish(self) -> list[str]:
        """Commit everything written; return every path this writer committed."""
        self.commit()
        return list(self._committed)

    def abort(self) -> None:
        self._close_file()
        for staging, _ in self._staged:
            self._sink._delete(staging)
        self._staged.clear()


class ParquetSink(Sink):
    """Writes the output as Parquet files in one directory; the job's result is the file list.

    Attributes:
        directory: where the files go (created if needed).
        filesystem: a ``pyarrow.fs`` filesystem, or ``None`` for local paths.
        max_rows_per_file: a writer starts a new file after this many rows.
    """

    def __init__(self, directory: str, filesystem: pafs.FileSystem | None, max_rows_per_file: int) -> None:
        self.directory = os.fspath(directory)
        self.filesystem = filesystem
        self.max_rows_per_file = max_rows_per_file

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return ParquetWriter(self, info)

    def combine(self, results: Iterable[Any]) -> list[str]:
        """All committed paths of all instances, sorted."""
        return sorted(p for paths in results for p in (paths or []))

    def describe(self) -> str:
        return f"to_parquet({self.directory!r})"

    def _path(self, name: str) -> str:
        if self.filesystem is None:
            return os.path.join(self.directory, name)
        return f"{self.directory.rstrip('/')}/{name}"

    def _makedirs(self) -> None:
        if self.filesystem is None:
            os.makedirs(self.directory, exist_ok=True)
        else:
            self.filesystem.create_dir(self.directory, recursive=True)

    def _rename(self, src: str, dst: str) -> None:
        if self.filesystem is None:
            os.replace(src, dst)
        else:
            self.filesystem.move(src, dst)

    def _delete(self, path: str) -> None:
        if self.filesystem is None:
            if os.path.exists(path):
                os.remove(path)
        elif self.filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            self.filesystem.delete_file(path)


def to_parquet(
    directory: str,
    *,
    filesystem: pafs.FileSystem | None = None,
    max_rows_per_file: int = 1_000_000,
) -> Sink:
    """A sink that writes Parquet files, visible only once committed.

    Each sink instance stages hidden files in ``directory`` and, at
    ``finish()``, renames them atomically to ``part-{op}-{index}-{n}.parquet``.
    The job's result is the sorted list of committed paths.

    Args:
        directory: the output directory (created if needed).
        filesystem: a ``pyarrow.fs`` filesystem; ``None``: local paths.
        max_rows_per_file: rows per file before a writer starts the next one.

    Returns:
        A :class:`ParquetSink`.

    Raises:
        ValueError: ``max_rows_per_file`` is not a positive int.

    Example:
        >>> sink = to_parquet("/tmp/out")  # doctest: +SKIP
    """
    if isinstance(max_rows_per_file, bool) or not isinstance(max_rows_per_file, int) or max_rows_per_file <= 0:
        raise ValueError(f"to_parquet: max_rows_per_file must be a positive int, got {max_rows_per_file!r}")
    return ParquetSink(directory, filesystem, max_rows_per_file)
