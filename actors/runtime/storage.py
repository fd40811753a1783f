"""storage.py: durable checkpoint storage on any ``pyarrow.fs`` filesystem: state files and manifests.

Layout under the job's root (a local directory or a URI such as
``s3://bucket/prefix``)::

    ROOT/chk-000007/state-count-0.arrow      one file per (operator, instance): the bins it wrote
    ROOT/chk-000007/_MANIFEST.json           written last, atomically: the checkpoint exists
    ROOT/chk-000004/_RETIRED                 a checkpoint retention dropped, kept for files newer ones need
    ROOT/output/SINK/...                     sink output staged per epoch, committed by rename

A state file holds, per bin, a full copy or the bin's changes since its previous
checkpoint (``delta``); a columnar state's whole bins, and its changes, are a
row each (bin ``SHARED_BIN``), a stream with a bin column. The manifest names,
per bin, the files that make it up (``control.ops.chains``), which may lie in
the directories of earlier checkpoints. Retention counts references: it drops
a checkpoint's manifest, deletes the files no retained checkpoint needs, and
keeps the directory (marked ``_RETIRED``) as long as one of its files is still
needed.

A checkpoint directory without a readable manifest, or whose manifest names a
missing state file, is incomplete: listing skips it with a log line (a retired
one silently) and restoring it by name raises :class:`CheckpointError`, as
does a manifest of a format this version does not know. :meth:`verify` also
reads each state file's Arrow footer (a recovery does before it uses a
checkpoint, and falls back to an older one if it fails).

On a local filesystem, state files and manifests are flushed to disk (the file,
then its directory after the rename) before a checkpoint counts as durable, and
the directories created are private to the job's user (0700).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import urllib.parse
import uuid
from typing import Any, Callable, Collection, Iterator, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from chiray.control.ops.chains import ManifestFormatError, manifest_files
from chiray.operators.errors import ChirayError
from chiray.operators.staging import fsync_dir
from chiray.operators.statecodec import BinStream, SharedBins, stream_bins

__all__ = ["CheckpointStorage", "CheckpointError", "MANIFEST", "Manifest", "RETIRED", "child_uri", "split_uri",
           "shown"]

log = logging.getLogger(__name__)

MANIFEST = "_MANIFEST.json"

Manifest: TypeAlias = "dict[str, Any]"
"""A checkpoint's manifest as its JSON (``MANIFEST``) holds it: nested dicts, lists and scalars."""
RETIRED = "_RETIRED"
_CHK = re.compile(r"^chk-(\d+)$")
_BINS_SCHEMA = pa.schema([("bin", pa.int32()), ("data", pa.large_binary()), ("delta", pa.bool_())])
SHARED_BIN = -1
"""The bin of a state file's row that holds several bins in one stream, whole or their changes (``BinStream``)."""
WRITE_BATCH_BYTES = 1 << 20
"""A state file holds its bins in record batches of about this many bytes. Arrow converts a list of
``bytes`` holding the interpreter lock throughout: one batch of a 133 MB full copy (2M keys) held it for
340 ms, and every operator of the process waited that long; a batch of 1 MB holds it for a few ms."""


def _bin_batches(bins: list[int], payloads: list[bytes | pa.Buffer], full: int) -> Iterator[pa.RecordBatch]:
    """The rows of a state file (the first ``full`` are full copies, the rest changes) in record batches of
    about ``WRITE_BATCH_BYTES`` each. A batch's payloads are copied once, joined into its data buffer (not
    converted one by one: at 8M keys, that and writing the file through a buffer in memory took 1 s of CPU
    time per full copy of an instance, most of a background thread's work)."""
    lo = 0
    while lo < len(bins):
        hi, size = lo, 0
        while hi < len(bins) and (hi == lo or size + len(payloads[hi]) <= WRITE_BATCH_BYTES):
            size += len(payloads[hi])
            hi += 1
        part = payloads[lo:hi]
        offsets = np.zeros(len(part) + 1, dtype=np.int64)
        np.cumsum([len(data) for data in part], out=offsets[1:])
        joined = part[0] if len(part) == 1 else b"".join(part)  # (a stream of several bins is not copied)
        data = pa.Array.from_buffers(pa.large_binary(), len(part),
                                     [None, pa.py_buffer(offsets), pa.py_buffer(joined)])
        yield pa.record_batch([pa.array(bins[lo:hi], pa.int32()), data,
                               pa.array(np.arange(lo, hi) >= full, pa.bool_())], schema=_BINS_SCHEMA)
        lo = hi


def _payload_views(column: pa.ChunkedArray) -> Iterator[pa.Buffer]:
    """Each value of a state file's ``data`` column as a view of the file's buffer. Copying a stream of
    several bins out (``to_pylist``, or a scalar's ``as_buffer``) took 0.15-0.18 s for a full copy of 4M
    keys (158 MB), three times as long as reading the file."""
    wide = pa.types.is_large_binary(column.type)
    for chunk in column.chunks:
        if not len(chunk):
            continue
        _, offsets_buffer, data = chunk.buffers()
        if data is None:  # (no value holds a byte)
            data = pa.py_buffer(b"")
        offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
        offsets = offsets[chunk.offset: chunk.offset + len(chunk) + 1].tolist()
        for lo, hi in zip(offsets[:-1], offsets[1:]):
            yield data.slice(lo, hi - lo)


def _aligned(data: pa.Buffer) -> pa.Buffer:
    """``data``, copied where it does not start at a multiple of 8 bytes (the columns decoded from a stream
    are views of it)."""
    return data if data.address % 8 == 0 else pa.py_buffer(data.to_pybytes())


class CheckpointError(ChirayError, RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def child_uri(root: str, *parts: str) -> str:
    """The path or URI of ``parts`` under ``root`` (a local directory or a ``pyarrow.fs`` URI).

    A URI's query string stays at its end: ``child_uri("s3://b/chk?scheme=http", "savepoints")`` is
    ``"s3://b/chk/savepoints?scheme=http"``, where appending to the text would put the path into the query.

    Example:
        >>> child_uri("s3://bucket/chk?endpoint_override=127.0.0.1:9000", "savepoints", "wc-r0123abcd")
        's3://bucket/chk/savepoints/wc-r0123abcd?endpoint_override=127.0.0.1:9000'
        >>> child_uri("/data/chk/", "savepoints")
        '/data/chk/savepoints'
    """
    tail = "/".join(p.strip("/") for p in parts)
    if "://" not in root:
        return f"{root.rstrip('/')}/{tail}"
    uri = urllib.parse.urlsplit(root)
    return urllib.parse.urlunsplit(uri._replace(path=f"{uri.path.rstrip('/')}/{tail}"))


def shown(location: str) -> str:
    """``location`` as messages and logs show it: a URI's secret key (``s3://KEY:SECRET@bucket/...``) masked.

    Example:
        >>> shown("s3://AKIA:wJalr@bucket/chk?scheme=http")
        's3://AKIA:***@bucket/chk?scheme=http'
    """
    if "://" not in location:
        return location
    uri = urllib.parse.urlsplit(location)
    if uri.password is None:
        return location
    return urllib.parse.urlunsplit(uri._replace(netloc=uri.netloc.replace(f":{uri.password}@", ":***@", 1)))


def split_uri(path: str) -> tuple[str, str]:
    """``path`` (a local path or a ``pyarrow.fs`` URI) as (its parent, its last name); a URI's parent keeps
    its query string, the inverse of :func:`child_uri`.

    Example:
        >>> split_uri("s3://bucket/chk/chk-000003?scheme=http")
        ('s3://bucket/chk?scheme=http', 'chk-000003')
    """
    if "://" not in path:
        parent, name = posixpath.split(path.rstrip("/"))
        return parent, name
    uri = urllib.parse.urlsplit(path)
    parent, name = posixpath.split(uri.path.rstrip("/"))
    return urllib.parse.urlunsplit(uri._replace(path=parent)), name


class CheckpointStorage:
    """Reads and writes one job's checkpoints under ``root``.

    Args:
        root: a local directory or a ``pyarrow.fs`` URI.
        create: create ``root`` if missing; ``False`` (reading a checkpoint to restore) raises instead.

    Raises:
        CheckpointError: ``create`` is false and ``root`` is not a directory.

    Safe to use from several processes: every file is written under a temporary
    name and moved into place; the manifest is written last.
    """

    def __init__(self, root: str, create: bool = True):
        self.root_uri = root
        self.shown_root = shown(root)
        self.fs: pafs.FileSystem
        self.root: str
        self.fs, self.root = pafs.FileSystem.from_uri(root) if "://" in root else (
            pafs.LocalFileSystem(), root)
        self._files: dict[int, set[str]] = {}  # complete checkpoint -> the files it needs (retain's)
        if create:
            self.make_dir(self.root)
        elif self.fs.get_file_info(self.root).type != pafs.FileType.Directory:
            raise CheckpointError(f"no checkpoint directory {self.shown_root!r}")

    def make_dir(self, path: str) -> None:
        """Create ``path`` (and its parents); on a local disk the directories created are private to the
        job's user (0700): the state of user functions in a checkpoint is unpickled at restore."""
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except FileExistsError:
                raise CheckpointError(f"cannot create the checkpoint directory {path}: a file is in the way") from None
        else:
            self.fs.create_dir(path, recursive=True)

    def __reduce__(self):
        return (CheckpointStorage, (self.root_uri,))

    # -- paths -------------------------------------------------------------------

    def chk_dir(self, checkpoint_id: int) -> str:
        return posixpath.join(self.root, f"chk-{checkpoint_id:06d}")

    def output_dir(self, sink: str) -> str:
        """Where ``sink`` stages its output: a path or URI like the root's (a sink opens it alone, and a
        path inside an object store, without its URI, would name a local directory)."""
        return child_uri(self.root_uri, "output", sink)

    def _write_atomic(self, path: str, data: bytes | pa.Buffer) -> None:
        self._write_atomic_with(path, lambda out: out.write(data))

    def _write_atomic_with(self, path: str, write: Callable[[pa.NativeFile], object]) -> None:
        """Write ``path`` whole or not at all: ``write(out)`` writes into a temporary file beside it, which
        is then renamed into place."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        local = isinstance(self.fs, pafs.LocalFileSystem)
        try:
            if local:  # durable before the rename, and the rename too
                with open(tmp, "wb") as f:
                    write(pa.PythonFile(f, mode="w"))
                    f.flush()
                    os.fsync(f.fileno())
            else:
                with self.fs.open_output_stream(tmp) as out:
                    write(out)
        except BaseException:  # (a write that fails part way leaves no temporary file behind)
            try:
                if local:
                    os.unlink(tmp)
                else:
                    self.fs.delete_file(tmp)
            except OSError:  # (never created, or the store is what failed)
                pass
            raise
        if local:
            os.replace(tmp, path)
            fsync_dir(posixpath.dirname(path))
        else:
            self.fs.move(tmp, path)

    # -- state files -------------------------------------------------------------

    def state_file(self, checkpoint_id: int, operator: str, index: int) -> str:
        """The path (relative to the root) of the state file of one instance at one checkpoint."""
        return f"chk-{checkpoint_id:06d}/state-{operator}-{index}.arrow"

    def write_state(self, checkpoint_id: int, operator: str, index: int, bins: dict[int, bytes] | BinStream,
                    changes: dict[int, bytes] | BinStream | None = None) -> str:
        """Write one instance's bins: full copies (``bins``) and changes since an earlier checkpoint
        (``changes``), each per bin or several bins in one stream (stored as one row of bin ``SHARED_BIN``);
        returns the file's path (relative to the root, :meth:`state_file`)."""
        self.make_dir(self.chk_dir(checkpoint_id))
        if isinstance(bins, BinStream):
            bins = {SHARED_BIN: bins.payload}
        if isinstance(changes, BinStream):
            changes = {SHARED_BIN: changes.payload}
        changes = changes or {}
        rel = self.state_file(checkpoint_id, operator, index)
        batches = _bin_batches([*bins, *changes], [*bins.values(), *changes.values()], len(bins))

        def write(out: pa.NativeFile) -> None:  # straight into the file, batch by batch
            with ipc.new_file(out, _BINS_SCHEMA) as writer:
                for batch in batches:
                    writer.write_batch(batch)

        self._write_atomic_with(posixpath.join(self.root, rel), write)
        return rel

    def read_parts(self, relative: str, bins: set[int] | None = None,
                   ) -> dict[int, tuple[bytes | SharedBins, bool]]:
        """The bins stored in one state file (only ``bins`` if given): bin -> (payload, whether it holds
        changes rather than a full copy; files of format 1 hold full copies only). The bins of a stream of
        several bins share one payload (``SharedBins``).

        Raises:
            CheckpointError: a stream of several bins whose header cannot be read.
        """
        with self.fs.open_input_file(posixpath.join(self.root, relative)) as f:
            table = ipc.open_file(f).read_all()
        deltas = table.column("delta").to_pylist() if "delta" in table.column_names else [False] * table.num_rows
        out: dict[int, tuple[bytes | SharedBins, bool]] = {}
        for b, view, delta in zip(table.column("bin").to_pylist(), _payload_views(table.column("data")), deltas):
            if b == SHARED_BIN:  # several bins, whole or changes
                data = _aligned(view)
                try:
                    held = stream_bins(data)
                except ValueError as exc:
                    raise CheckpointError(f"state file {relative!r} in {self.shown_root!r}: {exc}") from None
                shared = SharedBins(data)
                out.update((c, (shared, bool(delta))) for c in held if bins is None or c in bins)
            elif bins is None or b in bins:
                out[b] = (view.to_pybytes(), bool(delta))
        return out

    def read_state(self, relative: str, bins: set[int] | None = None) -> dict[int, bytes | SharedBins]:
        """The payloads stored in one state file (only ``bins`` if given)."""
        return {b: data for b, (data, _) in self.read_parts(relative, bins).items()}

    # -- manifests ---------------------------------------------------------------

    def commit(self, checkpoint_id: int, manifest: Manifest) -> None:
        """Write the manifest last and atomically: from now on the checkpoint exists."""
        directory = self.chk_dir(checkpoint_id)
        self.make_dir(directory)
        body = json.dumps({**manifest, "checkpoint_id": checkpoint_id}, sort_keys=True, default=str)
        self._write_atomic(posixpath.join(directory, MANIFEST), body.encode())

    def load(self, checkpoint_id: int) -> Manifest:
        """The manifest of a complete checkpoint.

        Raises:
            CheckpointError: it does not exist, has no manifest, or is corrupt.
        """
        directory = self.chk_dir(checkpoint_id)
        path = posixpath.join(directory, MANIFEST)
        try:
            with self.fs.open_input_stream(path) as f:
                manifest = json.loads(f.read().decode())
        except (FileNotFoundError, OSError) as exc:
            raise CheckpointError(f"checkpoint {checkpoint_id} in {self.shown_root!r} is incomplete or "
                                  f"missing: no readable {MANIFEST} ({exc})") from None
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {checkpoint_id} in {self.shown_root!r} has a corrupt "
                                  f"manifest: {exc}") from None
        for rel in sorted(self.files_of(manifest, checkpoint_id)):
            info = self.fs.get_file_info(posixpath.join(self.root, rel))
            if info.type != pafs.FileType.File:
                raise CheckpointError(f"checkpoint {checkpoint_id} in {self.shown_root!r} is corrupt: "
                                      f"its state file {rel!r} is missing")
        return manifest

    def files_of(self, manifest: Manifest, checkpoint_id: int | None = None) -> set[str]:
        """Every state file ``manifest`` needs, relative to the root.

        Raises:
            CheckpointError: a manifest of a format this version does not read.
        """
        try:
            return manifest_files(manifest)
        except ManifestFormatError as exc:
            which = manifest.get("checkpoint_id", checkpoint_id)
            raise CheckpointError(f"checkpoint {which} in {self.shown_root!r}: {exc}") from None

    def has_manifest(self, checkpoint_id: int) -> bool:
        """Whether checkpoint ``checkpoint_id`` got as far as its manifest (readable or not)."""
        path = posixpath.join(self.chk_dir(checkpoint_id), MANIFEST)
        return self.fs.get_file_info(path).type is not pafs.FileType.NotFound

    def verify(self, manifest: Manifest) -> None:
        """Read the footer of every state file of a loaded checkpoint.

        Raises:
            CheckpointError: a state file is not a readable Arrow file (truncated, emptied, corrupt).
        """
        for rel in sorted(self.files_of(manifest)):
            try:
                with self.fs.open_input_file(posixpath.join(self.root, rel)) as f:
                    ipc.open_file(f).schema
            except (OSError, pa.ArrowInvalid) as exc:
                raise CheckpointError(f"checkpoint {manifest.get('checkpoint_id')} in {self.shown_root!r} is "
                                      f"corrupt: its state file {rel!r} is unreadable ({exc})") from None

    def checkpoint_ids(self) -> list[int]:
        """Every chk-N directory, complete or not, ascending."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        ids = [int(m.group(1)) for i in infos if i.type == pafs.FileType.Directory
               and (m := _CHK.match(i.base_name))]
        return sorted(ids)

    def committed(self) -> list[int]:
        """Complete checkpoints, ascending; incomplete or corrupt ones are skipped with a log line."""
        out = []
        for checkpoint_id in self.checkpoint_ids():
            try:
                self.load(checkpoint_id)
            except CheckpointError as exc:
                if not self._retired(checkpoint_id):
                    log.warning("skipping checkpoint: %s", exc)
                continue
            out.append(checkpoint_id)
        return out

    def latest(self) -> Manifest | None:
        """The newest complete checkpoint's manifest, or None."""
        ids = self.committed()
        return self.load(ids[-1]) if ids else None

    def delete(self, checkpoint_id: int) -> None:
        try:
            self.fs.delete_dir(self.chk_dir(checkpoint_id))
        except (FileNotFoundError, OSError):
            pass

    def retain(self, keep: int, taking: Collection[int] = ()) -> None:
        """Drop all but the newest ``keep`` complete checkpoints (and older incomplete ones), and every
        file of theirs that no kept checkpoint needs; the checkpoints in ``taking`` are still being taken
        (a checkpoint started while another ran): their directories stay.

        A checkpoint being taken meanwhile names only files that the newest complete one names too, or
        files of its own (``control.ops.chains``): the files it needs stay.
        """
        ids = self.checkpoint_ids()
        kept: dict[int, set[str]] = {}  # the newest keep complete ones, newest first
        for checkpoint_id in reversed(ids):
            if len(kept) == keep:
                break
            files = self._files.get(checkpoint_id)
            if files is None:  # loaded once (a manifest never changes): not every manifest at every checkpoint
                try:
                    files = self.files_of(self.load(checkpoint_id))
                except CheckpointError:
                    continue  # incomplete (or being taken)
                self._files[checkpoint_id] = files
            kept[checkpoint_id] = files
        # Not kept and older than the newest kept: complete ones beyond ``keep``, and the directories of
        # checkpoints that failed (what their instances wrote before the failure) or were retired; not
        # those still being taken (an older one can still be, when a later one started meanwhile).
        newest = max(kept, default=0)
        drop = [checkpoint_id for checkpoint_id in ids
                if checkpoint_id < newest and checkpoint_id not in kept and checkpoint_id not in taking]
        if not drop:
            return
        needed = set().union(*kept.values())
        for checkpoint_id in drop:
            self._drop(checkpoint_id, needed)
            self._files.pop(checkpoint_id, None)

    def _retired(self, checkpoint_id: int) -> bool:
        path = posixpath.join(self.chk_dir(checkpoint_id), RETIRED)
        return self.fs.get_file_info(path).type is pafs.FileType.File

    def _drop(self, checkpoint_id: int, needed: set[str]) -> None:
        """Delete checkpoint ``checkpoint_id`` but for the files of it in ``needed``; a directory that keeps
        some is marked retired (its manifest gone, it is no checkpoint any more)."""
        prefix = f"chk-{checkpoint_id:06d}/"
        if not any(rel.startswith(prefix) for rel in needed):
            self.delete(checkpoint_id)
            return
        directory = self.chk_dir(checkpoint_id)
        if not self._retired(checkpoint_id):
            self._write_atomic(posixpath.join(directory, RETIRED), b"")
        infos = self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        for info in infos:
            if info.base_name != RETIRED and prefix + info.base_name not in needed:
                try:
                    if info.type == pafs.FileType.Directory:
                        self.fs.delete_dir(info.path)
                    else:
                        self.fs.delete_file(info.path)
                except (FileNotFoundError, OSError):
                    pass

