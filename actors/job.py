"""job.py: ``submit()`` deploys a dataflow on Ray; ``Job`` is the driver's handle on it.

Example:
    >>> import ray
    >>> from operators import Dataflow, from_items
    >>> from actors import submit
    >>> flow = Dataflow("tiny")
    >>> flow.source(from_items([{"x": 1}, {"x": 2}])).collect()    # doctest: +SKIP
    >>> job = submit(flow); job.wait(timeout=60)                    # doctest: +SKIP
    >>> job.result().to_pylist()                                    # doctest: +SKIP
    [{'x': 1}, {'x': 2}]
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ray

from control.coordination import JobState, LifecycleSnapshot
from control.oprun import JobView, job_view
from operators.dataflow import Dataflow
from operators.graph import OperatorKind, PhysicalPlan, physical_plan

from .config import JobConfig
from .controller import JobController, SideController
from .errors import JobCancelledError, JobFailedError
from .host import OperatorHost
from .instance import InstanceStatistics
from .mailbox import control_trees
from .ophandle import OpHandle
from .placement import place

__all__ = ["submit", "Job", "JobStatus", "JobStatistics", "job_view"]


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None (wait forever), 0 (poll) or positive, got {timeout}")


@dataclasses.dataclass(frozen=True, slots=True)
class JobStatus:
    """A job's state, the instances that finished, and its events (failures, recoveries)."""

    name: str
    state: JobState
    finished_instances: tuple[tuple[str, int], ...]
    events: tuple[str, ...]
    error: BaseException | None


@dataclasses.dataclass(frozen=True, slots=True)
class JobStatistics:
    """A snapshot of every instance of a job.

    Attributes:
        instances: per instance, its ``InstanceStatistics``.
        taken_at: ``time.time()`` of the snapshot.
    """

    instances: tuple[InstanceStatistics, ...]
    taken_at: float

    def of(self, operator: str) -> list[InstanceStatistics]:
        return [s for s in self.instances if s.operator == operator]

    def records_out(self, operator: str) -> int:
        return sum(s.records_out for s in self.of(operator))

    def records_in(self, operator: str) -> int:
        return sum(s.records_in for s in self.of(operator))

    @property
    def buffered_batches(self) -> int:
        """Data messages in flight, buffered in channels, or waiting for credit, job-wide."""
        return sum(c.outstanding_batches for s in self.instances for c in s.outputs) + sum(
            s.pending_out for s in self.instances)


def submit(flow: Dataflow, *, config: JobConfig | None = None, **options: Any) -> "Job":
    """Validate ``flow``, deploy its controller and host actors, and start it.

    Args:
        flow: the dataflow.
        config: runtime options; or pass ``JobConfig`` fields as keywords.

    Returns:
        The running job's handle.

    Raises:
        ValueError, TypeError: the dataflow is invalid (naming the operator).
    """
    if config is None:
        config = JobConfig(**options)
    elif options:
        config = dataclasses.replace(config, **options)
    flow.validate()
    if not ray.is_initialized():
        ray.init()
    plan = physical_plan(flow.graph)
    num_hosts, placement = place(plan, config.num_hosts, config.placement)
    sinks = [i for i in plan.instances if plan.graph.nodes[i[0]].kind is OperatorKind.SINK]
    view = job_view(flow.name, plan)
    broadcast, _ = control_trees(plan, placement, config.control_fanout)
    controller = JobController.remote(flow.name, sinks, config.poll_interval_s, view, broadcast, placement)
    opts = {"num_cpus": config.host_num_cpus, "resources": config.host_resources or None,
            "max_concurrency": 1000, **config.host_options}
    hosts = [OperatorHost.options(**opts).remote(i, flow.name) for i in range(num_hosts)]
    job = Job(flow.name, plan, controller, hosts, view)
    try:
        plan_ref = ray.put(plan)
        peers = dict(enumerate(hosts))
        errors = ray.get([h.setup.remote(plan_ref, placement, config, peers, controller) for h in hosts])
        for error in errors:
            if error is not None:
                raise error
        ray.get(controller.start.remote(hosts))
        ray.get([h.start.remote() for h in hosts])
    except BaseException:
        job._shutdown()
        raise
    return job


class Job:
    """A running (or finished) job.

    Not thread-safe: use one Job handle from one thread. Lifecycle:
    ``RUNNING -> FINISHED | FAILED | CANCELLED``; once terminal, its actors are gone.
    """

    def __init__(self, name: str, plan: PhysicalPlan, controller: Any, hosts: list[Any],
                 view: JobView | None = None):
        self.name = name
        self.plan = plan
        self.view = view or job_view(name, plan)
        self._controller = controller
        self._hosts = hosts
        self._side: dict[str, Any] = {}
        self._final: LifecycleSnapshot | None = None
        self._results: dict[tuple[str, int], Any] = {}
        self._last_stats: JobStatistics | None = None
        self.started_at = time.time()

    # -- waiting ---------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job finishes.

        Args:
            timeout: seconds; ``None`` waits forever, ``0`` polls.

        Raises:
            TimeoutError: still running after ``timeout``.
            OperatorError: a user function raised (its exception is the cause).
            JobFailedError: the job failed otherwise (a host died).
            JobCancelledError: the job was cancelled.
        """
        _check_timeout(timeout)
        if self._final is None:
            snap = ray.get(self._controller.wait.remote(timeout))
            if not snap.state.terminal:
                raise TimeoutError(f"job {self.name!r} still running after {timeout} s")
            self._finalize(snap)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        snap = self._final
        assert snap is not None
        if snap.state is JobState.FAILED:
            raise snap.error if snap.error is not None else JobFailedError(f"job {self.name!r} failed")
        if snap.state is JobState.CANCELLED:
            raise JobCancelledError(f"job {self.name!r} was cancelled")

    def _finalize(self, snap: LifecycleSnapshot) -> None:
        if snap.state is JobState.FINISHED:
            self._results = ray.get(self._controller.results.remote())
            try:
                self._last_stats = self._collect_statistics()
            except ray.exceptions.RayError:
                pass
        self._final = snap
        self._shutdown()

    def result(self, sink: str | None = None) -> Any:
        """The combined output of a sink (``collect()``: a ``pyarrow.Table``).

        Args:
            sink: the sink operator's name; may be omitted when there is one sink.
        """
        if self._final is None:
            self.wait()
        self._raise_if_failed()
        sinks = [n for n in self.plan.graph.nodes.values() if n.kind is OperatorKind.SINK]
        if sink is None:
            if len(sinks) != 1:
                raise ValueError(f"job {self.name!r} has sinks {[s.name for s in sinks]}; name one")
            node = sinks[0]
        else:
            matches = [s for s in sinks if s.name == sink]
            if not matches:
                raise ValueError(f"job {self.name!r} has no sink {sink!r}; sinks: {[s.name for s in sinks]}")
            node = matches[0]
        assert node.sink is not None
        parts = [self._results.get((node.name, i)) for i in range(node.parallelism)]
        return node.sink.combine(parts)

    # -- control ---------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the job and remove its actors; unfinished sink output is discarded. Idempotent."""
        if self._final is not None:
            return
        try:
            snap = ray.get(self._controller.cancel.remote(), timeout=30)
        except ray.exceptions.RayError:
            snap = LifecycleSnapshot(JobState.CANCELLED, (), (), None, ("cancelled",))
        if snap.state is JobState.FINISHED:
            self._finalize(snap)
            return
        try:
            ray.get([h.abort.remote() for h in self._hosts], timeout=30)
        except ray.exceptions.RayError:
            pass
        self._final = snap
        self._shutdown()

    def _shutdown(self) -> None:
        for actor in (*self._hosts, *self._side.values(), self._controller):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass

    # -- control operations ----------------------------------------------------------

    def run_control(self, op: Any, controller: str | None = None) -> OpHandle:
        """Start a control op on the running job.

        Args:
            op: a ``control.ControlOp``.
            controller: the name of a side controller (``add_controller``) to run it; default the job's.

        Returns:
            A handle: ``result(timeout)`` waits for the op's result.
        """
        handle = self._controller if controller is None else self._side_controller(controller)
        op_id = ray.get(handle.run_op.remote(op))
        return OpHandle(op_id, handle, getattr(op, "timeout_s", None))

    def add_controller(self, name: str) -> str:
        """Start a side controller (its own actor) that can run ops concurrently; returns its name."""
        side = SideController.options(name=None).remote(name, self.view, self._controller)
        ray.get(self._controller.register_controller.remote(name, side))
        self._side[name] = side
        return name

    def _side_controller(self, name: str) -> Any:
        if name not in self._side:
            raise ValueError(f"job {self.name!r} has no controller {name!r}; add it with add_controller()")
        return self._side[name]

    def metrics(self, timeout: float | None = 60.0) -> Any:
        """Run a non-blocking ``Monitor`` op in-band and return its result."""
        from control.ops.monitor import Monitor

        return self.run_control(Monitor()).result(timeout)

    # -- observing -------------------------------------------------------------------

    def status(self) -> JobStatus:
        """The job's state and events."""
        snap = self._final or ray.get(self._controller.snapshot.remote())
        return JobStatus(self.name, snap.state, snap.finished_instances, snap.events, snap.error)

    def _collect_statistics(self) -> JobStatistics:
        per_host = ray.get([h.statistics.remote() for h in self._hosts])
        return JobStatistics(tuple(s for stats in per_host for s in stats), time.time())

    def statistics(self) -> JobStatistics:
        """Per-instance counters, queue depths and back-pressured time (last snapshot once ended)."""
        if self._final is not None:
            if self._last_stats is None:
                raise RuntimeError(f"job {self.name!r} ended without statistics")
            return self._last_stats
        self._last_stats = self._collect_statistics()
        return self._last_stats

    @property
    def actors(self) -> list[Any]:
        """The job's Ray actors (hosts, side controllers, controller), for tests and tooling."""
        return [*self._hosts, *self._side.values(), self._controller]
