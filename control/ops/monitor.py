"""monitor.py: ``Monitor``, a non-blocking op that collects per-instance metrics in-band.

Each instance adds its own metrics to what its upstream instances attached
and passes the lot to exactly one downstream instance, so every instance's
metrics reach exactly one sink; sinks return them to the controller (merged at
aggregation relays). Metrics: records in/out, rates since the job started,
queued batches, back-pressured time, a source's backlog, keyed state size and keys per bin, and
the records per bin each instance routed to its hash edges (per-bin load).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from ..message import CONTROLLER, InstanceId
from ..op import ControlOp, InstanceHandler

__all__ = ["Monitor", "MonitorResult", "instance_metrics"]


@dataclasses.dataclass(frozen=True)
class MonitorResult:
    """What a ``Monitor`` op collected.

    Attributes:
        instances: instance -> its metrics dict.
        operators: operator -> sums of the numeric metrics over its instances.
        bin_loads: keyed operator -> records routed to each bin (a NumPy array), summed over senders.
        bin_bytes: keyed operator -> state bytes of each bin (a NumPy array).
        taken_at: ``time.time()`` at completion.
    """

    instances: dict[InstanceId, dict[str, Any]]
    operators: dict[str, dict[str, float]]
    bin_loads: dict[str, np.ndarray]
    taken_at: float
    bin_bytes: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def instance_metrics(ctx: Any) -> dict[str, Any]:
    """The metrics of one instance, read through its control context."""
    stats = ctx.statistics()
    out: dict[str, Any] = {
        "records_in": stats.records_in, "records_out": stats.records_out,
        "batches_in": stats.batches_in, "queued_batches": stats.queued_batches,
        "queued_bytes": stats.queued_bytes, "backpressured_s": stats.backpressured_s,
        "busy_s": stats.busy_s, "state_bytes": 0, "keys": 0, "backlog": getattr(stats, "backlog", 0),
    }
    state = ctx.state
    if state is not None:
        sizes = state.bin_sizes()
        counts = state.bin_key_counts()
        out["state_bytes"] = int(sum(sizes.values()))
        out["keys"] = int(sum(counts.values()))
        memory = getattr(state, "memory_nbytes", None)  # what the state really holds, where it can say
        out["state_memory_bytes"] = int(memory()) if memory is not None else out["state_bytes"]
        out["keys_per_bin"] = counts
        out["bytes_per_bin"] = sizes
    loads = {}
    for router in ctx.routers:
        counts = getattr(router, "bin_counts", None)
        if counts is not None:
            loads[router.operator] = counts.copy()
    out["routed_bin_counts"] = loads
    return out


class Monitor(ControlOp):
    """Non-blocking: collect every instance's metrics; ``Job.metrics()`` runs one."""

    blocking = False
    observes_only = True

    def __init__(self, timeout_s: float | None = 60.0, prepare_moves: str | None = None):
        """``prepare_moves``: the operator a rescale is about to plan for (its planner asks for
        these metrics first): its instances get their state ready for bins to move
        (``BinnedState.prepare_moves``, off their processing path), and the op completes once
        every one of them is ready, so that the rescale's first step finds them so."""
        super().__init__()
        self.timeout_s = timeout_s
        self.prepare_moves = prepare_moves

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return {tuple(i) for i in ctx.instances if i[0] == self.prepare_moves}  # type: ignore[misc]

    class Instance(InstanceHandler):
        def on_begin(self, ctx: Any) -> None:
            self.collected: dict[InstanceId, dict[str, Any]] = {}

        def on_next(self, ctx: Any, payload: Any, sender: Any) -> None:
            if payload:
                self.collected.update(payload)

        def on_complete(self, ctx: Any) -> None:
            self.collected[ctx.instance] = instance_metrics(ctx)
            downstream = ctx.downstream
            ctx.attach(downstream[0] if downstream else CONTROLLER, self.collected)
            if ctx.instance[0] == self.op.prepare_moves:  # type: ignore[attr-defined]
                ctx.ack_in_background(ctx.state.prepare_moves() if ctx.state is not None else (lambda: None))

    def on_complete(self, ctx: Any) -> MonitorResult:
        instances: dict[InstanceId, dict[str, Any]] = {}
        for payload in self.returned.values():
            instances.update(payload or {})
        operators: dict[str, dict[str, float]] = {}
        loads: dict[str, np.ndarray] = {}
        for (op, _), metrics in instances.items():
            totals = operators.setdefault(op, {})
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    totals[name] = totals.get(name, 0) + value
            for target, counts in metrics.get("routed_bin_counts", {}).items():
                loads[target] = loads.get(target, 0) + counts
        sizes: dict[str, np.ndarray] = {}
        for (op, _), metrics in instances.items():
            per_bin = metrics.get("bytes_per_bin")
            if per_bin:
                arr = sizes.setdefault(op, np.zeros(max(len(loads.get(op, ())), max(per_bin) + 1), dtype=np.int64))
                if len(arr) <= max(per_bin):
                    arr = sizes[op] = np.concatenate([arr, np.zeros(max(per_bin) + 1 - len(arr), dtype=np.int64)])
                for b, n in per_bin.items():
                    arr[b] += n
        return MonitorResult(instances, operators, loads, time.time(), sizes)
