"""restore.py: what a checkpoint's manifest gives each new instance: source offsets and keyed bins.

Used both for recovery (the same job, rolled back) and for restoring into a
new job, possibly with a different parallelism: a keyed instance loads the
bins its *new* routing table assigns it, from whichever state files hold them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chiray.control.ops.checkpoint import decode_offsets

from .storage import CheckpointStorage

__all__ = ["RestoreInfo"]


@dataclasses.dataclass(frozen=True)
class RestoreInfo:
    """A complete checkpoint to start from.

    Attributes:
        storage: where it lives.
        manifest: its manifest (``CheckpointStorage.load``).
    """

    storage: CheckpointStorage
    manifest: dict[str, Any]

    @property
    def checkpoint_id(self) -> int:
        return int(self.manifest["checkpoint_id"])

    def source_offsets(self, operator: str) -> dict[str, Any]:
        """Split id -> offset, over every instance of the source (splits may be re-assigned)."""
        offsets: dict[str, Any] = {}
        for key, text in self.manifest.get("sources", {}).items():
            if key.split("/")[0] == operator:
                offsets.update(decode_offsets(text) or {})
        return offsets

    def load_bins(self, operator: str, index: int, table: list[int]) -> dict[int, bytes]:
        """The serialised bins that ``table`` (bin -> instance) gives instance ``index``."""
        mine = {b for b, owner in enumerate(table) if owner == index}
        out: dict[int, bytes] = {}
        for key, rel in self.manifest.get("state_files", {}).items():
            if key.rsplit("/", 1)[0] != operator:
                continue
            stored = set(self.manifest.get("state_bins", {}).get(key, []))
            if stored & mine:
                out.update(self.storage.read_state(rel, mine))
        return out

    def sink_staged(self, operator: str) -> list[Any]:
        """What the checkpoint committed for a sink's instances (to finish an interrupted commit)."""
        return [v for k, v in sorted(self.manifest.get("sinks", {}).items()) if k.rsplit("/", 1)[0] == operator]
