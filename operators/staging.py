"""staging.py: staged output files in one directory and their two-phase commit.

A sink writer writes *hidden* files (``.NAME.inprogress`` while open). At a
checkpoint barrier it closes them and renames them to *staged* names that
carry the epoch: ``.{prefix}-e{epoch}-{n}{ext}.staged``. When the checkpoint
commits, the controller renames staged files to their visible names
``part-{prefix}-e{epoch}-{n}{ext}`` (idempotently, so a re-created controller
can finish an interrupted commit). On recovery, every hidden file of the sink
that no committed checkpoint names is deleted: replay writes it again.
"""

from __future__ import annotations

import os
import posixpath
from typing import Iterable

import pyarrow.fs as pafs

__all__ = ["StagingArea", "epoch_label"]


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
