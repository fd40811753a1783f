"""brancher.py: adding a branch to a running job (its operators built, the running operator's new output
channels opened at a cut: ``control.ops.branch.AddBranch``, the job's plan extended) and removing one (the
running operator's channels to it closed at a cut: ``RemoveBranch``; the branch drains, its sinks' results are
read, its hosts retire, the job's plan loses it).

``add_branch`` runs on a ``rescaler.RescaleTarget`` (the job on Ray or the in-process harness): the same
prepare / inject / wait / apply phases as a rescale step whose topology changes, with the branch's instances
as the new ones (each on a host of its own).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Protocol

from chiray.control.oprun import OpFailedError
from chiray.control.message import InstanceId
from chiray.control.ops.branch import AddBranch, RemoveBranch
from chiray.control.rescaleplan import unreached
from chiray.operators.branch import BranchError
from chiray.operators.graph import OperatorKind, OperatorNode, PhysicalPlan, branched_plan, pruned_plan

from .rescaler import HostChange, RescaleTarget, change_views

__all__ = ["BranchCut", "BranchTarget", "add_branch", "remove_branch"]


@dataclasses.dataclass(frozen=True, slots=True)
class BranchCut:
    """Where an added branch started.

    Attributes:
        operator: the running operator it reads.
        added: the branch's operators, in the order added.
        cut: per instance of ``operator`` (``"operator/index"``), the records it emitted before the op's cut,
            counted since the instance last started (after a recovery: since the checkpoint it restarted from).
            An added branch receives every record emitted after the cut, a removed one every record before it.
    """

    operator: str
    added: tuple[str, ...]
    cut: dict[str, int]


class BranchTarget(RescaleTarget, Protocol):
    """A job whose branches change: a ``RescaleTarget`` that also reads its sinks' results."""

    def sink_results(self, instances: list[InstanceId], timeout_s: float | None) -> dict[InstanceId, object]:
        """What each of these sink instances returned when it finished (waiting up to ``timeout_s``)."""
        ...


def add_branch(target: RescaleTarget, operator: str, nodes: list[OperatorNode],
               timeout_s: float | None = 60.0) -> BranchCut:
    """Add ``nodes`` (``operators.branch.branch_nodes``) downstream of ``operator`` of the job ``target`` runs.

    Raises:
        BranchError: the job's input ended before the branch could start, or the op failed (the job's topology
            is then that of before: the branch's instances are left out).
    """
    new = branched_plan(target.plan, nodes)
    cut, _ = _change(target, AddBranch(operator, timeout_s), f"add_branch from {operator!r}", new, timeout_s)
    return BranchCut(operator, tuple(n.name for n in nodes), cut)


def remove_branch(target: BranchTarget, operator: str, removed: list[str],
                  timeout_s: float | None = 60.0) -> tuple[BranchCut, dict[InstanceId, object]]:
    """End the branch of operators ``removed`` (``operators.branch.branch_of``) that reads ``operator``: the
    channels to it close at a cut, it drains and its hosts retire.

    Returns:
        The cut (the branch received every record ``operator`` emitted before it, and none after) and what
        each of the branch's sink instances returned when it finished.

    Raises:
        BranchError: the job's input ended first, or the op failed (the job's topology is then that of before).
    """
    old = target.plan
    sinks = [i for i in old.instances if i[0] in removed and old.graph.nodes[i[0]].kind is OperatorKind.SINK]
    where = f"remove_branch of {removed[0]!r}"
    cut, change = _change(target, RemoveBranch(operator, timeout_s), where, pruned_plan(old, removed), timeout_s)
    results = target.sink_results(sinks, timeout_s)
    target.retire(change.retiring)
    return BranchCut(operator, tuple(removed), cut), results


def _change(target: RescaleTarget, op: AddBranch, where: str, new: PhysicalPlan,
            timeout_s: float | None) -> tuple[dict[str, int], HostChange]:
    """Change the job's topology to ``new`` at the cut of ``op``; per instance of its operator, the records it
    emitted before the cut, and where the instances run."""
    old = target.plan
    op_id = f"controller:{uuid.uuid4().hex[:12]}:{op.kind}"
    change = target.place(new)
    prepared = target.prepare(op_id, new, change)
    held = [i for p in prepared for i in p.held]
    missing = unreached(old, held, [i for p in prepared for i in p.changed])
    if missing:
        target.abandon(f"the input ended before the branch's op could reach {sorted(missing)}")
        raise BranchError(f"{where}: the job's input ended before the op could pass")
    handle = target.start_op(op, op_id, change_views(target.name, old, new))
    try:
        acks = target.wait_op(handle, timeout_s)
    except (OpFailedError, TimeoutError) as exc:
        target.abandon(str(exc))
        raise BranchError(f"{where} failed: {exc}") from exc
    target.apply(new, {i: change.placement[i] for i in new.instances})
    return {f"{name}/{index}": int(n) for (name, index), n in sorted(acks.items())}, change
