"""upgrader.py: running an upgrade of an operator's code: checks, canary, cut, and its entry in the history.

``run_upgrade`` drives the control ops of ``control.ops.upgrade`` through ``run_op(op, timeout) -> result``,
which the driver's ``Job`` (on Ray) and ``harness.LocalRun`` (in-process) provide alike:

1. ``SampleInput`` fetches the recent input of the operator's instances; the new code must run on it and keep
   the declared output schema (``operators.upgrade.check_upgrade``), else the upgrade is refused before any cut;
2. without a canary, one ``UpgradeOperator`` swaps the code at every instance at its cut; with ``canary=N``, a
   first op puts it on trial at instance 0 and, once the trial passed, a second one upgrades the others;
3. the plan's operator gets the new code (a rescale's new instances build it; checkpoints record it per instance).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Callable, Mapping, TypedDict

import cloudpickle
import pyarrow as pa

from chiray.control.message import InstanceId
from chiray.control.op import ControlOp
from chiray.control.ops.upgrade import SampleInput, UpgradeOperator
from chiray.operators.graph import OperatorKind, OperatorNode, PhysicalPlan
from chiray.operators.upgrade import CodeChange, TrialVerdict, UpgradeError, check_upgrade

from .jobvalues import UpgradeOutcome, UpgradeRecord

__all__ = ["run_upgrade", "UpgradeError", "CanaryRolledBackError", "RunOp", "StateMigration"]

RunOp = Callable[[ControlOp, "float | None"], Any]
"""``run_op(op, timeout)``: run a control op on the job; its result (whatever the op's kind returns)."""

StateMigration = Callable[[object, object], object]
"""``migrate_state(key, old_value) -> new_value`` (None deletes the key)."""


class UpgradeAck(TypedDict, total=False):
    """What an instance acknowledges of an ``UpgradeOperator`` (see its docstring)."""

    cut: Mapping[int, int]
    records: int
    pause_ms: float
    verdict: TrialVerdict


UpgradeAcks = dict[InstanceId, UpgradeAck]
"""Upgraded instance -> its ack."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Swap:
    """An upgrade's swap, checked: the operator's node, the new code, and how it goes in."""

    node: OperatorNode
    change: CodeChange
    migrate_state: StateMigration | None
    canary: int
    rate_bound: float
    timeout: float | None


class CanaryRolledBackError(UpgradeError):
    """The canary trial failed: the old code and state came back at the cut. ``record`` says why."""

    def __init__(self, message: str, record: UpgradeRecord):
        super().__init__(message)
        self.record = record


def _describe(change: CodeChange | None) -> str:
    return "submitted" if change is None else change.describe()


def _cut(plan: PhysicalPlan, acks: UpgradeAcks) -> tuple[dict[str, object], float]:
    """The cut's position per instance (records before it, per upstream instance) and the longest pause."""
    sources = {c.channel_id: c.src for c in plan.channels}
    cut: dict[str, object] = {}
    pause = 0.0
    for (operator, index), ack in sorted(acks.items()):
        inputs = {f"{sources[ch][0]}/{sources[ch][1]}": n for ch, n in sorted(ack["cut"].items()) if ch in sources}
        cut[f"{operator}/{index}"] = {"records": ack["records"], "inputs": inputs}
        pause = max(pause, float(ack.get("pause_ms", 0.0)))
    return cut, pause


def _upgradable(plan: PhysicalPlan, operator: str, canary: int, rate_bound: float) -> OperatorNode:
    """The node of ``operator``, checked: it runs user code, and the canary's knobs are valid.

    Raises:
        UpgradeError: naming the operator and what is wrong.
    """
    node = plan.graph.nodes.get(operator)
    if node is None:
        raise UpgradeError(f"upgrade: unknown operator {operator!r}; operators: {sorted(plan.graph.nodes)}")
    if node.kind not in (OperatorKind.TRANSFORM, OperatorKind.KEYED) or node.make_logic is None:
        raise UpgradeError(f"upgrade of operator {operator!r}: a {node.kind.value} runs no user code to upgrade")
    if isinstance(canary, bool) or not isinstance(canary, int) or canary < 0:
        raise UpgradeError(f"upgrade of operator {operator!r}: canary must be a number of batches >= 0, "
                           f"got {canary!r}")
    if not rate_bound > 0:
        raise UpgradeError(f"upgrade of operator {operator!r}: rate_bound must be positive, got {rate_bound!r}")
    return node


def _check_migration(node: OperatorNode, migrate_state: object) -> None:
    """``migrate_state`` is a function that pickles, and ``node`` is keyed.

    Raises:
        UpgradeError: naming the operator and what is wrong.
    """
    if not callable(migrate_state):
        raise UpgradeError(f"upgrade of operator {node.name!r}: migrate_state must be callable "
                           f"(fn(key, old_state) -> new_state), got {type(migrate_state).__name__}")
    if node.kind is not OperatorKind.KEYED:
        raise UpgradeError(f"upgrade of operator {node.name!r}: migrate_state= needs a keyed operator")
    try:
        cloudpickle.dumps(migrate_state)
    except Exception as exc:
        raise UpgradeError(f"upgrade of operator {node.name!r}: migrate_state does not pickle: {exc}") from exc


def _sample(run_op: RunOp, operator: str, timeout: float | None) -> list[tuple[pa.RecordBatch, int]]:
    """The recent input of ``operator``'s instances (``SampleInput``), in instance order."""
    samples = run_op(SampleInput(operator, timeout), timeout)
    return [pair for key in sorted(samples) for pair in samples[key]]


def _canary_first(run_op: RunOp, plan: PhysicalPlan, swap: _Swap, expected: pa.Schema | None,
                  entry: UpgradeRecord, t0: float) -> tuple[UpgradeRecord, UpgradeAcks]:
    """The canary's trial at instance 0, then, once it passed, the other instances: the entry and the acks.

    Raises:
        CanaryRolledBackError: the trial failed; the entry it carries says why.
    """
    operator, timeout = swap.node.name, swap.timeout
    acks: UpgradeAcks = dict(run_op(UpgradeOperator(swap.change, [0], swap.migrate_state, swap.canary, expected,
                                                    swap.rate_bound, timeout), timeout))
    verdict = acks[(operator, 0)]["verdict"]
    if not verdict.passed:
        cut, pause = _cut(plan, acks)
        entry = entry.replace(outcome=UpgradeOutcome.ROLLED_BACK, canary_result=verdict.reason, cut=cut,
                              pause_ms=pause, duration_s=time.monotonic() - t0, error=verdict.reason)
        raise CanaryRolledBackError(f"upgrade of operator {operator!r} rolled back: the canary (instance 0) "
                                    f"{verdict.reason}; the old code runs on", entry)
    entry = entry.replace(canary_result="passed" + (f" ({verdict.reason})" if verdict.reason else ""))
    rest = [i for i in range(swap.node.parallelism) if i != 0]
    if rest:
        acks.update(run_op(UpgradeOperator(swap.change, rest, swap.migrate_state, timeout_s=timeout), timeout))
    return entry, acks


def run_upgrade(run_op: RunOp, plan: PhysicalPlan, operator: str, fn: object, on_timer: object = None,
                schema: pa.Schema | None = None, migrate_state: StateMigration | None = None, canary: int = 0,
                rate_bound: float = 0.5, timeout: float | None = 60.0) -> UpgradeRecord:
    """Upgrade ``operator`` of the job that runs ``plan``; returns its history entry (see ``Job.upgrade``).

    Raises:
        UpgradeError: refused before the cut (naming the operator and the failed check).
        CanaryRolledBackError: the canary failed; the old code runs on, nothing lost or emitted twice.
    """
    started, t0 = time.time(), time.monotonic()
    node = _upgradable(plan, operator, canary, rate_bound)
    change = CodeChange.of(operator, fn, on_timer, schema)
    if migrate_state is not None:
        _check_migration(node, migrate_state)
    assert node.make_logic is not None  # _upgradable checked it
    expected = check_upgrade(node.make_logic, node.code, change, _sample(run_op, operator, timeout))
    entry = UpgradeRecord(uuid.uuid4().hex[:10], started, operator, _describe(node.code), change.describe(),
                          UpgradeOutcome.DONE, canary=canary)
    swap = _Swap(node, change, migrate_state, canary, rate_bound, timeout)
    if canary:
        entry, acks = _canary_first(run_op, plan, swap, expected, entry, t0)
    else:
        acks = dict(run_op(UpgradeOperator(change, None, migrate_state, timeout_s=timeout), timeout))
    node.code = change
    cut, pause = _cut(plan, acks)
    return entry.replace(cut=cut, pause_ms=pause, duration_s=time.monotonic() - t0)
