"""rescaler.py: the rescale runner: a plan's steps carried out one by one on a job, Ray or in-process.

:class:`Rescaler` measures the operator's bins where planning needs it, makes
the plan (``control.rescaleplan.plan_rescale``) and runs its steps; a
migration step in five phases: *prepare* (start the new hosts and have every
host prepare the topology change, when it changes), *inject* its
``MigrateBins`` op, *wait* for it, *apply* (the job sees the new plan),
*retire* (hosts left empty go once drained). It sees the job through a
:class:`RescaleTarget`: the job on Ray (``rescalejob.JobTarget``) or the
in-process harness (``harness.LocalRun``), so that the same steps run in seeded
tests without Ray. Its progress is a :class:`Tally`, read from any thread.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from chiray.control.message import InstanceId
from chiray.control.op import ControlOp
from chiray.control.oprun import JobView, OpFailedError, job_view
from chiray.control.ops.migrate import MigrateBins, ReplicateBins
from chiray.control.ops.monitor import Monitor
from chiray.control.ops.noop import NoOp
from chiray.control.planning import PLANNERS
from chiray.control.rescaleplan import (Drain, Migrate, Pause, Replicate, RescaleOptions, RescalePlan, Step,
                                        Strategy, bin_metrics, plan_rescale, unreached)
from chiray.operators.errors import ChirayError
from chiray.operators.graph import LogicalGraph, OperatorKind, PhysicalPlan, rescaled_plan

from .jobvalues import RescaleProgress, RescaleState
from ..runtime.topology import ChangePrepared

__all__ = ["RescaleError", "STRATEGIES", "RescaleRequest", "check_request", "RescaleTarget", "StartedOp", "HostChange",
           "place_change", "Tally", "Rescaler", "changes_topology", "change_views", "StepLogEntry"]

STRATEGIES = tuple(s.value for s in Strategy)
KEYED_STRATEGIES = tuple(s.value for s in Strategy if s.moves_bins)


class RescaleError(ChirayError, RuntimeError):
    """A rescale or migration could not be carried out (the reason says what happened to the job)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RescaleRequest:
    """A rescale as asked for, checked (:func:`check_request`).

    Attributes:
        operator / parallelism / strategy / planner: what to rescale, to what, how.
        assignment: the new bin table, given (a migration), or ``None``.
        options: the strategy and knobs.
    """

    operator: str
    parallelism: int
    strategy: str
    planner: str
    assignment: tuple[int, ...] | None
    options: RescaleOptions


def check_request(job: str, plan: PhysicalPlan, operator: str, parallelism: int | None, strategy: str,
                  planner: str, assignment: Sequence[int] | None, knobs: Mapping[str, object]) -> RescaleRequest:
    """A rescale of ``operator`` in job ``job`` (running ``plan``), checked (errors raise in the caller).

    Raises:
        ValueError: an unknown operator, strategy or planner, a source or sink, a bad parallelism or
            assignment, a keyed strategy or an assignment for a stateless operator, a bad knob.
        TypeError: an unknown knob.
    """
    nodes = plan.graph.nodes
    if operator not in nodes:
        raise ValueError(f"job {job!r} has no operator {operator!r}; operators: {list(nodes)}")
    node = nodes[operator]
    if node.kind in (OperatorKind.SOURCE, OperatorKind.SINK):
        raise ValueError(f"operator {operator!r} is a {node.kind.value}; only keyed and stateless "
                         "operators between them can be rescaled")
    parallelism = node.parallelism if parallelism is None else parallelism
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise ValueError(f"rescale of {operator!r}: parallelism must be an int >= 1, got {parallelism!r}")
    if strategy not in STRATEGIES:
        raise ValueError(f"rescale of {operator!r}: unknown strategy {strategy!r}; "
                         f"strategies: {list(STRATEGIES)}")
    keyed = node.kind is OperatorKind.KEYED
    if not keyed and strategy in KEYED_STRATEGIES:
        raise ValueError(f"rescale of {operator!r}: strategy {strategy!r} moves key bins, but {operator!r} "
                         "is not keyed (it has no state); use strategy='all_at_once'")
    if not keyed and assignment is not None:
        raise ValueError(f"migrate: operator {operator!r} is not keyed; it has no bins to move")
    if assignment is not None and (len(assignment) != node.num_bins or any(
            isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a < parallelism
            for a in assignment)):
        raise ValueError(f"migrate: assignment for {operator!r} must give each of its {node.num_bins} bins "
                         f"an instance in 0..{parallelism - 1}")
    options = RescaleOptions.of(strategy, knobs)  # raises on an unknown or bad knob
    if planner not in PLANNERS:
        raise ValueError(f"rescale of {operator!r}: unknown planner {planner!r}; "
                         f"planners: {sorted(PLANNERS)}")
    given = None if assignment is None else tuple(int(a) for a in assignment)
    return RescaleRequest(operator, parallelism, strategy, planner, given, options)


# -- what the runner needs of a job ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class HostChange:
    """Where the instances of a topology change run.

    Attributes:
        placement: instance -> host id, for the instances of the plans before and after.
        added: hosts to start (one for each new instance).
        retiring: hosts left without an instance (removed once drained, after the step).
    """

    placement: Mapping[InstanceId, int]
    added: tuple[int, ...]
    retiring: tuple[int, ...]


def place_change(placement: Mapping[InstanceId, int], host_ids: Iterable[int], new: PhysicalPlan,
                 allocate: Callable[[int], Sequence[int]], keep: Iterable[int] = ()) -> HostChange:
    """Each new instance of ``new`` on a new host (ids from ``allocate(n)``); hosts left empty, but for
    ``keep``, retire.

    Example:
        >>> from chiray.operators.graph import PhysicalPlan
        >>> new = PhysicalPlan(None, [("a", 0), ("m", 1)], [], {}, {}, {}, 0)
        >>> place_change({("a", 0): 0, ("m", 0): 1}, [0, 1], new, lambda n: range(7, 7 + n))
        HostChange(placement={('a', 0): 0, ('m', 0): 1, ('m', 1): 7}, added=(7,), retiring=(1,))
    """
    instances = set(new.instances)
    kept = {i: h for i, h in placement.items() if i in instances}
    missing = [i for i in new.instances if i not in kept]
    added = tuple(allocate(len(missing)))
    kept.update(zip(missing, added))
    used = set(kept.values()) | set(keep)
    full = dict(placement)
    full.update(kept)
    return HostChange(full, added, tuple(h for h in host_ids if h not in used))


class StartedOp(Protocol):
    """A control op a :class:`RescaleTarget` started: ``result(timeout)`` waits for what its op returns (raising
    ``OpFailedError`` or ``TimeoutError``); ``elapsed_s``: how long it took at its controller, once done."""

    @property
    def elapsed_s(self) -> float | None: ...

    def result(self, timeout: float | None = None) -> Any: ...


class RescaleTarget(Protocol):
    """The job a :class:`Rescaler` changes: its plan, its control ops and its hosts.

    An op handle (``start_op``) has ``result(timeout)`` (raising ``OpFailedError`` or ``TimeoutError``)
    and ``elapsed_s``. Methods that fail in a way the job must hear of raise ``RescaleError``.
    """

    name: str

    @property
    def plan(self) -> PhysicalPlan: ...

    def placement(self) -> dict[InstanceId, int]: ...

    def wait_running(self, timeout_s: float) -> None: ...

    def finished(self) -> set[InstanceId]: ...

    def start_op(self, op: ControlOp, op_id: str | None = None,
                 views: tuple[JobView, JobView] | None = None) -> StartedOp: ...

    def wait_op(self, handle: StartedOp, timeout_s: float | None) -> Any: ...

    def place(self, new: PhysicalPlan) -> HostChange: ...

    def prepare(self, op_id: str, new: PhysicalPlan, change: HostChange) -> list[ChangePrepared]: ...

    def apply(self, new: PhysicalPlan, placement: Mapping[InstanceId, int]) -> None: ...

    def retire(self, host_ids: Sequence[int]) -> None: ...

    def abandon(self, reason: str) -> None: ...

    def pause(self, seconds: float) -> None: ...


# -- the run ----------------------------------------------------------------------------------------


StepLogEntry = dict[str, object]
"""One entry of a rescale's step log: ``step`` (its number, ``"replicate"`` or ``"drain"``), ``elapsed_s``, and
what the step measured (``bins``, ``bytes``, its phases' seconds) or ``error``."""

COUNTERS = ("steps_done", "steps", "bins_moved", "bins", "bytes_moved", "bins_reloaded", "bytes_replicated",
            "predicted_bytes")
"""A rescale's counters: ``RescaleProgress``'s fields of the same names."""


class Tally:
    """A rescale's state, counters and step log: the runner writes, any thread reads (``progress``).

    Every field is read and written under ``_lock``.
    """

    def __init__(self, request: RescaleRequest):
        self._request = request
        self._lock = threading.Lock()
        self.state = RescaleState.WAITING
        self.started = time.monotonic()
        self.finished: float | None = None
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.first_step_ns: int | None = None  # when the first migration op was injected (after setup)
        self.step_log: list[StepLogEntry] = []

    def progress(self) -> RescaleProgress:
        with self._lock:
            request, c = self._request, self.counts
            elapsed = (self.finished or time.monotonic()) - self.started
            return RescaleProgress(
                request.operator, request.strategy, self.state, request.parallelism,
                steps_done=c["steps_done"], steps=c["steps"], bins_moved=c["bins_moved"], bins=c["bins"],
                bytes_moved=c["bytes_moved"], bins_reloaded=c["bins_reloaded"],
                bytes_replicated=c["bytes_replicated"], predicted_bytes=c["predicted_bytes"],
                elapsed_s=elapsed, first_step_ns=self.first_step_ns, step_log=tuple(self.step_log))

    def set(self, state: RescaleState) -> None:
        with self._lock:
            self.state = state

    def add(self, entry: StepLogEntry | None = None, **counts: int) -> None:
        """Add ``counts`` to the counters and ``entry`` to the step log."""
        with self._lock:
            for name, n in counts.items():
                self.counts[name] += n
            if entry is not None:
                self.step_log.append(entry)

    @property
    def steps_done(self) -> int:
        with self._lock:
            return self.counts["steps_done"]

    def start(self) -> None:
        """The run starts now (it waited for its turn until now)."""
        with self._lock:
            self.started = time.monotonic()

    def end(self, state: RescaleState) -> None:
        with self._lock:
            self.state, self.finished = state, time.monotonic()

    def first_step(self) -> None:
        with self._lock:
            if self.first_step_ns is None:
                self.first_step_ns = time.time_ns()

    def where(self) -> str:
        """The steps done so far, as "k of n steps" (for errors)."""
        with self._lock:
            return f"{self.counts['steps_done']} of {self.counts['steps']} steps"


class Rescaler:
    """Carries out one rescale on a target: plan it, then each step (see the module docstring).

    Args:
        target: the job.
        request: the rescale.
        tally: where its progress is counted.
    """

    def __init__(self, target: RescaleTarget, request: RescaleRequest, tally: Tally):
        self.target, self.request, self.tally = target, request, tally
        self.timeout_s = request.options.step_timeout_s
        self.replicas: dict[int, int] = {}  # bin -> version the new owners hold (the last Replicate's)
        self.key: str | tuple[str, ...] | None = None  # the operator's key (one per input of a two-input one)

    def run(self) -> RescalePlan:
        """Plan the rescale and carry out its steps; returns the plan.

        Raises:
            RescaleError: it could not be carried out.
        """
        self.target.wait_running(self.timeout_s)
        self.tally.set(RescaleState.PLANNING)
        plan = self.plan()
        self.tally.add(steps=plan.counted_steps, bins=plan.bins, predicted_bytes=plan.predicted_bytes)
        self.tally.set(RescaleState.MIGRATING)
        for step in plan.steps:
            self._run_step(step)
        return plan

    def _run_step(self, step: Step) -> None:
        """Carry out ``step``: the one place that tells the kinds of step apart."""
        if isinstance(step, Replicate):
            self._replicate(step)
        elif isinstance(step, Migrate):
            self._migrate(step)
        elif isinstance(step, Drain):
            self._drain(step)
        else:
            self._pause(step)

    def plan(self) -> RescalePlan:
        """Measure the operator's bins where planning needs it, then plan."""
        request, now = self.request, self.target.plan
        node = now.graph.nodes[request.operator]
        ended = sorted(self.target.finished() & set(now.instances))  # retired instances may still show
        if ended:
            raise RescaleError(f"cannot rescale {request.operator!r}: {ended[:4]} already finished (the "
                               "input ended); a job is rescaled while its input flows")
        if node.kind is not OperatorKind.KEYED:
            return plan_rescale(request.options, request.operator, node.parallelism, request.parallelism)
        keys = [e.key or "" for e in node.inputs]  # keyed inputs are hash edges: each has its key
        self.key = keys[0] if len(set(keys)) == 1 else tuple(keys)  # a two-input operator: one per input
        metrics = None
        if request.assignment is None and request.options.measures(request.planner):
            # the operator's states ready their bins' slots for the first step meanwhile
            measured = self.target.start_op(Monitor(prepare_moves=request.operator)).result(self.timeout_s)
            metrics = bin_metrics(measured, request.operator, len(now.bin_tables[request.operator]))
        return plan_rescale(request.options, request.operator, node.parallelism, request.parallelism,
                            now.bin_tables[request.operator], metrics, request.assignment, request.planner)

    # -- the steps -------------------------------------------------------------------------------

    def _migrate(self, step: Migrate) -> None:
        """Prepare (if the topology changes), inject, wait, apply, retire."""
        target, started = self.target, time.monotonic()
        old = target.plan
        new = rescaled_plan(old, self.request.operator, step.parallelism,
                            None if step.table is None else list(step.table))
        op = MigrateBins(self.request.operator, None if step.table is None else list(step.table), step.moves,
                         step.blocking, self.key, self.replicas, timeout_s=self.timeout_s,
                         everywhere=step.everywhere, reserve=step.reserve, retiring=step.retiring)
        op_id = f"controller:{uuid.uuid4().hex[:12]}:{op.kind}"
        change = self._prepare(op_id, old, new)
        self.tally.first_step()
        placement = target.placement() if change is None else change.placement
        handle = target.start_op(op, op_id, None if change is None else change_views(target.name, old, new))
        injected = time.monotonic()
        try:
            result = target.wait_op(handle, op.timeout_s)
        except (OpFailedError, TimeoutError) as exc:
            target.abandon(str(exc))
            raise RescaleError(f"rescale of {self.request.operator!r} failed during a step: {exc}") from exc
        waited = time.monotonic()
        target.apply(new, {i: placement[i] for i in new.instances})
        self.tally.add({"step": self.tally.steps_done + 1, "bins": result["bins"], "bytes": result["bytes"],
                        "elapsed_s": time.monotonic() - started, "prepare_s": injected - started,
                        "op_s": handle.elapsed_s, "wait_s": waited - injected,
                        "extract_s": result.get("extract_s", 0.0)},
                       steps_done=1, bins_moved=result["bins"], bytes_moved=result["bytes"],
                       bins_reloaded=result["reloaded"])
        if change is not None and change.retiring:
            target.retire(change.retiring)

    def _prepare(self, op_id: str, old: PhysicalPlan, new: PhysicalPlan) -> HostChange | None:
        """Where the instances of a topology change go, prepared at every host; ``None`` if it stays."""
        if not changes_topology(old, new):
            return None
        change = self.target.place(new)
        prepared = self.target.prepare(op_id, new, change)
        held = [i for p in prepared for i in p.held]
        missing = unreached(self.target.plan, held, [i for p in prepared for i in p.changed])
        if missing:  # every source before them ended before the prepare: they would wait for ever
            self.target.abandon(f"the input ended before a step's op could reach {sorted(missing)}")
            raise RescaleError(f"rescale of {self.request.operator!r}: the job's input ended before step "
                               f"{self.tally.steps_done + 1}'s op could reach {sorted(missing)}")
        return change

    def _replicate(self, step: Replicate) -> None:
        handle = self.target.start_op(ReplicateBins(self.request.operator, step.moves))
        try:
            result = self.target.wait_op(handle, self.timeout_s)
        except (OpFailedError, TimeoutError) as exc:
            raise RescaleError(f"rescale of {self.request.operator!r}: replicating bins failed: "
                               f"{exc}") from exc
        self.tally.add({"step": "replicate", "bins": len(result["versions"]), "bytes": result["bytes"],
                        "elapsed_s": handle.elapsed_s}, steps_done=1, bytes_replicated=result["bytes"])
        self.replicas = dict(result["versions"])

    def _drain(self, step: Drain) -> None:
        """Wait until the records queued behind the last step have gone through: a non-blocking op, in-band
        behind them, completes once every instance has taken what came before it. Only a pace: if it
        fails (not the job), the next step goes on, and the step log says why."""
        started = time.monotonic()
        entry: StepLogEntry = {"step": "drain"}
        try:
            handle = self.target.start_op(NoOp(blocking=False, timeout_s=self.timeout_s))
            self.target.wait_op(handle, self.timeout_s)
        except (OpFailedError, TimeoutError) as exc:
            entry["error"] = str(exc)
        entry["elapsed_s"] = time.monotonic() - started
        self.tally.add(entry)

    def _pause(self, step: Pause) -> None:
        self.target.pause(step.seconds)  # let queues drain between steps (a pacing knob, not synchronisation)


def changes_topology(old: PhysicalPlan, new: PhysicalPlan) -> bool:
    """Whether ``new`` has other instances than ``old``, or an edge partitioned otherwise."""
    return set(new.instances) != set(old.instances) or any(
        a.partition is not b.partition
        for n in new.graph.nodes for a, b in zip(new.graph.nodes[n].inputs, old.graph.nodes[n].inputs))


def change_views(name: str, old: PhysicalPlan, new: PhysicalPlan) -> tuple[JobView, JobView]:
    """The topology a changing op sees (the instances and channels of both plans), and the one after it."""
    seen = {c.channel_id for c in new.channels}
    channels = [*new.channels, *(c for c in old.channels if c.channel_id not in seen)]
    instances = [*new.instances, *(i for i in old.instances if i not in set(new.instances))]
    graph = new.graph
    gone = [n for name, n in old.graph.nodes.items() if name not in graph.nodes]
    if gone:  # a branch removed: the op still passes its operators, which end behind it
        graph = LogicalGraph(new.graph.name)
        for node in (*new.graph.nodes.values(), *gone):
            graph.add(dataclasses.replace(node, inputs=list(node.inputs)))
    union = PhysicalPlan(graph, instances, channels, new.output_edges, new.bin_tables, new.source_splits,
                         new.next_channel_id)
    return job_view(name, union), job_view(name, new)
