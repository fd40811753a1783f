"""oprun.py: one control op at its controller: the controller-side state machine and handlers.

Lifecycle::

    RUNNING --every sink returned (or finished)--> COMPLETE
    RUNNING --timeout / failure / handler error--> FAILED

``on_begin`` runs at the first return, ``on_next`` at each, ``on_complete``
when no sink is outstanding (its value is the op's result) and
``on_dispose`` in either terminal state.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any, Iterable, Mapping

from chiray.operators.errors import ChirayError

from .message import InstanceId, instance_id

__all__ = ["OpState", "OpRun", "JobView", "job_view", "OpTimeoutError", "OpFailedError"]


class OpTimeoutError(ChirayError, TimeoutError):
    """A control op did not complete within its timeout."""


class OpFailedError(ChirayError, RuntimeError):
    """A control op failed (a handler raised, an instance or host failed, the job ended)."""


class OpState(str, enum.Enum):
    RUNNING = "RUNNING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclasses.dataclass(frozen=True, slots=True)
class JobView:
    """The controller's view of a job's topology (a ``ControllerContext``)."""

    job_name: str
    operators: dict[str, dict[str, Any]]
    instances: list[InstanceId]
    sources: list[InstanceId]
    sinks: list[InstanceId]
    edges: dict[InstanceId, list[InstanceId]]

    def downstream_of(self, instance: InstanceId) -> list[InstanceId]:
        return list(self.edges.get(instance_id(instance), []))


def job_view(name: str, plan: Any) -> JobView:
    """The topology of a ``PhysicalPlan`` as a controller hands it to control ops."""
    nodes = plan.graph.nodes
    edges: dict[InstanceId, list[InstanceId]] = {i: [] for i in plan.instances}
    for c in plan.channels:
        edges[c.src].append(c.dst)
    kinds = {n: nodes[n].kind.value for n in nodes}
    return JobView(
        name,
        {n.name: {"kind": n.kind.value, "parallelism": n.parallelism, "key": n.key,
                  "num_bins": n.num_bins, "uid": n.state_id} for n in nodes.values()},
        list(plan.instances),
        [i for i in plan.instances if kinds[i[0]] == "source"],
        [i for i in plan.instances if kinds[i[0]] == "sink"],
        edges,
    )


class OpRun:
    """The progress of one op at its controller.

    Args:
        op: the ``ControlOp``.
        op_id: its id.
        ctx: the controller context handed to its handlers.
        sinks: the sink instances that must return it.
    """

    def __init__(self, op: Any, op_id: str, ctx: Any, sinks: Iterable[InstanceId]):
        self.op = op
        self.op_id = op_id
        self.ctx = ctx
        self.waiting = set(sinks)
        self.acks_waiting: set[InstanceId] = set(op.expected_acks(ctx))
        op.acks.clear()
        self.state = OpState.RUNNING
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.finished_at: float | None = None
        self._begun = False

    @property
    def elapsed_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started

    def on_return(self, instances: Iterable[InstanceId], payloads: Mapping[InstanceId, Any]) -> None:
        """Sinks returned the op with their payloads."""
        if self.state is not OpState.RUNNING:
            return
        try:
            if not self._begun:
                self._begun = True
                self.op.on_begin(self.ctx)
            self.op.returned.update(payloads)
            self.op.on_next(self.ctx, payloads)
        except Exception as exc:
            self.fail(OpFailedError(f"control op {self.op_id} ({self.op.kind}): on_next raised {exc!r}"), exc)
            return
        self.waiting.difference_update(instance_id(i) for i in instances)
        self._maybe_complete()

    def on_ack(self, instance: InstanceId, payload: Any) -> None:
        """An instance acknowledged the op directly (e.g. its checkpoint state is durable)."""
        if self.state is not OpState.RUNNING:
            return
        instance = instance_id(instance)
        if isinstance(payload, BaseException):
            self.fail(OpFailedError(f"control op {self.op_id} ({self.op.kind}) failed at {instance}: "
                                    f"{payload!r}"), payload)
            return
        self.op.acks[instance] = payload
        self.acks_waiting.discard(instance)
        self._maybe_complete()

    def sinks_finished(self, instances: Iterable[InstanceId]) -> None:
        """Sinks ended their input: they cannot return the op any more; stop waiting for them."""
        instances = [instance_id(i) for i in instances]
        unacked = sorted(set(instances) & self.acks_waiting)
        if unacked and self.state is OpState.RUNNING:
            self.fail(OpFailedError(f"control op {self.op_id} ({self.op.kind}): the job finished before the op "
                                    f"completed: its input ended, and sinks {unacked} closed before the op "
                                    f"reached them (an op on a finishing job has nothing left to act on)"))
            return
        self.waiting.difference_update(instances)
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.waiting or self.acks_waiting or self.state is not OpState.RUNNING:
            return
        try:
            self.result = self.op.on_complete(self.ctx)
        except Exception as exc:
            self.fail(OpFailedError(f"control op {self.op_id} ({self.op.kind}): on_complete raised {exc!r}"), exc)
            return
        self.state = OpState.COMPLETE
        self._dispose()

    def fail(self, error: BaseException, cause: BaseException | None = None) -> None:
        if self.state is not OpState.RUNNING:
            return
        if cause is not None:
            error.__cause__ = cause
        self.error = error
        self.state = OpState.FAILED
        self._dispose()

    def check_timeout(self, now: float | None = None) -> bool:
        """Fail the op if its timeout passed; True if it did."""
        timeout = getattr(self.op, "timeout_s", None)
        now = time.monotonic() if now is None else now
        if self.state is OpState.RUNNING and timeout is not None and now - self.started > timeout:
            self.fail(OpTimeoutError(
                f"control op {self.op_id} ({self.op.kind}) did not complete in {timeout} s; "
                f"sinks still to return it: {sorted(self.waiting)[:8]}; "
                f"instances still to acknowledge: {sorted(self.acks_waiting)[:8]}"))
            return True
        return False

    def _dispose(self) -> None:
        self.finished_at = time.monotonic()
        try:
            self.op.on_dispose(self.ctx)
        except Exception:  # a failing dispose must not hide the op's outcome
            pass
