"""querylog.py: a Structured Streaming query's offset and commit logs, rolled back to the epoch a dataflow needs.

A streaming query's checkpoint location holds ``offsets/N`` (the input range
of micro-batch N, written before it runs) and ``commits/N`` (written after
it ran). A query restarted there runs again the newest batch whose commit is
missing, with the range it logged, and then plans new batches from that
batch's end offsets. So, to have a restarted query hand the dataflow every
row from epoch ``e`` on, exactly once: delete ``commits/k`` for ``k >= e``
and ``offsets/k`` for ``k > e``. Spark then runs batch ``e`` again over its
logged range (the same rows: Structured Streaming's replayable sources and a
deterministic plan) and batch ``e + 1`` over everything after it, which the
dataflow, restored to "next epoch ``e``", takes once.

Spark writes the logs through Hadoop's checksummed local file system, so a
log file ``N`` may have a ``.N.crc`` beside it: it goes with its file. The
logs live on a ``pyarrow.fs`` file system (local paths, ``s3://``; Hadoop's
``s3a://`` is read as ``s3://``).

Example:
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for log in ("offsets", "commits"):
    ...     (root / log).mkdir()
    ...     for n in range(4):
    ...         _ = (root / log / str(n)).write_text("v1")
    >>> rollback(str(root), 2)
    RolledBack(next_epoch=2, deleted=(3,), uncommitted=(2, 3))
    >>> sorted(p.name for p in (root / "offsets").iterdir()), sorted(p.name for p in (root / "commits").iterdir())
    (['0', '1', '2'], ['0', '1'])
"""

from __future__ import annotations

import dataclasses
import os

import pyarrow.fs as pafs

from chiray.operators.errors import ChirayError

__all__ = ["QueryLogError", "RolledBack", "logged_batches", "rollback"]


class QueryLogError(ChirayError, ValueError):
    """The query's logs cannot give the epoch the dataflow needs (Spark purged them)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RolledBack:
    """What :func:`rollback` did.

    Attributes:
        next_epoch: the epoch the restarted query runs first (or plans, when it was never logged).
        deleted: the ``offsets`` batches removed.
        uncommitted: the ``commits`` batches removed.
    """

    next_epoch: int
    deleted: tuple[int, ...]
    uncommitted: tuple[int, ...]


def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    if location.startswith("s3a://"):
        location = "s3://" + location[len("s3a://"):]
    if "://" not in location:
        location = os.path.abspath(location)
    elif location.startswith("file://"):
        location = location[len("file://"):]
    fs, root = pafs.FileSystem.from_uri(location) if "://" in location else (pafs.LocalFileSystem(), location)
    return fs, root.rstrip("/")


def logged_batches(fs: pafs.FileSystem, directory: str) -> list[int]:
    """The batch ids logged in ``directory`` (``offsets`` or ``commits``), ascending."""
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(int(i.base_name) for i in infos if i.type == pafs.FileType.File and i.base_name.isdigit())


def _delete(fs: pafs.FileSystem, directory: str, batch: int) -> None:
    for name in (str(batch), f".{batch}.crc"):
        try:
            fs.delete_file(f"{directory}/{name}")
        except FileNotFoundError:
            pass


def rollback(location: str, next_epoch: int) -> RolledBack:
    """Roll the query at checkpoint ``location`` back so that it runs epoch ``next_epoch`` next.

    Args:
        location: the query's checkpoint location (a path or URI).
        next_epoch: the first epoch the dataflow needs (>= 0).

    Raises:
        QueryLogError: the range of ``next_epoch`` can no longer be read (its ``offsets`` or those of the
            batch before it were purged by ``spark.sql.streaming.minBatchesToRetain``).
    """
    if next_epoch < 0:
        raise ValueError(f"from_spark_stream: next_epoch must be >= 0, got {next_epoch}")
    fs, root = _filesystem(location)
    offsets, commits = f"{root}/offsets", f"{root}/commits"
    logged = logged_batches(fs, offsets)
    if not logged or logged[-1] < next_epoch:  # nothing after it was planned: Spark goes on from its logs
        return RolledBack(next_epoch, (), ())
    needed = [e for e in (next_epoch - 1, next_epoch) if e >= 0]
    if any(e not in logged for e in needed):
        raise QueryLogError(
            f"from_spark_stream: the dataflow's checkpoint needs micro-batch {next_epoch}, but the query's "
            f"offset log at {location!r} keeps batches {logged[0]}..{logged[-1]} only; checkpoint the job more "
            "often or raise spark.sql.streaming.minBatchesToRetain"
        )
    uncommitted = tuple(b for b in logged_batches(fs, commits) if b >= next_epoch)
    deleted = tuple(b for b in logged if b > next_epoch)
    for batch in sorted(uncommitted, reverse=True):  # commits first: a crash midway leaves a re-run, not a gap
        _delete(fs, commits, batch)
    for batch in sorted(deleted, reverse=True):
        _delete(fs, offsets, batch)
    return RolledBack(next_epoch, deleted, uncommitted)
