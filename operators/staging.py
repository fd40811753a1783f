"""staging.py: staged output files in one directory and their two-phase commit.

A sink writer writes *hidden* files (``.NAME.inprogress`` while open). At a
checkpoint barrier it closes them and renames them to *staged* names that
carry the epoch: ``.{prefix}-e{epoch}-{n}{ext}.staged``. When the checkpoint
commits, the controller renames staged files to their visible names
``part-{prefix}-e{epoch}-{n}{ext}`` (idempotently, so a re-created controller
can finish an interrupted commit). On recovery, every hidden file of the sink
that no committed checkpoint names is deleted: replay writes it again.

A writer's prefix is ``{operator}-{run}-{index}``: the *run* (``new_run_id``)
names one life of a job (a submit; a restore is a new run, a recovery is
not), so a job restored into the directory of the job it came from, or two
jobs that share a directory, never write, replace or discard each other's
files: a recovery discards only its own run's hidden files.

While a job runs, its sinks hold a *claim* on their directory (a hidden
``.live-{run}.json`` naming the job); a job whose sink directory holds
another run's claim is refused at submit.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import time
from typing import Iterable

import pyarrow.fs as pafs

from chiray.operators.errors import ChirayError

__all__ = ["StagingArea", "epoch_label", "new_run_id", "RUN_PATTERN", "OutputInUseError", "fsync_dir",
           "fsync_file", "hidden_name", "new_writer_token"]


def fsync_file(path: str) -> None:
    """Flush a closed local file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str) -> None:
    """Flush a local directory's entries (a rename into it) to disk; a no-op where directories cannot be
    opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OutputInUseError(ChirayError, ValueError):
    """A sink's directory holds the output of another job that is running (raised at submit)."""

RUN_PATTERN = r"r[0-9a-f]{8}"
"""What a run id looks like (``new_run_id``)."""


def new_run_id() -> str:
    """A fresh run id: ``r`` and 8 hex digits (one per job life; part of every output file's name)."""
    return "r" + secrets.token_hex(4)


def hidden_name(prefix: str, writer: str, n: int) -> str:
    """The name of a writer's ``n``-th in-progress file. ``writer`` (``new_writer_token``) is one writer's
    own: a sink instance on a host being killed may still write for a moment while its replacement starts,
    and with one name for both, the replacement's file would be truncated under the old writer's open
    handle, both writing into it (a committed file that Parquet then could not read)."""
    return f".{prefix}-{writer}-w{n}.inprogress"


def new_writer_token() -> str:
    """A fresh token for one sink writer's in-progress files (``hidden_name``)."""
    return secrets.token_hex(4)


def check_run_id(run: str) -> str:
    if not isinstance(run, str) or not re.fullmatch(RUN_PATTERN, run):
        raise ValueError(f"run id must be 'r' and 8 hex digits (new_run_id()), got {run!r}")
    return run


def epoch_label(epoch: int | str) -> str:
    """``e000007`` for checkpoint epoch 7, ``efinal`` for end of input (sorts last)."""
    return f"e{epoch:06d}" if isinstance(epoch, int) else f"e{epoch}"


class StagingArea:
    """Files of one directory on the local disk or a ``pyarrow.fs`` filesystem."""

    def __init__(self, directory: str, filesystem: pafs.FileSystem | None = None):
        self.directory = os.fspath(directory)
        self.filesystem = filesystem

    def path(self, name: str) -> str:
        if self.filesystem is None:
            return os.path.join(self.directory, name)
        return f"{self.directory.rstrip('/')}/{name}"

    def makedirs(self) -> None:
        if self.filesystem is None:
            os.makedirs(self.directory, exist_ok=True)
        else:
            self.filesystem.create_dir(self.directory, recursive=True)

    def flush(self, path: str) -> None:
        """A closed file's data reaches the disk (local files; object stores are durable at close)."""
        if self.filesystem is None or isinstance(self.filesystem, pafs.LocalFileSystem):
            fsync_file(path)

    def flush_directory(self) -> None:
        """Renames into the directory reach the disk (local files)."""
        if self.filesystem is None or isinstance(self.filesystem, pafs.LocalFileSystem):
            fsync_dir(self.directory)

    def exists(self, path: str) -> bool:
        if self.filesystem is None:
            return os.path.exists(path)
        return self.filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def rename(self, src: str, dst: str) -> None:
        if self.filesystem is None:
            os.replace(src, dst)
        else:
            self.filesystem.move(src, dst)

    def delete(self, path: str) -> None:
        if self.filesystem is None:
            if os.path.exists(path):
                os.remove(path)
        elif self.exists(path):
            self.filesystem.delete_file(path)

    def names(self) -> list[str]:
        """File names in the directory (none if it does not exist)."""
        if self.filesystem is None:
            return sorted(os.listdir(self.directory)) if os.path.isdir(self.directory) else []
        infos = self.filesystem.get_file_info(pafs.FileSelector(self.directory, allow_not_found=True))
        return sorted(posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File)

    # -- staged names ------------------------------------------------------------

    @staticmethod
    def staged_name(prefix: str, epoch: int | str, n: int, ext: str) -> str:
        return f".{prefix}-{epoch_label(epoch)}-{n}{ext}.staged"

    @staticmethod
    def visible_name(staged: str) -> str:
        base = posixpath.basename(staged)
        assert base.startswith(".") and base.endswith(".staged"), f"bug: not a staged name: {staged}"
        return "part-" + base[1:-len(".staged")]

    def commit(self, staged: Iterable[str]) -> list[str]:
        """Make staged files visible; already committed ones are skipped. Returns the visible paths."""
        done = []
        for path in staged:
            final = self.path(self.visible_name(path))
            if self.exists(path):
                self.rename(path, final)
            elif not self.exists(final):
                raise FileNotFoundError(f"staged output {path} is gone and was never committed")
            done.append(final)
        if done:
            self.flush_directory()
        return done

    def discard(self, prefix: str, keep: Iterable[str] = ()) -> list[str]:
        """Delete hidden files of ``prefix`` (staged or in progress) except ``keep``; returns them."""
        keep_names = {posixpath.basename(k) for k in keep}
        gone = []
        for name in self.names():
            if name.startswith(f".{prefix}-") and name not in keep_names:
                self.delete(self.path(name))
                gone.append(name)
        return gone

    def visible(self, prefix: str) -> list[str]:
        """Committed files of ``prefix``, sorted (epoch order, then instance and number)."""
        return [self.path(n) for n in self.names() if n.startswith(f"part-{prefix}-")]

    # -- claims of running jobs ----------------------------------------------------

    @staticmethod
    def claim_name(run: str) -> str:
        return f".live-{run}.json"

    def claims(self) -> dict[str, dict]:
        """Run -> the claim it holds on this directory (job, sink, since); unreadable claims count too."""
        out = {}
        for name in self.names():
            m = re.fullmatch(rf"\.live-({RUN_PATTERN})\.json", name)
            if m is None:
                continue
            try:
                with self._open_read(self.path(name)) as f:
                    out[m.group(1)] = json.loads(f.read())
            except (OSError, ValueError):
                out[m.group(1)] = {}
        return out

    def claim(self, run: str, job: str, sink: str) -> None:
        """Mark this directory as written by ``run`` of ``job`` (its ``sink``) until :meth:`release`.

        Raises:
            OutputInUseError: another run holds a claim here (a job that is running, or one that
                ended without releasing it: its driver died).
        """
        others = {r: c for r, c in self.claims().items() if r != run}
        if others:
            other_run, other = sorted(others.items())[0]
            raise OutputInUseError(
                f"sink {sink!r} of job {job!r}: directory {self.directory} holds the output of job "
                f"{other.get('job', '?')!r} (run {other_run}, sink {other.get('sink', '?')!r}), which is "
                f"running; give one of them another directory or stop the other first (if that job is gone, "
                f"delete {self.path(self.claim_name(other_run))})")
        self.makedirs()
        body = json.dumps({"job": job, "sink": sink, "run": run, "since": time.time()})
        with self._open_write(self.path(self.claim_name(run))) as f:
            f.write(body.encode())

    def release(self, run: str) -> None:
        """Drop ``run``'s claim (idempotent)."""
        self.delete(self.path(self.claim_name(run)))

    def _open_read(self, path: str):
        return self.filesystem.open_input_stream(path) if self.filesystem is not None else open(path, "rb")

    def _open_write(self, path: str):
        return self.filesystem.open_output_stream(path) if self.filesystem is not None else open(path, "wb")
