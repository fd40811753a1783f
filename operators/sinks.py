"""sinks.py: the built-in sinks: collect (to the driver) and Parquet files, both exactly-once.

A :class:`logic.Sink` is cloudpickled into the sink's host actors; each sink
instance gets one :class:`logic.SinkWriter` from ``create_writer``. Writers
never make output visible themselves (two-phase commit, see ``staging``):

* at a checkpoint barrier, ``prepare_commit(epoch)`` stages what was written
  since the previous barrier and returns it; the controller calls
  ``Sink.commit`` once the checkpoint's manifest is durable;
* at end of input, ``finish()`` stages the rest; the driver commits it when
  every sink instance has finished;
* on recovery, ``Sink.recover`` finishes the last checkpoint's commit and
  deletes whatever else was staged, since replay writes it again.

Example:
    >>> from chiray.operators.logic import InstanceInfo
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

from chiray.operators.batch import compacted
from chiray.operators.fspaths import resolve
from chiray.operators.logic import InstanceInfo, Sink, SinkWriter
from chiray.operators.staging import RUN_PATTERN, StagingArea, check_run_id, hidden_name, new_writer_token

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
    """Keeps one instance's batches; with a durable output directory, stages them per epoch.

    Lifecycle: ``write()* [prepare_commit()]* -> finish() | abort()``.
    """

    def __init__(self, info: InstanceInfo, area: StagingArea | None, run: str = "") -> None:
        self._where = f"collect sink {info}"
        self._prefix = f"{_prefix(info.operator, run)}-{info.index}"
        self._area = area
        self._schema: pa.Schema | None = None
        self._batches: list[pa.RecordBatch] = []
        self._staged: list[str] = []

    def write(self, batch: pa.RecordBatch) -> None:
        self._schema = _check_schema(self._where, self._schema, batch)
        self._batches.append(batch)

    def prepare_commit(self, epoch: int) -> list[str]:
        """Durable mode: write this epoch's batches to one staged Arrow file; else keep them."""
        if self._area is None or not self._batches:
            return []
        path = self._area.path(StagingArea.staged_name(self._prefix, epoch, 0, ".arrow"))
        table = pa.Table.from_batches(self._batches)
        with self._area.filesystem.open_output_stream(path) if self._area.filesystem else open(path, "wb") as f:
            with pa.ipc.new_file(f, table.schema) as writer:
                writer.write_table(table)
        self._area.flush(path)
        self._batches.clear()
        self._staged.append(path)
        return [path]

    def finish(self) -> dict[str, list]:
        """The batches since the last epoch (they travel to the driver) and every file staged so far."""
        return {"batches": [compacted(b) for b in self._batches], "staged": list(self._staged)}

    def abort(self) -> None:
        self._batches.clear()


_PART = re.compile(rf"^part-(?P<op>.+?)(?:-(?P<run>{RUN_PATTERN}))?-(?P<index>\d+)-e(?P<epoch>\d+|final)-(?P<n>\d+)\.\w+$")


def _take_back(area: StagingArea, operator: str, run: str, checkpoint_id: int) -> None:
    """Delete ``run``'s committed files of ``operator`` from epochs after ``checkpoint_id``."""
    for name in area.names():
        m = _PART.match(name)
        if _ours(m, operator, run) and m is not None and m.group("epoch").isdigit() \
                and int(m.group("epoch")) > checkpoint_id:
            area.delete(area.path(name))


def _prefix(operator: str, run: str) -> str:
    """The name prefix of one run of a sink's files: ``{operator}-{run}`` (``{operator}`` unbound)."""
    return f"{_safe_name(operator)}-{run}" if run else _safe_name(operator)


def _ours(match: re.Match | None, operator: str, run: str) -> bool:
    """A committed file's name (``_PART.match``) is of ``operator``'s sink and, if ``run`` is set, that run."""
    return (match is not None and match.group("op") == _safe_name(operator)
            and (not run or match.group("run") == run))


class CollectSink(Sink):
    """Collects the output into one ``pa.Table`` on the driver (for tests and small results).

    Bound to a durable directory (the runtime does so when checkpoints are
    on), each checkpoint epoch's output is staged there and committed with the
    checkpoint, so a recovery neither loses nor repeats collected records.
    """

    def __init__(self, schema: pa.Schema | None = None, output_dir: str | None = None,
                 name: str | None = None, run: str = "") -> None:
        self._schema = schema
        self.output_dir = output_dir
        self.name = name
        self.run = run

    def _area(self) -> StagingArea | None:
        if self.output_dir is None:
            return None
        fs, path = (pafs.FileSystem.from_uri(self.output_dir) if "://" in self.output_dir
                    else (None, self.output_dir))
        return StagingArea(path, fs)

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        area = self._area()
        if area is not None:
            area.makedirs()
        return CollectWriter(info, area, self.run)

    def bind_schema(self, schema: pa.Schema | None) -> "CollectSink":
        """A copy that knows the stream's schema, so an empty result keeps its columns."""
        if self._schema is not None or schema is None:
            return self
        return CollectSink(schema, self.output_dir, self.name, self.run)

    def bind_output(self, directory: str, name: str, run: str = "") -> "CollectSink":
        """A copy that stages checkpoint epochs of ``run`` in ``directory`` (a path or ``pyarrow.fs`` URI)."""
        return CollectSink(self._schema, directory, name, check_run_id(run) if run else "")

    def commit(self, staged: Iterable[Any]) -> list[str]:
        area = self._area()
        return area.commit(p for paths in staged for p in (paths or [])) if area else []

    def commit_final(self, results: Iterable[Any]) -> None:
        """Commit every file the instances staged (the final batches travel to the driver by value)."""
        self.commit([r["staged"] for r in results if isinstance(r, dict)])

    def recover(self, committed: Iterable[Any]) -> None:
        area = self._area()
        if area is not None and self.name is not None:
            keep = [p for paths in committed for p in (paths or [])]
            area.commit(keep)
            area.discard(_prefix(self.name, self.run))

    def take_back(self, checkpoint_id: int) -> None:
        area = self._area()
        if area is not None and self.name is not None and self.run:
            _take_back(area, self.name, self.run, checkpoint_id)

    def _committed_batches(self) -> list[pa.RecordBatch]:
        area = self._area()
        if area is None or self.name is None:
            return []
        files = []
        for name in area.names():
            m = _PART.match(name)
            if m is not None and _ours(m, self.name, self.run):
                files.append((m.group("epoch"), int(m.group("index")), int(m.group("n")), area.path(name)))
        batches: list[pa.RecordBatch] = []
        for *_, path in sorted(files):
            with area.filesystem.open_input_file(path) if area.filesystem else open(path, "rb") as f:
                batches.extend(pa.ipc.open_file(f).read_all().to_batches())
        return batches

    def combine(self, results: Iterable[Any]) -> pa.Table:
        """Committed epochs first (epoch order), then each instance's final batches in instance order.

        Returns:
            One table; when there are no batches, an empty table with the
            sink's schema if known, else ``pa.table({})``.

        Raises:
            ValueError: two instances produced different schemas.
        """
        finals = [r["batches"] if isinstance(r, dict) else (r or []) for r in results]
        batches = self._committed_batches() + [b for result in finals for b in result]
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


class _EpochFiles:
    """The in-progress files of one epoch of a :class:`ParquetWriter`: one open, the rest closed."""

    __slots__ = ("writer", "open", "rows", "closed")

    def __init__(self) -> None:
        self.writer: pq.ParquetWriter | None = None
        self.open: str | None = None
        self.rows = 0  # in the open file
        self.closed: list[str] = []

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        assert self.open is not None
        self.closed.append(self.open)
        self.writer, self.open, self.rows = None, None, 0


class ParquetWriter(SinkWriter):
    """Writes one instance's batches to hidden Parquet files, staged per epoch.

    Open files are ``.{op}-{run}-{index}-{writer}-w{k}.inprogress`` (``staging.hidden_name``: each writer's
    own); ``prepare_commit(epoch)``
    closes them and renames them to staged names carrying the epoch; a new file
    starts every ``max_rows_per_file`` rows. Batches of later epochs (those that
    came after a pending checkpoint's barrier: ``write_ahead``) go to files of
    their own, staged by the ``prepare_commit`` of their epoch. Only the owning
    sink instance touches a writer; ``abort()`` is idempotent and deletes hidden
    files only.
    """

    def __init__(self, sink: "ParquetSink", info: InstanceInfo) -> None:
        self._sink = sink
        self._area = sink.area()
        self._where = f"parquet sink {info}"
        self._prefix = f"{_prefix(info.operator, sink.run)}-{info.index}"
        self._token = new_writer_token()
        self._schema: pa.Schema | None = None
        self._next_file = 0
        self._epochs: list[_EpochFiles] = [_EpochFiles()]  # the epoch being written, then those ahead
        self._staged: list[str] = []  # everything staged by this writer (committed or not)
        self._area.makedirs()

    def write(self, batch: pa.RecordBatch) -> None:
        self._write(self._epochs[0], batch)

    def write_ahead(self, batch: pa.RecordBatch, epochs: int) -> bool:
        while len(self._epochs) <= epochs:
            self._epochs.append(_EpochFiles())
        self._write(self._epochs[epochs], batch)
        return True

    def _write(self, files: _EpochFiles, batch: pa.RecordBatch) -> None:
        self._schema = _check_schema(self._where, self._schema, batch)
        limit = self._sink.max_rows_per_file
        start = 0
        while start < batch.num_rows:
            if files.writer is None:
                files.open = self._area.path(hidden_name(self._prefix, self._token, self._next_file))
                self._next_file += 1
                files.writer = pq.ParquetWriter(files.open, self._schema, filesystem=self._sink.filesystem)
            take = min(batch.num_rows - start, limit - files.rows)
            files.writer.write_batch(batch.slice(start, take))
            files.rows += take
            start += take
            if files.rows >= limit:
                files.close()

    def prepare_commit(self, epoch: int | str) -> list[str]:
        """Close this epoch's files and give them staged names; returns the staged paths. The next epoch's
        files (written ahead) are the ones written from now on."""
        files = self._epochs[0]
        files.close()
        staged = []
        for n, path in enumerate(files.closed):
            target = self._area.path(StagingArea.staged_name(self._prefix, epoch, n, ".parquet"))
            self._area.flush(path)
            self._area.rename(path, target)
            staged.append(target)
        self._epochs.pop(0)  # (only now: until every file is staged, an abort still deletes them)
        if not self._epochs:
            self._epochs.append(_EpochFiles())
        self._staged.extend(staged)
        return staged

    def finish(self) -> list[str]:
        """Stage the rest; return everything this writer staged.

        The driver commits all of it once every instance has finished: then
        the whole output of this run is final, including epochs whose
        checkpoint never completed (committing twice is harmless).
        """
        rest = _EpochFiles()
        for files in self._epochs:  # (only one: every checkpoint completes before the input ends)
            files.close()
            rest.closed.extend(files.closed)
        self._epochs = [rest]
        self.prepare_commit("final")
        return list(self._staged)

    def abort(self) -> None:
        for files in self._epochs:
            files.close()
            for path in files.closed:
                self._area.delete(path)
        self._epochs = [_EpochFiles()]


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
        self.name: str | None = None
        self.run = ""

    def area(self) -> StagingArea:
        return StagingArea(self.directory, self.filesystem)

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return ParquetWriter(self, info)

    def bind_output(self, directory: str, name: str, run: str = "") -> "ParquetSink":
        """Parquet output stays in its own directory; the sink's name and the job's run are recorded."""
        bound = ParquetSink(self.directory, self.filesystem, self.max_rows_per_file)
        bound.name, bound.run = name, check_run_id(run) if run else ""
        return bound

    def claim(self, job: str) -> None:
        """Refuse a directory that holds another running job's output; else hold it for this run."""
        if self.run and self.name is not None:
            self.area().claim(self.run, job, self.name)

    def release(self) -> None:
        if self.run:
            self.area().release(self.run)

    def commit(self, staged: Iterable[Any]) -> list[str]:
        return self.area().commit(p for paths in staged for p in (paths or []))

    def recover(self, committed: Iterable[Any]) -> None:
        area = self.area()
        area.commit(p for paths in committed for p in (paths or []))
        if self.name is not None:
            area.discard(_prefix(self.name, self.run))

    def take_back(self, checkpoint_id: int) -> None:
        if self.name is not None and self.run:
            _take_back(self.area(), self.name, self.run, checkpoint_id)

    def combine(self, results: Iterable[Any]) -> list[str]:
        """Every file this sink committed in this run (all runs' when unbound), sorted."""
        names = self.area().names()
        return sorted(self.area().path(n) for n in names
                      if (m := _PART.match(n)) and (self.name is None or _ours(m, self.name, self.run)))

    def describe(self) -> str:
        return f"to_parquet({self.directory!r})"


def to_parquet(
    directory: str,
    *,
    filesystem: pafs.FileSystem | None = None,
    max_rows_per_file: int = 1_000_000,
) -> Sink:
    """A sink that writes Parquet files, visible only once committed.

    Each sink instance writes hidden files in ``directory``; they become
    ``part-{op}-{run}-{index}-e{epoch}-{n}.parquet`` by atomic rename when the
    checkpoint of their epoch commits (or, for the output after the last
    checkpoint, when every sink instance has finished). The job's result is the
    sorted list of the paths its run committed.

    The guarantee: every record reaches exactly one committed file, across
    recoveries, rescales, stops and restores. ``{run}`` names the job's life
    (a submit or a restore; a recovery keeps it), so a job restored into the
    directory of the job it came from adds files beside that job's and never
    replaces one. A directory in which another job is running is refused at
    submit. Readers see a record only once its checkpoint (or the job's end)
    committed it; a stopped or failed job leaves only committed files and its
    own hidden ones, which its recovery or the next run ignores.

    Args:
        directory: the output directory (created if needed): a local path, a
            path in ``filesystem``, or a ``pyarrow.fs`` URI
            (``file:///data/out``, ``s3://bucket/out?region=eu-west-1``).
        filesystem: a ``pyarrow.fs`` filesystem for a plain path; ``None``:
            the local one (or the one a URI names).
        max_rows_per_file: rows per file before a writer starts the next one.

    Returns:
        A :class:`ParquetSink`.

    Raises:
        ValueError: ``max_rows_per_file`` is not a positive int, or a URI was
            given with ``filesystem=``.

    Example:
        >>> sink = to_parquet("s3://my-bucket/counts")  # doctest: +SKIP
    """
    if isinstance(max_rows_per_file, bool) or not isinstance(max_rows_per_file, int) or max_rows_per_file <= 0:
        raise ValueError(f"to_parquet: max_rows_per_file must be a positive int, got {max_rows_per_file!r}")
    fs, path = resolve("to_parquet", directory, filesystem)
    return ParquetSink(path, fs, max_rows_per_file)
