"""jobfiles.py: what a job manager reads and writes besides its record.

A job's sink output and checkpoints in storage (committing what a checkpoint
staged, reading committed results, sizes), the dataflow at the parallelism
rescales left, and the rescale progress kept in the record.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from chiray.operators.graph import LogicalGraph, OperatorKind

from .jobvalues import CheckpointInfo, RescaleOutcome, RescaleProgress, RescaleRecord
from ..runtime.restore import RestoreInfo
from ..runtime.storage import CheckpointError, CheckpointStorage, child_uri

if TYPE_CHECKING:
    from chiray.operators.dataflow import Dataflow

__all__ = ["RescaleOutcome", "sink_names", "recover_sinks", "with_parallelism", "dir_bytes", "committed_results",
           "interrupted", "plain", "copy_savepoint", "commit_stopped"]

log = logging.getLogger(__name__)


def sink_names(graph: LogicalGraph) -> list[str]:
    return [n.name for n in graph.nodes.values() if n.kind is OperatorKind.SINK]


def recover_sinks(graph: LogicalGraph, storage: CheckpointStorage, restore: RestoreInfo | None, run: str) -> None:
    """Commit what ``restore``'s checkpoint staged for each sink of ``graph`` and discard their later output
    (``run``'s: the job's own, never another run's)."""
    for node in graph.nodes.values():
        if node.kind is OperatorKind.SINK:
            assert node.sink is not None
            bound = node.sink.bind_output(storage.output_dir(node.name), node.name, run)
            bound.recover(restore.sink_staged(node.name) if restore is not None else [])


def with_parallelism(flow: Dataflow, parallelism: dict[str, int]) -> Dataflow:
    """``flow`` with each operator that ``parallelism`` names at that parallelism (changed in place)."""
    for name, p in parallelism.items():
        node = flow.graph.nodes.get(name)
        if node is not None and node.parallelism != p:
            flow.graph.nodes[name] = dataclasses.replace(node, parallelism=p)
    return flow


def dir_bytes(fs: pafs.FileSystem, path: str) -> int:
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def committed_results(graph: LogicalGraph, storage: CheckpointStorage, run: str) -> dict[str, object]:
    """Sink -> what it committed to ``storage`` in ``run`` (``graph``: a logical or physical plan's graph)."""
    out: dict[str, object] = {}
    for node in graph.nodes.values():
        if node.kind is OperatorKind.SINK:
            try:
                assert node.sink is not None
                out[node.name] = node.sink.bind_output(storage.output_dir(node.name), node.name, run).combine([])
            except Exception as exc:
                log.debug("no committed result for %s: %r", node.name, exc)
    return out


def interrupted(entry: RescaleRecord) -> RescaleRecord:
    """A rescale that was running when the manager died: the rollback undid it."""
    if entry.state is not RescaleOutcome.RUNNING:
        return entry
    return entry.replace(state=RescaleOutcome.INTERRUPTED, error="the job manager restarted during the rescale; the "
                         "job rolled back to its last checkpoint, before it; run the rescale again")


def plain(progress: RescaleProgress) -> RescaleProgress:
    """``progress`` without its step log (what a job's record keeps)."""
    return progress.replace(step_log=())


def copy_savepoint(storage: CheckpointStorage, taken: CheckpointInfo, directory: str) -> CheckpointInfo:
    """Copy checkpoint ``taken`` of ``storage`` to ``directory``, where it stays until deleted.

    Returns:
        ``taken`` with the copy's path and ``root=directory``.

    Raises:
        CheckpointError: the copy failed or is incomplete.
    """
    own = f"chk-{taken.id:06d}/"
    foreign = sorted(rel for rel in storage.files_of(storage.load(taken.id)) if not rel.startswith(own))
    if foreign:  # a savepoint's checkpoint is full (``Job.checkpoint(full=True)``)
        raise CheckpointError(f"bug in savepoints: checkpoint {taken.id} is not self-contained (it needs "
                              f"{foreign[:3]} of earlier checkpoints); it cannot be copied as a savepoint")
    try:
        target = CheckpointStorage(directory)
        target.make_dir(target.chk_dir(taken.id))
        pafs.copy_files(storage.chk_dir(taken.id), target.chk_dir(taken.id), source_filesystem=storage.fs,
                        destination_filesystem=target.fs)
    except OSError as exc:
        raise CheckpointError(f"could not copy checkpoint {taken.id} to the savepoint directory {directory}: "
                              f"{exc}") from exc
    target.load(taken.id)  # raises if the copy is incomplete
    return dataclasses.replace(taken, path=child_uri(directory, f"chk-{taken.id:06d}"), root=directory)


def commit_stopped(graph: LogicalGraph, storage: CheckpointStorage, checkpoint_id: int, run: str) -> dict[str, object]:
    """A stopped job's sinks commit what checkpoint ``checkpoint_id`` staged and discard later output.

    Returns:
        sink -> its committed result.
    """
    recover_sinks(graph, storage, RestoreInfo(storage, storage.load(checkpoint_id)), run)
    return committed_results(graph, storage, run)

