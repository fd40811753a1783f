"""fencing.py: a job's deployment numbers on its shared storage, and the commits of a stale one refused.

A network partition can leave part of a job running where nobody sees it: a
node cut off from the head is declared dead by Ray, the job recovers on the
other nodes, and the cut-off side (hosts, perhaps the job controller that ran
in one of them) keeps going until the node is healed and Ray retires it.
Whatever that side does must never reach the job's committed output.

Every deployment of a job (the submit, each recovery, a job manager's
restart) takes the next *fence token* from one small file in the job's
checkpoint storage (``Fence.advance``): the storage every node reads, so
both sides of a partition see the same file. A controller commits (a
checkpoint's manifest, its retention, the sinks' staged output) only while
no newer token is there (``Fence.check``); a refused commit raises
``StaleIncarnationError`` and the controller that made it retires. A
recovery takes its token before it discards the failed run's staged output,
so once that discard has begun no older controller commits again.

Lifecycle: the file holds 0 (absent) until the first deployment; it only
grows. Safe from several processes: written under a temporary name and moved
into place.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any, Callable, Collection

import pyarrow.fs as pafs

from chiray.operators.errors import ChirayError

__all__ = ["FENCE_FILE", "Fence", "FencedStorage", "StaleIncarnationError", "next_token"]

FENCE_FILE = "_FENCE.json"
"""The fence's file name, in the root of a job's checkpoint storage."""


class StaleIncarnationError(ChirayError, RuntimeError):
    """A commit came from a deployment of the job that a newer one (a recovery elsewhere) replaced."""


def next_token(current: int, at_least: int = 0) -> int:
    """The token of the next deployment: past both the stored ``current`` and ``at_least`` (one this process
    already used), so tokens only grow, even when the file was written by a process that no longer exists."""
    if current < 0 or at_least < 0:
        raise ValueError(f"fence tokens are never negative, got current={current}, at_least={at_least}")
    return max(current, at_least) + 1


class Fence:
    """One job's fence file on a ``pyarrow.fs`` filesystem.

    Args:
        filesystem: where the job's checkpoints are.
        root: the checkpoint root on it.
    """

    def __init__(self, filesystem: pafs.FileSystem, root: str):
        self.filesystem = filesystem
        self.path = posixpath.join(root, FENCE_FILE) if root else FENCE_FILE

    @classmethod
    def of(cls, storage: Any) -> "Fence":
        """The fence of a checkpoint storage (anything with ``fs`` and ``root``)."""
        return cls(storage.fs, storage.root)

    def current(self) -> int:
        """The newest deployment's token (0: none has taken one)."""
        try:
            with self.filesystem.open_input_stream(self.path) as f:
                return int(json.loads(f.read().decode())["token"])
        except FileNotFoundError:
            return 0

    def advance(self, at_least: int = 0) -> int:
        """Take the next token (see ``next_token``) for a deployment; returns it."""
        token = next_token(self.current(), at_least)
        temporary = f"{self.path}.{uuid.uuid4().hex}.tmp"
        with self.filesystem.open_output_stream(temporary) as f:
            f.write(json.dumps({"token": token}).encode())
        self.filesystem.move(temporary, self.path)
        return token

    def check(self, token: int, what: str) -> None:
        """Allow a commit of the deployment that holds ``token``.

        Raises:
            StaleIncarnationError: a newer deployment took a token since; ``what`` names the commit.
        """
        current = self.current()
        if current > token:
            raise StaleIncarnationError(
                f"{what} refused: this deployment of the job (fence token {token}) was replaced by a newer one "
                f"(token {current}), a recovery after this side was cut off; this side stops and commits nothing")


class FencedStorage:
    """A checkpoint storage whose manifest commits and retention are fenced (what the checkpoint op commits
    through); every other call goes to ``storage``.

    Args:
        storage: the job's ``CheckpointStorage``.
        fence: its fence.
        token: the token of the deployment that commits.
        on_stale: called with the error before a refused commit raises (the controller retires); not pickled.
    """

    def __init__(self, storage: Any, fence: Fence, token: int,
                 on_stale: Callable[[StaleIncarnationError], None] | None = None):
        self.storage = storage
        self.fence = fence
        self.token = token
        self.on_stale = on_stale

    def __getattr__(self, name: str) -> Any:
        if name == "storage":  # while unpickling, before __dict__ is filled
            raise AttributeError(name)
        return getattr(self.storage, name)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "on_stale": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def check(self, what: str) -> None:
        """``Fence.check`` for this deployment; ``on_stale`` hears of a refusal first."""
        try:
            self.fence.check(self.token, what)
        except StaleIncarnationError as error:
            if self.on_stale is not None:
                self.on_stale(error)
            raise

    def commit(self, checkpoint_id: int, manifest: dict[str, Any]) -> None:
        self.check(f"checkpoint {checkpoint_id}'s manifest")
        self.storage.commit(checkpoint_id, manifest)

    def retain(self, keep: int, taking: Collection[int] = ()) -> None:
        self.check("checkpoint retention")
        self.storage.retain(keep, taking)
