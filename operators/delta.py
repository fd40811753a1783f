"""delta.py: ``to_delta``, a Delta Lake table as a sink committed once per checkpoint (``deltalake``, extra ``delta``).

Writers stage Parquet files as ``to_parquet`` does (hidden in the table's
directory, renamed to a staged name carrying the epoch at each checkpoint
barrier). Once the checkpoint is durable, the sink's commit renames them to
``part-{op}-{run}-{index}-e{epoch}-{n}.parquet`` and adds them to the table in
one Delta transaction whose ``txn`` action records the run's *application id*
(``chiray-{sink}-{run}``) and the checkpoint (the highest epoch it commits;
``FINAL_VERSION`` for the output after the last checkpoint). Before adding,
the commit reads that version back from the table: an epoch at or below it
is in the table already, so a commit repeated after a failure (or a recovery
finishing a checkpoint's commit) adds nothing twice. The commit info names the
sink, the run and the checkpoint too (``chiray.sink``, ``chiray.run``,
``chiray.checkpoint``).

A staged value (what ``prepare_commit`` returns, stored in the checkpoint's
manifest) is JSON: ``{"epoch": 7, "schema": <base64 Arrow schema>, "files":
[[staged path, rows, {partition column: value}], ...]}``.

``deltalake`` is imported when the sink is built or used, never at
``import chiray``.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import time
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chiray.operators.fspaths import resolve
from chiray.operators.logic import InstanceInfo, Sink, SinkWriter
from chiray.operators.sinks import _PART, _check_schema, _ours, _prefix, _safe_name
from chiray.operators.staging import StagingArea, check_run_id, hidden_name, new_writer_token

__all__ = ["to_delta", "DeltaSink", "DeltaWriter", "FINAL_VERSION"]

FINAL_VERSION = 2**63 - 1
"""The ``txn`` version of a run's commit at end of input (above every checkpoint id)."""

MODES = ("append", "overwrite")

_PARTITION_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_boolean,
                    pa.types.is_date32)


def _deltalake() -> Any:
    """The ``deltalake`` module, or an error that says how to install it."""
    try:
        import deltalake
    except ImportError as exc:
        raise ImportError("to_delta needs the deltalake package: pip install 'chiray[delta]' "
                          f"(or pip install deltalake) ({exc})") from exc
    return deltalake


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types a Delta table stores (``large_string`` -> ``string``, ``uint64`` -> ``int64``,
    timestamps in microseconds, Delta's unit...).

    Raises:
        TypeError: a column's type has no Delta counterpart (naming it).
    """
    deltalake = _deltalake()
    fields = []
    for field in schema:
        if pa.types.is_timestamp(field.type):
            field = field.with_type(pa.timestamp("us", field.type.tz))
        try:
            fields.append(pa.schema(deltalake.Schema.from_arrow(pa.schema([field])).to_arrow()).field(0))
        except Exception as exc:  # deltalake raises a bare Exception for an unknown type
            raise TypeError(f"column {field.name!r} has type {field.type}, which a Delta table cannot hold "
                            f"({str(exc).splitlines()[0]})") from None
    return pa.schema(fields)


def _version(epoch: int | str) -> int:
    return FINAL_VERSION if epoch == "final" else int(epoch)


def _partition_value(value: Any) -> str | None:
    """A partition value as the Delta log writes it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# --------------------------------------------------------------------------- writer


class DeltaWriter(SinkWriter):
    """Writes one sink instance's batches to hidden Parquet files in the table's directory, staged per epoch.

    A batch is cast to the table's types and cut by partition value; each
    partition value has its own open file (``.{op}-{run}-{index}-{writer}-w{k}.inprogress``,
    without the partition columns, which the Delta log carries), a new one
    every ``max_rows_per_file`` rows. ``prepare_commit(epoch)`` closes them and
    renames them to staged names carrying the epoch. Only the owning sink
    instance touches a writer; ``abort()`` is idempotent and deletes only files
    not staged yet.
    """

    def __init__(self, sink: DeltaSink, info: InstanceInfo) -> None:
        self._sink = sink
        self._area = sink.area()
        self._where = f"delta sink {info}"
        self._prefix = f"{_prefix(info.operator, sink.run)}-{info.index}"
        self._token = new_writer_token()
        self._schema: pa.Schema | None = None  # the stream's, fixed by the first batch
        self._table_schema: pa.Schema | None = None  # the Delta types, partition columns included
        self._open: dict[tuple, tuple[str, pq.ParquetWriter, int]] = {}  # partition -> (path, writer, rows)
        self._closed: list[tuple[str, int, tuple]] = []  # this epoch's closed files: (path, rows, partition)
        self._next_file = 0
        self._staged: list[dict] = []
        self._area.makedirs()

    def write(self, batch: pa.RecordBatch) -> None:
        self._schema = _check_schema(self._where, self._schema, batch)
        if self._table_schema is None:
            self._table_schema = self._sink.table_schema(batch.schema)
        batch = _fit(self._where, batch, self._table_schema)
        for key, part in _partitions(batch, self._sink.partition_by):
            start = 0
            while start < part.num_rows:
                path, writer, rows = self._open.get(key) or self._new_file(part.schema)
                take = min(part.num_rows - start, self._sink.max_rows_per_file - rows)
                writer.write_batch(part.slice(start, take))
                start += take
                self._open[key] = (path, writer, rows + take)
                if rows + take >= self._sink.max_rows_per_file:
                    self._close(key)

    def _new_file(self, schema: pa.Schema) -> tuple[str, pq.ParquetWriter, int]:
        path = self._area.path(hidden_name(self._prefix, self._token, self._next_file))
        self._next_file += 1
        return path, pq.ParquetWriter(path, schema, filesystem=self._sink.filesystem), 0

    def _close(self, key: tuple) -> None:
        path, writer, rows = self._open.pop(key)
        writer.close()
        self._closed.append((path, rows, key))

    def prepare_commit(self, epoch: int | str) -> dict | None:
        """Close this epoch's files and give them staged names; returns what :meth:`DeltaSink.commit` adds."""
        for key in list(self._open):
            self._close(key)
        if not self._closed:
            return None
        assert self._table_schema is not None
        files = []
        for n, (path, rows, key) in enumerate(self._closed):
            target = self._area.path(StagingArea.staged_name(self._prefix, epoch, n, ".parquet"))
            self._area.flush(path)
            self._area.rename(path, target)
            files.append([target, rows, dict(zip(self._sink.partition_by, map(_partition_value, key)))])
        self._closed.clear()
        staged = {"epoch": epoch, "schema": _encode_schema(self._table_schema), "files": files}
        self._staged.append(staged)
        return staged

    def finish(self) -> list[dict]:
        """Stage the rest; return everything this writer staged (the driver commits what is not in the table)."""
        self.prepare_commit("final")
        return list(self._staged)

    def abort(self) -> None:
        for key in list(self._open):
            self._close(key)
        for path, _, _ in self._closed:
            self._area.delete(path)
        self._closed.clear()


def _fit(where: str, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch``'s columns in ``schema``'s order and types (timestamps cut to the table's unit).

    Raises:
        ValueError: a value does not fit its column's type in the table (naming the column).
    """
    columns = []
    for field in schema:
        column = batch.column(field.name)
        try:
            columns.append(pc.cast(column, field.type, safe=not pa.types.is_timestamp(field.type)))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"{where}: column {field.name!r} of type {column.type} does not fit the table's "
                             f"type {field.type} ({exc})") from exc
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _partitions(batch: pa.RecordBatch, columns: Sequence[str]) -> list[tuple[tuple, pa.RecordBatch]]:
    """``batch`` cut by the values of ``columns``: (values, the rows holding them, without ``columns``)."""
    if not columns:
        return [((), batch)]
    table = pa.Table.from_batches([batch]).append_column("__row", pa.array(range(batch.num_rows), pa.int64()))
    groups = table.group_by(list(columns), use_threads=False).aggregate([("__row", "list")])
    data = batch.drop_columns(list(columns))
    out = []
    for i in range(groups.num_rows):
        key = tuple(groups.column(c)[i].as_py() for c in columns)
        out.append((key, data.take(groups.column("__row_list")[i].values)))
    return out


# --------------------------------------------------------------------------- sink


class DeltaSink(Sink):
    """Appends the output to a Delta Lake table, one transaction per checkpoint; the result is its versions.

    Attributes:
        table_uri: the table's location as ``deltalake`` opens it.
        filesystem: the ``pyarrow.fs`` filesystem of the table's directory
            (``None``: local), where writers stage their files.
        root: the table's directory in ``filesystem``.
        mode: ``"append"``, or ``"overwrite"`` (the run's first commit
            replaces what the table held).
        partition_by: the partition columns.
        storage_options: passed to ``deltalake``.
        max_rows_per_file: a writer starts a new file after this many rows.
        schema: the stream's schema, where known when the graph was built.
    """

    def __init__(self, table_uri: str, filesystem: pafs.FileSystem | None, root: str, mode: str,
                 partition_by: Sequence[str], storage_options: dict[str, str] | None, max_rows_per_file: int,
                 schema: pa.Schema | None = None, name: str | None = None, run: str = "") -> None:
        self.table_uri = table_uri
        self.filesystem = filesystem
        self.root = root
        self.mode = mode
        self.partition_by = tuple(partition_by)
        self.storage_options = storage_options
        self.max_rows_per_file = max_rows_per_file
        self.schema = schema
        self.name = name
        self.run = run

    def _copy(self, **changes: Any) -> DeltaSink:
        fields = dict(table_uri=self.table_uri, filesystem=self.filesystem, root=self.root, mode=self.mode,
                      partition_by=self.partition_by, storage_options=self.storage_options,
                      max_rows_per_file=self.max_rows_per_file, schema=self.schema, name=self.name, run=self.run)
        return DeltaSink(**{**fields, **changes})

    def area(self) -> StagingArea:
        return StagingArea(self.root, self.filesystem)

    def app_id(self) -> str:
        """The ``txn`` application id of this sink's run: ``chiray-{sink}-{run}``."""
        return f"chiray-{_safe_name(self.name or 'to_delta')}-{self.run or 'unbound'}"

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return DeltaWriter(self, info)

    def bind_schema(self, schema: pa.Schema | None) -> DeltaSink:
        """This sink, told the stream's schema: checks the partition columns now (at build time)."""
        if schema is None:
            return self
        self._check_partitions(schema)
        delta_schema(schema)
        return self._copy(schema=schema)

    def bind_output(self, directory: str, name: str, run: str = "") -> DeltaSink:
        """The table stays where it is; the sink's name and the job's run are recorded (the ``txn`` id)."""
        return self._copy(name=name, run=check_run_id(run) if run else "")

    def _check_partitions(self, schema: pa.Schema) -> None:
        for column in self.partition_by:
            if column not in schema.names:
                raise ValueError(f"{self.describe()}: partition column {column!r} is not in the stream, which has "
                                 f"columns {schema.names}")
            kind = schema.field(column).type
            if not any(test(kind) for test in _PARTITION_TYPES):
                raise TypeError(f"{self.describe()}: partition column {column!r} has type {kind}; partition by "
                                f"a string, integer, boolean or date32 column")
        if self.partition_by and len(self.partition_by) == len(schema):
            raise ValueError(f"{self.describe()}: every column is a partition column; a Delta table needs one more")

    def table_schema(self, stream: pa.Schema) -> pa.Schema:
        """The table's schema for ``stream``: the table's own if it exists (checked against ``stream``), else
        ``stream`` in Delta's types."""
        self._check_partitions(stream)
        want = delta_schema(stream)
        table = self._table()
        if table is None:
            return want
        have = pa.schema(table.schema().to_arrow())
        self._check_table(table, have, want)
        return have

    def _check_table(self, table: Any, have: pa.Schema, want: pa.Schema) -> None:
        """Refuse a table whose columns or partitioning differ from what this sink writes."""
        wanted = {f.name: f.type for f in want}
        held = {f.name: f.type for f in have}
        if wanted != held:
            diff = sorted(n for n in wanted.keys() | held.keys() if wanted.get(n) != held.get(n))
            raise ValueError(
                f"{self.describe()}: the table's columns differ from the stream's at {diff}: the table has "
                f"{', '.join(f'{n}: {t}' for n, t in held.items())}; the stream gives "
                f"{', '.join(f'{n}: {t}' for n, t in wanted.items())}")
        partitions = list(table.metadata().partition_columns)
        if partitions != list(self.partition_by):
            raise ValueError(f"{self.describe()}: the table is partitioned by {partitions}, the sink by "
                             f"{list(self.partition_by)}")

    def _table(self) -> Any:
        """The table as ``deltalake`` opens it now, or ``None`` where there is none yet."""
        deltalake = _deltalake()
        if not deltalake.DeltaTable.is_deltatable(self.table_uri, self.storage_options):
            return None
        return deltalake.DeltaTable(self.table_uri, storage_options=self.storage_options)

    def claim(self, job: str) -> None:
        """Check the table against the stream's schema (where known), then hold it for this run.

        Raises:
            OutputInUseError: another running job writes this table.
            ValueError: the table's columns or partition columns differ from the sink's.
        """
        if self.schema is not None:
            self.table_schema(self.schema)
        if self.run and self.name is not None:
            self.area().claim(self.run, job, self.name)

    def release(self) -> None:
        if self.run:
            self.area().release(self.run)

    def commit(self, staged: Iterable[Any]) -> list[int]:
        """Add the staged files of every epoch the table does not hold yet, in one transaction (idempotent).

        Returns:
            The table version it made (``[]``: everything was in the table already).
        """
        values = [v for v in staged if v]
        if not values:
            return []
        table = self._table()
        done = table.transaction_version(self.app_id()) if table is not None else None
        pending = [v for v in values if done is None or _version(v["epoch"]) > done]
        if not pending:
            return []
        schema = _decode_schema(pending[0]["schema"])
        if table is not None:
            self._check_table(table, pa.schema(table.schema().to_arrow()), schema)
        actions = self._add_actions(pending)
        version = max(_version(v["epoch"]) for v in pending)
        epochs = sorted({v["epoch"] for v in pending}, key=_version)
        deltalake = _deltalake()
        properties = deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(self.app_id(), version)],
            custom_metadata=self._metadata("final" if version == FINAL_VERSION else str(version),
                                           **{"chiray.epochs": ",".join(map(str, epochs))}))
        if table is None:
            deltalake.transaction.create_table_with_add_actions(
                self.table_uri, deltalake.Schema.from_arrow(schema), actions,
                mode="append", partition_by=list(self.partition_by) or None, storage_options=self.storage_options,
                commit_properties=properties)
        else:
            mode = "overwrite" if self.mode == "overwrite" and done is None else "append"
            table.create_write_transaction(actions, mode=mode, schema=table.schema(),
                                           partition_by=list(self.partition_by) or None,
                                           commit_properties=properties)
        return [self._table().version()]

    def _add_actions(self, pending: list[dict]) -> list[Any]:
        """Rename the staged files of ``pending`` to their visible names; one ``AddAction`` each."""
        deltalake = _deltalake()
        files = [f for value in pending for f in value["files"]]
        visible = self.area().commit(path for path, _, _ in files)
        now = int(time.time() * 1000)
        return [deltalake.transaction.AddAction(posixpath.basename(path), self._size(path), partition, now, True,
                                                json.dumps({"numRecords": rows}))
                for path, (_, rows, partition) in zip(visible, files)]

    def _size(self, path: str) -> int:
        if self.filesystem is None:
            return os.path.getsize(path)
        return int(self.filesystem.get_file_info(path).size)

    def _metadata(self, checkpoint: str, **more: str) -> dict[str, str]:
        return {"chiray.sink": self.name or "", "chiray.run": self.run, "chiray.checkpoint": checkpoint, **more}

    def commit_final(self, results: Iterable[Any]) -> list[int]:
        """End of input: add what every instance staged and the table does not hold."""
        return self.commit(v for staged in results for v in (staged or []))

    def recover(self, committed: Iterable[Any]) -> None:
        """Finish the restored checkpoint's commit, then delete this run's other staged and unfinished files."""
        self.commit(committed)
        if self.name is not None:
            self.area().discard(_prefix(self.name, self.run))

    def take_back(self, checkpoint_id: int) -> None:
        """Remove from the table the files this run added for epochs after ``checkpoint_id``, in one transaction
        that sets the run's ``txn`` version back to ``checkpoint_id`` (the replay adds those rows again)."""
        table = self._table() if self.name is not None and self.run else None
        if table is None:
            return
        done = table.transaction_version(self.app_id())
        if done is None or done <= checkpoint_id:
            return
        deltalake = _deltalake()
        active = pa.table(table.get_add_actions(flatten=False))
        partitions = (active.column("partition").to_pylist() if "partition" in active.column_names
                      else [None] * active.num_rows)
        now = int(time.time() * 1000)
        removes = []
        for path, size, partition in zip(active.column("path").to_pylist(), active.column("size_bytes").to_pylist(),
                                         partitions):
            m = _PART.match(posixpath.basename(path))
            if m is not None and _ours(m, self.name or "", self.run) and _version(m.group("epoch")) > checkpoint_id:
                values = {k: _partition_value(v) for k, v in (partition or {}).items()}
                removes.append(deltalake.transaction.RemoveAction(path, True, now, size, values))
        table.create_write_transaction(
            removes, mode="append", schema=table.schema(), partition_by=list(self.partition_by) or None,
            commit_properties=deltalake.CommitProperties(
                app_transactions=[deltalake.Transaction(self.app_id(), checkpoint_id)],
                custom_metadata=self._metadata(str(checkpoint_id), **{"chiray.take_back": "true"})))

    def combine(self, results: Iterable[Any]) -> list[int]:
        """The table versions this run's commits made, in order (every run's of this sink when unbound)."""
        table = self._table()
        if table is None:
            return []
        return sorted(h["version"] for h in table.history()
                      if h.get("chiray.sink") == (self.name or "") and (not self.run or h.get("chiray.run") == self.run)
                      and "chiray.take_back" not in h)

    def describe(self) -> str:
        return f"to_delta({self.table_uri!r})"


def to_delta(
    table_uri: str,
    *,
    mode: str = "append",
    partition_by: str | Sequence[str] | None = None,
    storage_options: dict[str, str] | None = None,
    max_rows_per_file: int = 1_000_000,
) -> Sink:
    """A sink that adds the output to a Delta Lake table, exactly once per checkpoint.

    Each sink instance writes Parquet files into the table's directory, hidden
    from the table's readers until the checkpoint of their epoch is durable;
    then one Delta transaction adds every instance's files of that checkpoint.
    That transaction records the job's run and the checkpoint id (the Delta
    ``txn`` action ``chiray-{sink}-{run}``, and the commit info), so a commit
    that is repeated after a failure finds its checkpoint in the table and adds
    nothing. A reader of the table sees the output a checkpoint at a time,
    each checkpoint's rows in one table version, and never a row twice, across
    recoveries; the rows after the last checkpoint arrive in one last version
    when the job ends. A job restored from a savepoint is a new run, whose
    versions follow the old run's. Another job writing the same table is
    refused at submit. The job's result is the list of table versions the run
    made.

    Needs the ``deltalake`` package (``pip install 'chiray[delta]'``).

    Args:
        table_uri: the table: a local path or a URI (``file:///data/t``,
            ``s3://bucket/t``); created at the first commit if it does not
            exist. A query string (``?region=...``) configures the
            ``pyarrow.fs`` filesystem the writers stage files with and is left
            out of what ``deltalake`` opens.
        mode: ``"append"`` (default), or ``"overwrite"``: the run's first
            commit replaces the table's rows, in the same version that adds
            the first checkpoint's (its later commits append). A job
            restored from a savepoint is a new run: restore it with
            ``"append"``, or its first commit replaces what the job it came
            from wrote.
        partition_by: partition column(s): string, integer, boolean or date32.
        storage_options: ``deltalake``'s options for the table's store
            (credentials, endpoint...).
        max_rows_per_file: rows per file before a writer starts the next one.

    Returns:
        A :class:`DeltaSink`.

    Raises:
        ImportError: ``deltalake`` is not installed.
        ValueError: a bad ``mode``, ``partition_by`` or ``max_rows_per_file``;
            at build or submit, a partition column the stream lacks, or a table
            whose columns or partitioning differ from the stream's.
        TypeError: at build, a column type a Delta table cannot hold.

    Example:
        >>> flow.sink(to_delta("s3://my-bucket/counts", partition_by="day"))  # doctest: +SKIP
    """
    _deltalake()
    if mode not in MODES:
        raise ValueError(f"to_delta: mode must be one of {MODES}, got {mode!r}")
    columns = [partition_by] if isinstance(partition_by, str) else list(partition_by or [])
    if not all(isinstance(c, str) and c for c in columns) or len(set(columns)) != len(columns):
        raise ValueError(f"to_delta: partition_by must be distinct column names, got {partition_by!r}")
    if isinstance(max_rows_per_file, bool) or not isinstance(max_rows_per_file, int) or max_rows_per_file <= 0:
        raise ValueError(f"to_delta: max_rows_per_file must be a positive int, got {max_rows_per_file!r}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"to_delta: storage_options must be a dict, got {type(storage_options).__name__}")
    filesystem, root = resolve("to_delta", table_uri, None)
    uri = os.fspath(table_uri).split("?", 1)[0]
    return DeltaSink(uri, filesystem, root, mode, columns, storage_options, max_rows_per_file)
