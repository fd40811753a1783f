"""brancher.py: adding a branch to a running job: its operators built, the running operator's new output
channels opened at a cut (``control.ops.branch.AddBranch``), the job's plan extended.

``add_branch`` runs on a ``rescaler.RescaleTarget`` (the job on Ray or the in-process harness): the same
prepare / inject / wait / apply phases as a rescale step whose topology changes, with the branch's instances
as the new ones (each on a host of its own).
"""

from __future__ import annotations

import dataclasses
import uuid

from chiray.control.oprun import OpFailedError
from chiray.control.ops.branch import AddBranch
from chiray.control.rescaleplan import unreached
from chiray.operators.branch import BranchError
from chiray.operators.graph import OperatorNode, branched_plan

from .rescaler import RescaleTarget, change_views

__all__ = ["BranchCut", "add_branch"]


@dataclasses.dataclass(frozen=True, slots=True)
class BranchCut:
    """Where an added branch started.

    Attributes:
        operator: the running operator it reads.
        added: the branch's operators, in the order added.
        cut: per instance of ``operator`` (``"operator/index"``), the records it emitted before the branch
            started: the branch receives every record it emits after them.
    """

    operator: str
    added: tuple[str, ...]
    cut: dict[str, int]


def add_branch(target: RescaleTarget, operator: str, nodes: list[OperatorNode],
               timeout_s: float | None = 60.0) -> BranchCut:
    """Add ``nodes`` (``operators.branch.branch_nodes``) downstream of ``operator`` of the job ``target`` runs.

    Raises:
        BranchError: the job's input ended before the branch could start, or the op failed (the job's topology
            is then that of before: the branch's instances are left out).
    """
    old = target.plan
    new = branched_plan(old, nodes)
    op = AddBranch(operator, timeout_s)
    op_id = f"controller:{uuid.uuid4().hex[:12]}:{op.kind}"
    change = target.place(new)
    prepared = target.prepare(op_id, new, change)
    held = [i for p in prepared for i in p.held]
    missing = unreached(old, held, [i for p in prepared for i in p.changed])
    if missing:
        target.abandon(f"the input ended before the branch's op could reach {sorted(missing)}")
        raise BranchError(f"add_branch from {operator!r}: the job's input ended before the branch could start")
    handle = target.start_op(op, op_id, change_views(target.name, old, new))
    try:
        acks = target.wait_op(handle, timeout_s)
    except (OpFailedError, TimeoutError) as exc:
        target.abandon(str(exc))
        raise BranchError(f"add_branch from {operator!r} failed: {exc}") from exc
    target.apply(new, {i: change.placement[i] for i in new.instances})
    return BranchCut(operator, tuple(n.name for n in nodes),
                     {f"{name}/{index}": int(n) for (name, index), n in sorted(acks.items())})
