"""upgrade.py: ``UpgradeOperator``, new code for a running operator at a cut (Chi's ``LoadFunc``), and
``SampleInput``, which fetches the recent input its checks run on.

``UpgradeOperator`` is a blocking op that holds only the inputs of the upgraded operator's instances (every other
instance forwards it without holding anything: upstream keeps running). Each upgraded instance, in
``on_complete`` (the op has arrived on all its inputs: the records before it were processed by the old code),
applies ``migrate_state`` to its keyed state, swaps in the new code and acknowledges the cut's position: the
records it took before the op on each input channel. How long its inputs were held is its pause.

With a canary only one instance is upgraded: it runs the new code on trial (``operators.upgrade.CanaryTrial``) and
acknowledges the trial's verdict when it ends; the other instances of the operator send it their records in and
out along extra edges of the meta-topology G' (instance -> canary), the old code's output rate the trial is
compared with. The runtime upgrades the remaining instances with a second op once the canary passed.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from ..message import InstanceId
from ..op import ControlOp, InstanceHandler
from .acks import OperatorAcks

__all__ = ["UpgradeOperator", "SampleInput"]


class SampleInput(OperatorAcks):
    """Non-blocking: each instance of ``operator`` acknowledges a sample of its recent input.

    Its result: instance -> list of (record batch, input index).
    """

    verb = "upgrade"

    class Instance(InstanceHandler):
        def on_complete(self, ctx: Any) -> None:
            if self.config:
                ctx.ack(ctx.recent_input())


class UpgradeOperator(ControlOp):
    """Swap ``change`` (an ``operators.upgrade.CodeChange``) into instances ``indexes`` of its operator.

    Args:
        change: the new code.
        indexes: the instances to upgrade (None: every one).
        migrate_state: ``fn(key, old) -> new`` applied to each key's state at the cut.
        canary: run the new code on trial for this many batches on the one instance of ``indexes``.
        schema: the output schema a canary must keep (None: any).
        rate_bound: a canary fails when its records out per record in depart from the old code's by more than
            this fraction of the larger.
        timeout_s: the op fails if not complete by then (with a canary: its trial included).

    Its result: instance -> what it acknowledged: ``{"cut": {channel id: records before the cut}, "records": n,
    "pause_ms": ms}``, with a canary also ``"verdict"`` (an ``operators.upgrade.TrialVerdict``).
    """

    blocking = True

    def __init__(self, change: Any, indexes: Iterable[int] | None = None,
                 migrate_state: Callable[[Any, Any], Any] | None = None, canary: int = 0,
                 schema: Any = None, rate_bound: float = 0.5, timeout_s: float | None = 60.0):
        super().__init__()
        self.change = change
        self.indexes = None if indexes is None else sorted(set(int(i) for i in indexes))
        self.migrate_state = migrate_state
        self.canary = int(canary)
        self.schema = schema
        self.rate_bound = rate_bound
        self.timeout_s = timeout_s
        if self.canary and (self.indexes is None or len(self.indexes) != 1):
            raise ValueError("UpgradeOperator: a canary upgrades exactly one instance")

    @property
    def operator(self) -> str:
        return str(self.change.operator)

    def _targets(self, ctx: Any) -> list[InstanceId]:
        every = [i for i in ctx.instances if i[0] == self.operator]
        return every if self.indexes is None else [i for i in every if i[1] in self.indexes]

    def on_init(self, ctx: Any) -> dict[InstanceId, Any]:
        if self.operator not in ctx.operators:
            raise ValueError(f"upgrade: unknown operator {self.operator!r}; operators: {sorted(ctx.operators)}")
        targets = self._targets(ctx)
        configs: dict[InstanceId, Any] = {i: {"upgrade": True} for i in targets}
        if self.canary:
            for other in self._others(ctx):
                configs[other] = {"report": targets[0]}
        return configs

    def _others(self, ctx: Any) -> list[InstanceId]:
        targets = set(self._targets(ctx))
        return [i for i in ctx.instances if i[0] == self.operator and i not in targets]

    def extra_edges(self, ctx: Any) -> list[tuple[InstanceId, InstanceId]]:
        if not self.canary:
            return []
        canary = self._targets(ctx)[0]
        return [(other, canary) for other in self._others(ctx)]

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return set(self._targets(ctx))

    class Instance(InstanceHandler):
        def __init__(self, op: "UpgradeOperator", config: Any):
            super().__init__(op, config)
            self.holds_inputs = bool(config and config.get("upgrade"))
            self.begun = time.monotonic()
            self.others: list[tuple[int, int]] = []  # (records in, records out) of the other instances

        def on_begin(self, ctx: Any) -> None:
            self.begun = time.monotonic()

        def on_next(self, ctx: Any, payload: Any, sender: Any) -> None:
            if isinstance(payload, tuple) and len(payload) == 2 and self.config and self.config.get("upgrade"):
                self.others.append(payload)

        def on_complete(self, ctx: Any) -> None:
            op: UpgradeOperator = self.op  # type: ignore[assignment]
            if not self.config:
                return
            if "report" in self.config:
                stats = ctx.statistics()
                ctx.attach(self.config["report"], (stats.records_in, stats.records_out))
                return
            cut = {"cut": ctx.input_records(), "records": ctx.statistics().records_in,
                   "pause_ms": (time.monotonic() - self.begun) * 1000.0}
            if not op.canary:
                ctx.upgrade_code(op.change, op.migrate_state)
                ctx.ack(cut)
                return
            stats = ctx.statistics()
            records_in = stats.records_in + sum(i for i, _ in self.others)
            records_out = stats.records_out + sum(o for _, o in self.others)
            reference = records_out / records_in if records_in else None
            ack = ctx.ack
            ctx.start_trial(op.change, op.migrate_state, op.canary, op.schema, reference, op.rate_bound,
                            lambda verdict: ack({**cut, "verdict": verdict}))

    def on_complete(self, ctx: Any) -> dict[InstanceId, Any]:
        return dict(self.acks)
