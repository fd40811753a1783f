"""fspaths.py: where a source reads and a sink writes: a local path, a ``pyarrow.fs`` URI or a path in a filesystem.

Every built-in file source and sink takes its location the same way:

* a plain path (``"data/in"``): the local filesystem, or the ``filesystem=``
  given beside it (then a path inside that filesystem, ``"bucket/in"`` for S3);
* a URI that ``pyarrow.fs.FileSystem.from_uri`` understands (``file:///data/in``,
  ``s3://bucket/in?region=eu-west-1``, ``gs://...``, ``hdfs://...``): the URI
  names its filesystem, so a ``filesystem=`` beside it is an error.

Example:
    >>> fs, path = resolve("from_csv", "file:///tmp/in.csv", None)
    >>> type(fs).__name__, path
    ('LocalFileSystem', '/tmp/in.csv')
"""

from __future__ import annotations

import os
from typing import Sequence

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["resolve", "resolve_all", "list_files", "is_uri"]


def is_uri(location: str) -> bool:
    """Whether ``location`` names its filesystem (``scheme://...``) rather than being a plain path."""
    return "://" in location


def resolve(where: str, location: str | os.PathLike, filesystem: pafs.FileSystem | None
            ) -> tuple[pafs.FileSystem | None, str]:
    """The filesystem and the path inside it that ``location`` names.

    Args:
        where: the function asking, for messages (``"from_csv"``).
        location: a plain path or a ``pyarrow.fs`` URI.
        filesystem: the ``filesystem=`` the user passed, or ``None``.

    Returns:
        ``(filesystem, path)``; the filesystem is ``None`` for a plain path
        given without one (the local filesystem).

    Raises:
        TypeError: ``location`` is not a string or path.
        ValueError: a URI together with ``filesystem=``, or a URI pyarrow does
            not understand.
    """
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"{where}: expected a path or a URI, got {type(location).__name__} ({location!r:.60})")
    text = os.fspath(location)
    if not is_uri(text):
        return filesystem, text
    if filesystem is not None:
        raise ValueError(f"{where}: {text!r} is a URI, which names its own filesystem, and filesystem= was "
                         f"given too; pass the URI alone, or filesystem= with a path inside it")
    try:
        return pafs.FileSystem.from_uri(text)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise ValueError(f"{where}: {text!r} is not a URI pyarrow.fs understands ({exc})") from None


def resolve_all(where: str, locations: str | os.PathLike | Sequence[str | os.PathLike],
                filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, list[str]]:
    """:func:`resolve` for one location or a list of them, which must all lie on one filesystem.

    Raises:
        ValueError: no location, or locations on different filesystems (also what :func:`resolve` raises).
    """
    items = [locations] if isinstance(locations, (str, os.PathLike)) else list(locations)
    if not items:
        raise ValueError(f"{where}: expected at least one path, got none")
    found: pafs.FileSystem | None = None
    paths = []
    for item in items:
        fs, path = resolve(where, item, filesystem)
        fs = fs if fs is not None else pafs.LocalFileSystem()
        if found is not None and not fs.equals(found):
            raise ValueError(f"{where}: {os.fspath(item)!r} is on another filesystem ({fs.type_name}) than "
                             f"{os.fspath(items[0])!r} ({found.type_name}); read them with two sources")
        found = fs
        paths.append(path)
    assert found is not None
    return found, paths


def list_files(where: str, fs: pafs.FileSystem, paths: Sequence[str], suffixes: tuple[str, ...]) -> list[str]:
    """Expand files and directories into file paths.

    A file is taken as named; a directory gives its files ending in one of
    ``suffixes``, searched recursively and sorted, skipping names that start
    with ``.`` or ``_`` (hidden, staged or marker files such as ``_SUCCESS``).

    Raises:
        FileNotFoundError: a path does not exist (naming it).
        ValueError: a directory holds no file with one of ``suffixes``.
    """
    files: list[str] = []
    for path in paths:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{where}: no such file or directory: {path!r}")
        if info.type != pafs.FileType.Directory:
            files.append(path)
            continue
        found = sorted(
            f.path
            for f in fs.get_file_info(pafs.FileSelector(path, recursive=True))
            if f.type == pafs.FileType.File
            and f.base_name.endswith(suffixes)
            and not f.base_name.startswith((".", "_"))
        )
        if not found:
            wanted = ", ".join(f"*{s}" for s in suffixes)
            raise ValueError(f"{where}: directory {path!r} contains no {wanted} files")
        files.extend(found)
    return files
