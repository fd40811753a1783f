"""coordination.py: the controller's logic: a job's lifecycle, and the control ops a controller runs.

A plain state machine, unit-tested without Ray; ``actors.controller`` wraps
it in a Ray actor. Lifecycle::

    RUNNING --all sinks finished--> FINISHED
    RUNNING --instance failed / host lost--> FAILED
    RUNNING --cancel()--> CANCELLED

The first terminal state wins; later events are ignored.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import Any, Iterable

from .message import Configs, ControlMessage, ControlReturn
from .oprun import OpFailedError, OpRun

__all__ = ["JobState", "JobLifecycle", "LifecycleSnapshot", "OpCoordinator"]


class JobState(str, enum.Enum):
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self is not JobState.RUNNING


@dataclasses.dataclass(frozen=True, slots=True)
class LifecycleSnapshot:
    """What the controller knows of a job at one moment."""

    state: JobState
    finished_instances: tuple[tuple[str, int], ...]
    pending_sinks: tuple[tuple[str, int], ...]
    error: BaseException | None
    events: tuple[str, ...]


class JobLifecycle:
    """Tracks a job's instances to completion or failure.

    Args:
        sinks: every sink instance; the job finishes when all have finished.
    """

    def __init__(self, sinks: Iterable[tuple[str, int]]):
        self.state = JobState.RUNNING
        self._pending = set(sinks)
        if not self._pending:
            raise ValueError("a job needs at least one sink instance")
        self._finished: list[tuple[str, int]] = []
        self.results: dict[tuple[str, int], Any] = {}
        self.error: BaseException | None = None
        self.events: list[str] = []

    def instance_finished(self, instance: tuple[str, int], result: Any = None) -> None:
        if instance in self._finished:
            return
        self._finished.append(instance)
        if instance in self._pending:
            self._pending.discard(instance)
            self.results[instance] = result
        if not self._pending and self.state is JobState.RUNNING:
            self.state = JobState.FINISHED
            self.events.append("finished")

    def fail(self, error: BaseException, reason: str) -> None:
        if self.state.terminal:
            return
        self.state = JobState.FAILED
        self.error = error
        self.events.append(f"failed: {reason}")

    def cancel(self) -> None:
        if self.state.terminal:
            return
        self.state = JobState.CANCELLED
        self.events.append("cancelled")

    def snapshot(self) -> LifecycleSnapshot:
        return LifecycleSnapshot(self.state, tuple(self._finished), tuple(sorted(self._pending)),
                                 self.error, tuple(self.events))


class OpCoordinator:
    """The control ops one controller started: building their messages and tracking their returns.

    Args:
        name: the controller's name (the ``origin`` of its ops).
        view: the job's topology, handed to op handlers as their context.
    """

    def __init__(self, name: str, view: Any):
        self.name = name
        self.view = view
        self.runs: dict[str, Any] = {}
        self.finished_sinks: set[tuple[str, int]] = set()
        self._ids = itertools.count()

    def start(self, op: Any) -> ControlMessage:
        """Run ``op.on_init`` and build its message (``seq`` is set by the injector).

        Raises:
            TypeError / ValueError: the op is not a ControlOp or its extra edges are invalid.
        """
        from .op import ControlOp

        if not isinstance(op, ControlOp):
            raise TypeError(f"run_control(): expected a ControlOp, got {type(op).__name__}")
        op_id = f"{self.name}:{next(self._ids)}:{op.kind}"
        configs = Configs(op.on_init(self.view) or {}, op.default_config())
        extra = tuple((tuple(a), tuple(b)) for a, b in op.extra_edges(self.view))
        known = set(map(tuple, self.view.instances))
        for a, b in extra:
            if a not in known or b not in known:
                raise ValueError(f"control op {op_id}: extra edge {a} -> {b} names an unknown instance")
        run = OpRun(op, op_id, self.view, self.view.sinks)
        self.runs[op_id] = run
        run.sinks_finished(self.finished_sinks)
        return ControlMessage(op_id, op.kind, bool(op.blocking), -1, self.name, op, configs, extra)

    def on_return(self, ret: ControlReturn) -> None:
        run = self.runs.get(ret.op_id or "")
        if run is not None:
            run.on_return(ret.instances, ret.payload or {})

    def sinks_finished(self, sinks: Iterable[tuple[str, int]]) -> None:
        sinks = [tuple(s) for s in sinks]
        self.finished_sinks.update(sinks)
        for run in self.runs.values():
            run.sinks_finished(sinks)

    def fail_all(self, error: BaseException) -> None:
        for run in self.runs.values():
            run.fail(OpFailedError(f"control op {run.op_id} ({run.op.kind}) failed: {error}"), error)

    def check_timeouts(self) -> None:
        for run in self.runs.values():
            run.check_timeout()
