"""coordination.py: the controller's logic: a job's lifecycle, and the control ops a controller runs.

A plain state machine, unit-tested without Ray; ``actors.controller`` wraps
it in a Ray actor. Lifecycle::

    RUNNING --all sinks finished--> FINISHED
    RUNNING --host lost, restarts left--> RECOVERING --restarted()--> RUNNING
    RUNNING --instance failed / host lost, no restarts left--> FAILED
    RUNNING --cancel()--> CANCELLED

The first terminal state wins; later events are ignored.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import time
from typing import Any, Callable, Iterable

from .message import Configs, ControlMessage, ControlReturn, instance_id
from .oprun import OpFailedError, OpRun, OpState

__all__ = ["JobState", "JobLifecycle", "LifecycleSnapshot", "OpCoordinator"]


class JobState(str, enum.Enum):
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)


@dataclasses.dataclass(frozen=True, slots=True)
class LifecycleSnapshot:
    """What the controller knows of a job at one moment."""

    state: JobState
    finished_instances: tuple[tuple[str, int], ...]
    pending_sinks: tuple[tuple[str, int], ...]
    error: BaseException | None
    events: tuple[str, ...]
    restarts: int = 0


class JobLifecycle:
    """Tracks a job's instances to completion or failure.

    Args:
        sinks: every sink instance; the job finishes when all have finished.
        max_restarts: recoveries allowed before a loss fails the job.
        restart_window_s: count only the recoveries of the last this many seconds (a failure rate, as
            Flink's failure-rate restart strategy: a job that fails now and then keeps recovering for ever,
            one that fails in a loop stops); None: every recovery of the job's life counts.
        clock: seconds (injectable for tests).
    """

    def __init__(self, sinks: Iterable[tuple[str, int]], max_restarts: int = 0,
                 restart_window_s: float | None = None, clock: Callable[[], float] = time.time):
        self.state = JobState.RUNNING
        self._sinks = tuple(sinks)
        self._pending = set(self._sinks)
        if not self._pending:
            raise ValueError("a job needs at least one sink instance")
        self._finished: list[tuple[str, int]] = []
        self.results: dict[tuple[str, int], Any] = {}
        self.error: BaseException | None = None
        self.events: list[str] = []
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self._clock = clock
        self.restarts = 0
        self._restarted_at: list[float] = []  # clock times of the recoveries that count (restart_window_s)
        self.recovery_reason: str | None = None

    def inherit(self, events: Iterable[str], restarts: int) -> None:
        """Take over the history of a job whose controller this one replaces (its events, restarts so far;
        with a restart window, the inherited ones count as of now)."""
        self.events = [*events, *self.events]
        self._count_inherited(int(restarts))

    def take_over_recovery(self, events: Iterable[str], restarts: int, reason: str) -> None:
        """Continue a recovery that the controller this one replaces had begun (same history, same restart)."""
        self.events = list(events)
        self._count_inherited(int(restarts))
        self.state = JobState.RECOVERING
        self.recovery_reason = reason

    def lost(self, error: BaseException, reason: str, recoverable: bool = True) -> None:
        """Something died: recover if allowed and restarts are left, else fail."""
        if self.state is not JobState.RUNNING:
            return
        used = self._recent()
        window = "" if self.restart_window_s is None else f" within {self.restart_window_s:g} s"
        if recoverable and used < self.max_restarts:
            self.restarts += 1
            self._restarted_at.append(self._clock())
            self.state = JobState.RECOVERING
            self.recovery_reason = reason
            self.events.append(f"recovering (restart {used + 1} of {self.max_restarts}{window}): {reason}")
            return
        if recoverable and self.max_restarts:
            reason = f"{reason} (after {used} restarts{window}, the limit)"
            try:
                limited = type(error)(f"{error} (after {used} restarts{window}, the limit of max_restarts)")
                limited.__cause__ = error.__cause__
                error = limited
            except TypeError:  # an error built from other arguments (OperatorError) stays as it was
                pass
        self.fail(error, reason)

    def _recent(self) -> int:
        """The recoveries that count against ``max_restarts`` now."""
        if self.restart_window_s is None:
            return self.restarts
        since = self._clock() - self.restart_window_s
        self._restarted_at = [t for t in self._restarted_at if t > since]
        return len(self._restarted_at)

    def _count_inherited(self, restarts: int) -> None:
        now = self._clock()
        self._restarted_at.extend([now] * max(0, restarts - self.restarts))
        self.restarts = max(self.restarts, restarts)

    def restarted(self, checkpoint_id: int | None, seconds: float, where: str | None = None) -> None:
        """Recovery done: every instance runs again from ``checkpoint_id`` (None: from the start);
        ``where`` names it when it is not one of the job's own checkpoints (a restore point)."""
        if self.state is not JobState.RECOVERING:
            return
        self.state = JobState.RUNNING
        self._pending = set(self._sinks)
        self._finished = []
        self.results = {}
        if where is None:
            where = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "the start"
        self.events.append(f"recovered from {where} in {seconds:.2f} s")

    def add_sinks(self, sinks: Iterable[tuple[str, int]]) -> None:
        """A branch added while the job runs (``job.add_branch``): the job finishes only once these sink
        instances have finished too (a recovery expects them as well)."""
        added = [s for s in sinks if s not in self._sinks]
        self._sinks = (*self._sinks, *added)
        if self.state is JobState.RUNNING:
            self._pending.update(added)

    def drop_sinks(self, sinks: Iterable[tuple[str, int]]) -> None:
        """A branch that was not added after all (its op failed), or that was removed: the job no longer
        waits for these sink instances."""
        gone = set(sinks)
        self._sinks = tuple(s for s in self._sinks if s not in gone)
        self._pending -= gone
        if not self._pending and self.state is JobState.RUNNING:
            self.state = JobState.FINISHED
            self.events.append("finished")

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
                                 self.error, tuple(self.events), self.restarts)


def check_extra_edges(op_id: str, edges: Iterable[Any], view: Any) -> tuple:
    """An op's extra edges, checked: known instances, no repeats, and G' stays acyclic.

    Raises:
        ValueError: naming the op and the offending edge.
    """
    known = set(map(tuple, view.instances))
    extra: list[tuple] = []
    for a, b in edges:
        edge = (tuple(a), tuple(b))
        if edge[0] not in known or edge[1] not in known:
            raise ValueError(f"control op {op_id}: extra edge {edge[0]} -> {edge[1]} names an unknown instance")
        if edge in extra:
            raise ValueError(f"control op {op_id}: extra edge {edge[0]} -> {edge[1]} is listed twice")
        extra.append(edge)
    if not extra:
        return ()  # G itself is acyclic: nothing to walk
    graph: dict[tuple, list[tuple]] = {i: list(map(tuple, view.downstream_of(i))) for i in known}
    for a, b in extra:
        graph[a].append(b)
    state: dict[tuple, int] = {}  # 1: on the path, 2: done

    def visit(node: tuple, path: list[tuple]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = " -> ".join(map(str, path[path.index(nxt):] + [node, nxt])) if nxt in path else (
                    f"{node} -> {nxt}")
                raise ValueError(f"control op {op_id}: its extra edges make the meta-topology cyclic: {cycle}")
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(known):
        if node not in state:
            visit(node, [])
    return tuple(extra)


class OpCoordinator:
    """The control ops one controller started: building their messages and tracking their returns.

    Args:
        name: the controller's name (the ``origin`` of its ops).
        view: the job's topology, handed to op handlers as their context.
    """

    def __init__(self, name: str, view: Any, keep_finished: int = 1000):
        self.name = name
        self.view = view
        self.runs: dict[str, Any] = {}  # every op still running, and the newest finished ones
        self.running: dict[str, Any] = {}
        self.finished_sinks: set[tuple[str, int]] = set()
        self.keep_finished = keep_finished
        self._finished: list[str] = []  # finished since the last take_finished()
        self._retired: collections.deque[str] = collections.deque()
        self._ids = itertools.count()

    def _sweep(self) -> None:
        """Move ops that finished out of ``running``; forget the oldest beyond ``keep_finished``."""
        for op_id, run in list(self.running.items()):
            if run.state is not OpState.RUNNING:
                del self.running[op_id]
                self._finished.append(op_id)
                self._retired.append(op_id)
        while len(self._retired) > self.keep_finished:
            self.runs.pop(self._retired.popleft(), None)

    def take_finished(self) -> list[str]:
        """Ops that completed or failed since the last call."""
        self._sweep()
        done, self._finished = self._finished, []
        return done

    def start(self, op: Any, op_id: str | None = None, view: Any = None) -> ControlMessage:
        """Run ``op.on_init`` and build its message (``seq`` is set by the injector).

        ``view`` overrides the topology for this op only (a rescale step sees
        the old and the new instances).

        Raises:
            TypeError / ValueError: the op is not a ControlOp or its extra edges are invalid.
        """
        from .op import ControlOp

        if not isinstance(op, ControlOp):
            raise TypeError(f"run_control(): expected a ControlOp, got {type(op).__name__}")
        op_id = op_id or f"{self.name}:{next(self._ids)}:{op.kind}"
        if op_id in self.runs:
            raise ValueError(f"control op id {op_id!r} is already in use")
        view = view or self.view
        configs = Configs(op.on_init(view) or {}, op.default_config())
        extra = check_extra_edges(op_id, op.extra_edges(view), view)
        run = OpRun(op, op_id, view, view.sinks)
        self.runs[op_id] = run
        self.running[op_id] = run
        run.sinks_finished(self.finished_sinks)
        return ControlMessage(op_id, op.kind, bool(op.blocking), -1, self.name, op, configs, extra)

    def on_return(self, ret: ControlReturn) -> None:
        run = self.running.get(ret.op_id or "")
        if run is not None:
            run.on_return(ret.instances, ret.payload or {})

    def on_ack(self, op_id: str, instance: tuple[str, int], payload: Any) -> None:
        run = self.running.get(op_id)
        if run is not None:
            run.on_ack(instance, payload)

    def sinks_finished(self, sinks: Iterable[tuple[str, int]]) -> None:
        sinks = [instance_id(s) for s in sinks]
        self.finished_sinks.update(sinks)
        for run in list(self.running.values()):
            run.sinks_finished(sinks)

    def fail_all(self, error: BaseException) -> None:
        for run in list(self.running.values()):
            run.fail(OpFailedError(f"control op {run.op_id} ({run.op.kind}) failed: {error}"), error)

    def check_timeouts(self) -> None:
        for run in list(self.running.values()):
            run.check_timeout()
