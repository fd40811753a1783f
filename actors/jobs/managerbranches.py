"""managerbranches.py: branches added to and removed from a detached job (``JobManager.add_branch`` /
``remove_branch``).

The job's record keeps the dataflow the manager runs again after its own restart (from the job's last
checkpoint); a branch changes it as it changes the running job, so a restarted manager runs the graph the job
had: the branch's operators are built on the record's dataflow as ``Job.add_branch`` built them (the same
names, from the same graph), or taken out of it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import cloudpickle

from chiray.operators.branch import branch_nodes, branch_of
from chiray.operators.hashing import DEFAULT_NUM_BINS

from .jobvalues import EventKind, JobEvent

if TYPE_CHECKING:
    from chiray.operators.dataflow import Stream

    from .brancher import BranchCut
    from .job import Job
    from .managerrecord import RecordKeeper

__all__ = ["add_branch", "remove_branch"]

log = logging.getLogger(__name__)


def add_branch(keeper: RecordKeeper, job: Job, from_operator: str, build: Callable[[Stream], Any],
               timeout: float | None) -> BranchCut:
    """``job.add_branch``; the record's dataflow gains the branch, its events say so (or why it failed)."""
    try:
        cut = job.add_branch(from_operator, build, timeout)
    except Exception as exc:
        keeper.update(JobEvent.of(EventKind.BRANCH, verb="add_branch", operator=from_operator, operators=(),
                                  error=f"{type(exc).__name__}: {exc}"))
        raise
    flow = cloudpickle.loads(keeper.record.flow)
    nodes = branch_nodes(flow.graph, from_operator, build, DEFAULT_NUM_BINS)
    if tuple(n.name for n in nodes) != cut.added:  # a build that names its operators differently each call
        log.warning("job %s: the branch built again for the record has operators %s, the job %s",
                    keeper.record.name, [n.name for n in nodes], list(cut.added))
    for node in nodes:
        flow.graph.add(node)
    keeper.update(JobEvent.of(EventKind.BRANCH, verb="add_branch", operator=from_operator, operators=cut.added),
                  flow=cloudpickle.dumps(flow))
    return cut


def remove_branch(keeper: RecordKeeper, job: Job, sink: str, timeout: float | None) -> BranchCut:
    """``job.remove_branch``; the record's dataflow loses the branch, its events say so."""
    removed = branch_of(job.plan.graph, sink)
    cut = job.remove_branch(sink, timeout)
    flow = cloudpickle.loads(keeper.record.flow)
    for name in removed:
        flow.graph.nodes.pop(name, None)
    keeper.update(JobEvent.of(EventKind.BRANCH, verb="remove_branch", operator=cut.operator, operators=cut.added),
                  flow=cloudpickle.dumps(flow))
    return cut
