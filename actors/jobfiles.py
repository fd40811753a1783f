"""jobfiles.py: what a job manager reads and writes besides its record.

A job's sink output and checkpoints in storage (committing what a checkpoint
staged, reading committed results, sizes), the dataflow at the parallelism
rescales left, and the plain forms of rescale progress kept in the record.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import Any

import cloudpickle
import pyarrow.fs as pafs

from chiray.operators.graph import OperatorKind

from .restore import RestoreInfo
from .storage import CheckpointStorage

__all__ = ["RescaleOutcome", "sink_names", "recover_sinks", "with_parallelism", "dir_bytes", "committed_results", "interrupted",
           "plain"]

log = logging.getLogger(__name__)


def sink_names(graph: Any) -> list[str]:
    return [n.name for n in graph.nodes.values() if n.kind is OperatorKind.SINK]


def recover_sinks(flow: Any, storage: CheckpointStorage, restore: RestoreInfo | None) -> None:
    """Commit what ``restore``'s checkpoint staged for each sink and discard their later staged output."""
    for node in flow.graph.nodes.values():
        if node.kind is OperatorKind.SINK:
            bound = node.sink.bind_output(storage.output_dir(node.name), node.name)
            bound.recover(restore.sink_staged(node.name) if restore is not None else [])


def with_parallelism(flow: Any, parallelism: dict[str, int]) -> Any:
    for name, p in parallelism.items():
        node = flow.graph.nodes.get(name)
        if node is not None and node.parallelism != p:
            flow.graph.nodes[name] = dataclasses.replace(node, parallelism=p)
    return flow


def dir_bytes(fs: pafs.FileSystem, path: str) -> int:
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def committed_results(flow_bytes: bytes, storage: CheckpointStorage) -> dict[str, Any]:
    flow = cloudpickle.loads(flow_bytes)
    out = {}
    for node in flow.graph.nodes.values():
        if node.kind is OperatorKind.SINK:
            try:
                out[node.name] = node.sink.bind_output(storage.output_dir(node.name), node.name).combine([])
            except Exception as exc:
                log.debug("no committed result for %s: %r", node.name, exc)
    return out


class RescaleOutcome(str, enum.Enum):
    """A rescale's state in a job's record (its history, as the CLI shows it)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


def interrupted(entry: dict[str, Any]) -> dict[str, Any]:
    """A rescale that was running when the manager died: the rollback undid it."""
    if entry["state"] != RescaleOutcome.RUNNING:
        return entry
    return {**entry, "state": RescaleOutcome.INTERRUPTED.value, "error": "the job manager restarted during the rescale; the job "
            "rolled back to its last checkpoint, before it; run the rescale again"}


def plain(progress: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in progress.items() if k != "step_log"}
