"""staged.py: staged mode: Spark's executors write Arrow IPC files; sources read them with exact offsets.

For separate Spark and Ray clusters (shared storage in between), for
non-deterministic Spark plans, and for replay after Spark itself is gone.

Layout under the staging path (a local directory or a ``pyarrow.fs`` URI)::

    _attempts/part-00003-<task attempt id>.arrow   written by each task attempt
    part-00003.arrow                               the attempt Spark reported successful
    _manifest.json                                 written last: the staged data set

Each task attempt writes its own file, so retried and speculative attempts
never mix; once the Spark job succeeded the driver moves the successful
attempt's file of every partition into place (the only per-file work on the
driver), deletes the rest and writes the manifest. A split is one file; its
offset counts the batches already emitted, so a reader resumes exactly.

Example:
    >>> src = from_spark(df, staged=True, path="s3://bucket/run-7/")   # doctest: +SKIP
    >>> src = from_staged("s3://bucket/run-7/")  # later, without Spark   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from chiray.operators import Source, SourceSplit, SplitReader

from .push import rechunk

__all__ = ["MANIFEST", "StagedSource", "from_staged", "stage"]

MANIFEST = "_manifest.json"
_SUMMARY = "partition int, attempt bigint, file string, batches int, rows bigint"


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in path:
        path = os.path.abspath(path)
    fs, root = pafs.FileSystem.from_uri(path)
    return fs, root.rstrip("/")


@dataclasses.dataclass(frozen=True)
class _StageTarget:
    filesystem: pafs.FileSystem
    root: str
    schema: pa.Schema
    batch_bytes: int


def _write_partition(target: _StageTarget, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body (on an executor): write this attempt's file; yield a one-row summary."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "bug in spark_bridge: _write_partition outside a Spark task"
    partition, attempt = ctx.partitionId(), ctx.taskAttemptId()
    path = f"{target.root}/_attempts/part-{partition:05d}-{attempt}.arrow"
    count = rows = 0
    with target.filesystem.open_output_stream(path) as out, pa.ipc.new_file(out, target.schema) as writer:
        for batch in rechunk(batches, target.schema, target.batch_bytes):
            writer.write_batch(batch)
            count += 1
            rows += batch.num_rows
    yield pa.RecordBatch.from_pydict(
        {"partition": [partition], "attempt": [attempt], "file": [path], "batches": [count], "rows": [rows]},
        schema=pa.schema(
            [
                ("partition", pa.int32()),
                ("attempt", pa.int64()),
                ("file", pa.string()),
                ("batches", pa.int32()),
                ("rows", pa.int64()),
            ]
        ),
    )


class _FileReader(SplitReader):
    """Reads one staged IPC file batch by batch; offset = batches emitted."""

    def __init__(self, fs: pafs.FileSystem, path: str, offset: int) -> None:
        self._file: Any = fs.open_input_file(path)
        self._reader = pa.ipc.open_file(self._file)
        if not 0 <= offset <= self._reader.num_record_batches:
            raise ValueError(
                f"from_staged: offset {offset} is outside [0, {self._reader.num_record_batches}] for {path}"
            )
        self._next = offset

    def read(self) -> pa.RecordBatch | None:
        if self._file is None or self._next >= self._reader.num_record_batches:
            self.close()
            return None
        batch = self._reader.get_batch(self._next)
        self._next += 1
        return batch

    def offset(self) -> int:
        return self._next

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class StagedSource(Source):
    """Staged Arrow IPC files (see the module doc); needs no Spark to read."""

    def __init__(self, filesystem: pafs.FileSystem, root: str, manifest: dict[str, Any]) -> None:
        self._fs = filesystem
        self._root = root
        self._manifest = manifest
        self._schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(manifest["schema"])))

    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def num_rows(self) -> int:
        return sum(int(p["rows"]) for p in self._manifest["parts"])

    def splits(self) -> list[SourceSplit]:
        return [
            SourceSplit(f"{self._manifest['name']}/{p['file']}", p["file"]) for p in self._manifest["parts"]
        ]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _FileReader(self._fs, f"{self._root}/{split.payload}", 0 if offset is None else int(offset))

    def close(self) -> None:
        """Nothing to release (the files stay; delete the directory when done)."""

    def __enter__(self) -> StagedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bounded(self) -> bool:
        return True

    def describe(self) -> str:
        return str(self._manifest["name"])


def stage(df: Any, schema: pa.Schema, path: str, *, name: str, batch_bytes: int) -> StagedSource:
    """Have Spark's executors write ``df`` under ``path``; commit the successful attempts; return the source.

    Raises:
        FileExistsError: ``path`` already holds a staged data set.
    """
    fs, root = _filesystem(path)
    if fs.get_file_info(f"{root}/{MANIFEST}").type != pafs.FileType.NotFound:
        raise FileExistsError(
            f"from_spark: {path!r} already holds staged data; read it with from_staged(path) "
            "or stage to an empty path"
        )
    fs.create_dir(f"{root}/_attempts", recursive=True)
    target = _StageTarget(fs, root, schema, batch_bytes)
    summaries = df.mapInArrow(functools.partial(_write_partition, target), _SUMMARY).collect()
    parts = []
    for row in sorted(summaries, key=lambda r: r["partition"]):  # Spark returns successful attempts only
        final = f"part-{row['partition']:05d}.arrow"
        fs.move(row["file"], f"{root}/{final}")
        parts.append({"file": final, "batches": row["batches"], "rows": row["rows"]})
    fs.delete_dir(f"{root}/_attempts")  # failed and speculative attempts' files
    manifest = {"name": name, "schema": schema.serialize().to_pybytes().hex(), "parts": parts}
    with fs.open_output_stream(f"{root}/{MANIFEST}.tmp") as out:
        out.write(json.dumps(manifest).encode())
    fs.move(f"{root}/{MANIFEST}.tmp", f"{root}/{MANIFEST}")
    return StagedSource(fs, root, manifest)


def from_staged(path: str) -> StagedSource:
    """A source over data staged earlier by ``from_spark(df, staged=True, path=path)``; Spark is not needed.

    Raises:
        FileNotFoundError: ``path`` holds no complete staged data set (no manifest).
    """
    fs, root = _filesystem(path)
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            manifest = json.loads(f.read().decode())
    except (FileNotFoundError, OSError) as e:
        raise FileNotFoundError(
            f"from_staged: {path!r} holds no complete staged data ({MANIFEST} missing)"
        ) from e
    return StagedSource(fs, root, manifest)
