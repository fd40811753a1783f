"""savepoints.py: a job's savepoints: where they go, which there are, and deleting one.

A savepoint is a checkpoint copied to ``DIR/{job}-{run}/chk-N`` (``DIR``
defaults to ``<checkpoint_dir>/savepoints``; ``run`` is the job life that
took it), so the savepoints of two jobs, or of two lives of one job, never
replace each other. Paths are local directories or ``pyarrow.fs`` URIs; a
URI keeps its query string at its end (``storage.child_uri``).

A job's savepoints are those under the default directory in a directory of
one of its lives, and those it took into other directories (which its
handle remembers), each checked against its manifest (the job's name is in
it). One is deleted only if it is a savepoint of that job and no running job
was restored from it (or from a directory that holds it).
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import urllib.parse
from typing import Iterable, Mapping, TypedDict

import pyarrow.fs as pafs

from chiray.operators.staging import RUN_PATTERN

from ..errors import ChirayError
from .jobfiles import dir_bytes
from .jobvalues import EventKind, JobEvent
from ..runtime.storage import CheckpointError, CheckpointStorage, child_uri, split_uri

__all__ = ["SavepointInfo", "SavepointError", "savepoint_root", "life_dir", "find_savepoints", "delete_savepoint",
           "running_restores", "taken_in"]

_CHK = re.compile(r"^chk-(\d+)$")


class SavepointError(ChirayError, ValueError):
    """A savepoint that cannot be deleted: not one of the job's, or a running job was restored from it."""


class SavepointJson(TypedDict):
    """``SavepointInfo.to_json()``: its fields."""

    path: str
    checkpoint_id: int
    created_at: float | None
    size_bytes: int
    run: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class SavepointInfo:
    """One savepoint of a job (``JobHandle.savepoints()``, ``chiray savepoints``).

    Attributes:
        path: its ``chk-N`` directory (``restore_from=`` takes it).
        checkpoint_id: the checkpoint it copies.
        created_at: ``time.time()`` when that checkpoint was taken.
        size_bytes: the bytes of its files.
        run: the run id of the job life that took it (``None`` for a life without one).
    """

    path: str
    checkpoint_id: int
    created_at: float | None
    size_bytes: int
    run: str | None

    def to_json(self) -> SavepointJson:
        """The fields as JSON-able data (what ``chiray savepoints --json`` prints)."""
        return SavepointJson(path=self.path, checkpoint_id=self.checkpoint_id, created_at=self.created_at,
                             size_bytes=self.size_bytes, run=self.run)


def savepoint_root(checkpoint_root: str, dir: str | None = None) -> str:
    """Where a savepoint goes: ``dir``, else ``<checkpoint_root>/savepoints``."""
    return dir or child_uri(checkpoint_root, "savepoints")


def life_dir(root: str, job: str, run: str | None) -> str:
    """The directory of one job life's savepoints under ``root``: ``{root}/{job}-{run}``."""
    return child_uri(root, "-".join(filter(None, (job, run))))


def _key(path: str) -> str:
    """``path`` for comparisons: normalised, a URI without its query (the same place, whatever its options)."""
    if "://" not in path:
        return posixpath.normpath(path)
    uri = urllib.parse.urlsplit(path)
    return f"{uri.scheme}://{uri.netloc}{posixpath.normpath(uri.path) if uri.path else ''}"


def _within(path: str, ancestor: str) -> bool:
    """Whether ``path`` is ``ancestor`` or lies under it."""
    key, top = _key(path), _key(ancestor)
    return key == top or key.startswith(top.rstrip("/") + "/")


def _run_of(job: str, life: str) -> tuple[bool, str | None]:
    """Whether directory name ``life`` is one of ``job``'s lives, and its run id."""
    match = re.fullmatch(rf"{re.escape(job)}(?:-({RUN_PATTERN}))?", life)
    return (match is not None, match.group(1) if match else None)


def _lives(job: str, root: str) -> list[tuple[str, str | None]]:
    """The directories of ``job``'s lives under ``root`` and their run ids (none if ``root`` is missing)."""
    try:
        storage = CheckpointStorage(root, create=False)
    except CheckpointError:
        return []
    out = []
    for info in storage.fs.get_file_info(pafs.FileSelector(storage.root, allow_not_found=True)):
        mine, run = _run_of(job, info.base_name)
        if mine and info.type == pafs.FileType.Directory:
            out.append((child_uri(root, info.base_name), run))
    return out


def _read(job: str, life: str, name: str) -> SavepointInfo | None:
    """The savepoint ``life/name`` of ``job``, or ``None`` (not a complete checkpoint, or another job's)."""
    match = _CHK.match(name)
    if match is None:
        return None
    checkpoint_id = int(match.group(1))
    try:
        storage = CheckpointStorage(life, create=False)
        manifest = storage.load(checkpoint_id)
    except CheckpointError:
        return None
    if manifest.get("job", {}).get("name") != job:
        return None
    created = manifest.get("created")
    return SavepointInfo(child_uri(life, name), checkpoint_id, None if created is None else float(created),
                         dir_bytes(storage.fs, storage.chk_dir(checkpoint_id)), _run_of(job, split_uri(life)[1])[1])


def find_savepoints(job: str, roots: Iterable[str], taken: Iterable[str] = ()) -> tuple[SavepointInfo, ...]:
    """Job ``job``'s savepoints, oldest first.

    Args:
        job: the job's name.
        roots: savepoint directories to look in (each life of ``job`` there: ``{root}/{job}-{run}/chk-N``).
        taken: ``chk-N`` directories the job's handle took savepoints into (those since deleted are left out).
    """
    places: dict[str, tuple[str, str]] = {}
    for root in roots:
        for life, _ in _lives(job, root):
            try:
                storage = CheckpointStorage(life, create=False)
            except CheckpointError:
                continue
            for checkpoint_id in storage.checkpoint_ids():
                name = f"chk-{checkpoint_id:06d}"
                places.setdefault(_key(child_uri(life, name)), (life, name))
    for path in taken:
        places.setdefault(_key(path), split_uri(path))
    found = [sp for life, name in places.values() if (sp := _read(job, life, name)) is not None]
    return tuple(sorted(found, key=lambda sp: (sp.created_at or 0.0, sp.path)))


def taken_in(events: Iterable[JobEvent]) -> list[str]:
    """The savepoints a job manager's ``JobEvent``s name: ``savepoint`` verbs and stops with a savepoint."""
    fields = {EventKind.SAVEPOINT: "path", EventKind.STOPPED: "savepoint"}
    return [path for e in events if e.kind in fields and (path := e.field(fields[e.kind]))]


def running_restores() -> dict[str, str]:
    """Each running detached job on the cluster that was started from a checkpoint -> its ``restore_from``."""
    from . import jobstore

    out = {}
    for name in jobstore.names():
        try:
            record = jobstore.load(name)
        except jobstore.JobRecordError:
            continue
        if record is not None and not record.terminal and record.restore_from:
            out[name] = record.restore_from
    return out


def delete_savepoint(job: str, path: str, savepoints: Iterable[SavepointInfo],
                     restores: Mapping[str, str]) -> SavepointInfo:
    """Delete savepoint ``path`` of job ``job`` (and its life's directory once empty).

    Args:
        job: the job's name.
        path: the savepoint's ``chk-N`` directory.
        savepoints: the job's savepoints (``find_savepoints``).
        restores: running job -> what it was restored from (``running_restores``).

    Returns:
        The deleted savepoint.

    Raises:
        SavepointError: ``path`` is not a savepoint of ``job``, or a running job was restored from it (or from a
            directory that holds it).
        CheckpointError: the storage refused to delete it.
    """
    listed = list(savepoints)
    chosen = next((sp for sp in listed if _key(sp.path) == _key(path)), None)
    if chosen is None:
        known = ", ".join(sp.path for sp in listed) or "none"
        raise SavepointError(f"{path!r} is not a savepoint of job {job!r} (its savepoints: {known})")
    for other, restored_from in sorted(restores.items()):
        if _within(chosen.path, restored_from):
            raise SavepointError(f"savepoint {chosen.path!r} of job {job!r} is in use: the running job {other!r} "
                                 f"was restored from {restored_from!r}; stop that job first")
    storage = CheckpointStorage(split_uri(chosen.path)[0], create=False)
    try:
        storage.fs.delete_dir(storage.chk_dir(chosen.checkpoint_id))
        if not storage.fs.get_file_info(pafs.FileSelector(storage.root, allow_not_found=True)):
            storage.fs.delete_dir(storage.root)
    except OSError as exc:
        raise CheckpointError(f"could not delete savepoint {chosen.path!r} of job {job!r}: {exc}") from exc
    return chosen
