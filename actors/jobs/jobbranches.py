"""jobbranches.py: a branch added to, or removed from, a job that runs on Ray (``Job.add_branch``,
``Job.remove_branch``).

The branch's sinks are bound to the job's output storage and claimed, and the controller learns of them
before the op runs: a branch whose input ends right after its cut still finishes before the job does, and the
job's checkpoints commit its output from the first one on. The op itself is a topology change on the job
(``brancher.add_branch`` on a ``rescalejob.JobTarget``: new hosts for the branch's instances, new output
channels of the running operator opened at the cut), taking its turn with rescales. If it fails, the
controller forgets the sinks and their claims are dropped; the job runs on as before, or rolls back to its last
checkpoint where the op failed half-way (as a rescale step does).

A removed branch drains behind its op (``brancher.remove_branch``); then its sinks' final output is committed and
combined from what their instances returned, the controller stops waiting for them and their claims go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray

from chiray.operators.branch import BranchError
from chiray.operators.graph import OperatorKind, OperatorNode

from .brancher import BranchCut, add_branch, remove_branch
from .rescalejob import JobTarget, RunningJob
from .supervisor import bind_sinks, claim_outputs, release_outputs

if TYPE_CHECKING:
    from chiray.control.message import InstanceId

__all__ = ["add_branch_on_ray", "remove_branch_on_ray"]

CALL_TIMEOUT_S = 60.0
"""How long the controller may take to answer a call about the branch's sinks."""


def add_branch_on_ray(job: RunningJob, from_operator: str, nodes: list[OperatorNode],
                      timeout_s: float | None) -> BranchCut:
    """Add ``nodes`` (checked by ``operators.branch.branch_nodes``) downstream of ``from_operator``.

    Raises:
        BranchError: the op failed or the input ended first (see ``brancher.add_branch``).
        OutputInUseError: a sink's output is written by another running job.
        RescaleError: the branch's hosts could not start (the job runs on unchanged).
    """
    dep = job.deployment
    assert dep is not None and dep.storage is not None, "bug: a branch added to a job that was never launched"
    sinks = bind_sinks(nodes, dep.storage, dep.config.run_id)
    claim_outputs(job.name, sinks)
    instances: list[InstanceId] = [(n.name, i) for n in nodes if n.kind is OperatorKind.SINK
                                   for i in range(n.parallelism)]
    controller = job.topology.controller
    try:
        ray.get(controller.add_sinks.remote(instances, sinks), timeout=CALL_TIMEOUT_S)
        with job.topology.rescale_turn():  # one topology change at a time
            target = JobTarget(job, from_operator, None, f"add_branch from {from_operator!r}")
            cut = add_branch(target, from_operator, nodes, timeout_s)
    except BaseException as exc:
        try:
            ray.get(job.topology.controller.drop_sinks.remote(instances, list(sinks)), timeout=CALL_TIMEOUT_S)
        except Exception:  # the controller is gone: a new one is started from the plan without the branch
            pass
        release_outputs(sinks)
        if isinstance(exc, ray.exceptions.RayError):
            raise BranchError(f"add_branch from {from_operator!r} failed: an actor of the job died under it "
                              f"({type(exc).__name__}); the job recovers without the branch") from exc
        raise
    dep.sinks.update(sinks)  # a recovery recovers their staged output; the job's end releases their claims
    return cut


def remove_branch_on_ray(job: RunningJob, operator: str, removed: list[str],
                         timeout_s: float | None) -> tuple[BranchCut, dict[str, object]]:
    """Remove the branch of operators ``removed`` (``operators.branch.branch_of``) that reads ``operator``.

    Returns:
        The cut, and each removed sink's combined result (its final output committed).

    Raises:
        BranchError: the op failed or the input ended first (see ``brancher.remove_branch``).
        RescaleError: the branch did not drain.
    """
    dep = job.deployment
    assert dep is not None, "bug: a branch removed from a job that was never launched"
    nodes = {name: job.plan.graph.nodes[name] for name in removed
             if job.plan.graph.nodes[name].kind is OperatorKind.SINK}
    try:
        with job.topology.rescale_turn():  # one topology change at a time
            target = JobTarget(job, operator, None, f"remove_branch of {removed[0]!r}")
            cut, parts = remove_branch(target, operator, removed, timeout_s)
    except ray.exceptions.RayError as exc:
        raise BranchError(f"remove_branch of {removed[0]!r} failed: an actor of the job died under it "
                          f"({type(exc).__name__}); the job recovers with the branch") from exc
    results: dict[str, object] = {}
    for name, node in nodes.items():
        assert node.sink is not None
        mine = [parts[(name, i)] for i in range(node.parallelism)]
        node.sink.commit_final(mine)
        results[name] = node.sink.combine(mine)
    ray.get(job.topology.controller.drop_sinks.remote(sorted(parts), list(nodes)), timeout=CALL_TIMEOUT_S)
    release_outputs({name: dep.sinks.pop(name) for name in nodes if name in dep.sinks})
    return cut, results
