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

import time
import uuid
from typing import Any, Callable

import cloudpickle

from chiray.control.ops.upgrade import SampleInput, UpgradeOperator
from chiray.operators.graph import OperatorKind, PhysicalPlan
from chiray.operators.upgrade import CodeChange, UpgradeError, check_upgrade

from .jobvalues import UpgradeOutcome, UpgradeRecord

__all__ = ["run_upgrade", "UpgradeError", "CanaryRolledBackError"]

RunOp = Callable[[Any, "float | None"], Any]


class CanaryRolledBackError(UpgradeError):
    """The canary trial failed: the old code and state came back at the cut. ``record`` says why."""

    def __init__(self, message: str, record: UpgradeRecord):
        super().__init__(message)
        self.record = record


def _describe(change: CodeChange | None) -> str:
    return "submitted" if change is None else change.describe()


def _cut(plan: PhysicalPlan, acks: dict[Any, Any]) -> tuple[dict[str, Any], float]:
    """The cut's position per instance (records before it, per upstream instance) and the longest pause."""
    sources = {c.channel_id: c.src for c in plan.channels}
    cut: dict[str, Any] = {}
    pause = 0.0
    for (operator, index), ack in sorted(acks.items()):
        inputs = {f"{sources[ch][0]}/{sources[ch][1]}": n for ch, n in sorted(ack["cut"].items()) if ch in sources}
        cut[f"{operator}/{index}"] = {"records": ack["records"], "inputs": inputs}
        pause = max(pause, float(ack.get("pause_ms", 0.0)))
    return cut, pause


def run_upgrade(run_op: RunOp, plan: PhysicalPlan, operator: str, fn: Any, on_timer: Any = None, schema: Any = None,
                migrate_state: Callable[[Any, Any], Any] | None = None, canary: int = 0, rate_bound: float = 0.5,
                timeout: float | None = 60.0) -> UpgradeRecord:
    """Upgrade ``operator`` of the job that runs ``plan``; returns its history entry (see ``Job.upgrade``).

    Raises:
        UpgradeError: refused before the cut (naming the operator and the failed check).
        CanaryRolledBackError: the canary failed; the old code runs on, nothing lost or emitted twice.
    """
    started, t0 = time.time(), time.monotonic()
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
    change = CodeChange.of(operator, fn, on_timer, schema)
    if migrate_state is not None:
        if not callable(migrate_state):
            raise UpgradeError(f"upgrade of operator {operator!r}: migrate_state must be callable "
                               f"(fn(key, old_state) -> new_state), got {type(migrate_state).__name__}")
        if node.kind is not OperatorKind.KEYED:
            raise UpgradeError(f"upgrade of operator {operator!r}: migrate_state= needs a keyed operator")
        try:
            cloudpickle.dumps(migrate_state)
        except Exception as exc:
            raise UpgradeError(f"upgrade of operator {operator!r}: migrate_state does not pickle: {exc}") from exc
    samples = run_op(SampleInput(operator, timeout), timeout)
    sample = [pair for key in sorted(samples) for pair in samples[key]]
    expected = check_upgrade(node.make_logic, node.code, change, sample)
    entry = UpgradeRecord(uuid.uuid4().hex[:10], started, operator, _describe(node.code), change.describe(),
                          UpgradeOutcome.DONE, canary=canary)
    acks: dict[Any, Any] = {}
    if canary:
        acks.update(run_op(UpgradeOperator(change, [0], migrate_state, canary, expected, rate_bound, timeout),
                           timeout))
        verdict = acks[(operator, 0)]["verdict"]
        if not verdict.passed:
            cut, pause = _cut(plan, acks)
            entry = entry.replace(outcome=UpgradeOutcome.ROLLED_BACK, canary_result=verdict.reason, cut=cut,
                                  pause_ms=pause, duration_s=time.monotonic() - t0, error=verdict.reason)
            raise CanaryRolledBackError(f"upgrade of operator {operator!r} rolled back: the canary (instance 0) "
                                        f"{verdict.reason}; the old code runs on", entry)
        entry = entry.replace(canary_result="passed" + (f" ({verdict.reason})" if verdict.reason else ""))
        rest = [i for i in range(node.parallelism) if i != 0]
        if rest:
            acks.update(run_op(UpgradeOperator(change, rest, migrate_state, timeout_s=timeout), timeout))
    else:
        acks.update(run_op(UpgradeOperator(change, None, migrate_state, timeout_s=timeout), timeout))
    node.code = change
    cut, pause = _cut(plan, acks)
    return entry.replace(cut=cut, pause_ms=pause, duration_s=time.monotonic() - t0)
