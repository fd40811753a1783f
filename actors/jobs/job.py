"""job.py: ``Job``, the driver's handle on a running job (``submit.py`` deploys one): a ``JobHandle``.

Example:
    >>> import ray
    >>> from chiray.operators import Dataflow, from_items
    >>> from chiray.actors import submit
    >>> flow = Dataflow("tiny")
    >>> flow.source(from_items([{"x": 1}, {"x": 2}])).collect()    # doctest: +SKIP
    >>> job = submit(flow); job.wait(timeout=60)                    # doctest: +SKIP
    >>> job.result().to_pylist()                                    # doctest: +SKIP
    [{'x': 1}, {'x': 2}]
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import threading
import time
import uuid
from typing import Any, Callable

import ray

from chiray.control.coordination import JobState, LifecycleSnapshot
from chiray.control.oprun import JobView, OpFailedError, job_view
from chiray.operators.branch import BranchNotSupportedError, branch_nodes, branch_of
from chiray.operators.graph import OperatorKind, PhysicalPlan
from chiray.operators.hashing import DEFAULT_NUM_BINS

from .autoscaler import start_autoscale
from ..runtime.controlops import SideController
from ..runtime.controller import HostedController, JobController, controller_host
from ..errors import ChirayError, JobCancelledError, JobFailedError, JobUnresponsiveError
from .handle import JobNotFoundError, check_timeout, ended_error
from .jobfiles import RescaleOutcome, commit_stopped, copy_savepoint
from .jobtopology import JobTopology
from .jobvalues import CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleRecord, UpgradeOutcome, UpgradeRecord
from ..runtime.statistics import InstanceStatistics
from ..runtime.storage import child_uri
from .tail import sink_node, tail_rows
from .ophandle import OpHandle, OpSender
from .pool import kill, warm_pool
from .rescale import RescaleHandle, start_rescale
from ..runtime.restore import RestoreInfo
from .joblogs import JobLogs, job_log_actors, job_logs
from .savepoints import SavepointInfo, delete_savepoint, find_savepoints, life_dir, running_restores, savepoint_root
from .supervisor import CONTROLLER_POOL_KEY, Deployment, Supervisor, release_outputs
from .upgrader import CanaryRolledBackError, UpgradeError, run_upgrade

__all__ = ["Job", "JobStatus", "JobStatistics"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class JobStatus:
    """A job's state, the instances that finished, and its events (failures, recoveries).

    Attributes:
        events: the events as text, oldest first (``str`` of each of ``history``).
        history: the same events as ``JobEvent`` values.
    """

    name: str
    state: JobState
    finished_instances: tuple[tuple[str, int], ...]
    events: tuple[str, ...]
    error: BaseException | None
    history: tuple[JobEvent, ...] = ()


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


class Job:
    """A running (or finished) job.

    Use one Job handle from one thread; its supervisor thread may swap the
    actors underneath (recovery) in ``topology`` (a ``JobTopology``, which
    says who changes what). ``plan`` and ``view`` change with rescale steps
    (``apply_rescale_step``). Lifecycle:
    ``RUNNING (<-> RECOVERING) -> FINISHED | FAILED | CANCELLED``; once
    terminal, its actors are gone.
    """

    def __init__(self, name: str, plan: PhysicalPlan, controller: Any, hosts: list[Any],
                 view: JobView | None = None, own_dir: str | None = None):
        self.name = name
        self.plan = plan
        self.view = view or job_view(name, plan)
        self.topology = JobTopology(controller, hosts)
        self._side: dict[str, Any] = {}
        self._senders: dict[Any, OpSender] = {}  # controller actor id -> its batching sender
        self._final: LifecycleSnapshot | None = None
        self._lost: LifecycleSnapshot | None = None  # set by the supervisor when no controller could be started
        self._results: dict[str, Any] = {}
        self._last_stats: JobStatistics | None = None
        self._lock = threading.RLock()  # guards _senders
        self._own_dir = own_dir  # a temporary checkpoint directory the job removes when it ends
        self._deployment: Deployment | None = None
        self._supervisor: Supervisor | None = None
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.autoscaler: Any = None  # see autoscale()
        self._rescales: list[tuple[RescaleRecord, RescaleHandle]] = []  # this handle's rescales, oldest first
        self._stopped: CheckpointInfo | None = None  # the checkpoint stop() ended the job at
        self._stopping = False  # stop() is taking its final checkpoint: other changes are refused
        self._forgotten = False
        self._savepoints_taken: list[str] = []  # the savepoints this handle took (savepoints() lists them)
        self._upgrades: list[UpgradeRecord] = []  # this handle's upgrades, oldest first

    def launch(self, deployment: Deployment, restore: RestoreInfo | None,
               make_controller: Callable[..., Any]) -> None:
        """Start the hosts and the supervisor (``submit()`` calls this once).

        Args:
            deployment: how to start the hosts (its ``host_ids`` and ``placement``).
            restore: the checkpoint to start from, if any.
            make_controller: starts a job controller: ``make_controller(host, host_id)`` in that host's
                process (the first one, where the job has none yet), ``make_controller()`` in an
                actor of its own (the supervisor's, after a recovery or the controller's death).

        Raises:
            JobFailedError, OperatorError, RayError: the hosts did not start; the job's actors are removed.
        """
        controller = self.topology.controller
        try:
            if controller is None:  # it runs in host 0's process (not JobConfig.controller_process)
                hosts = deployment.new_hosts(deployment.host_ids)
                # set up first (within deploy_timeout_s: Ray may have no room), then the controller there,
                # before any host runs (so none calls it first)
                hosted = HostedController(hosts[0], deployment.host_ids[0], deployment.config.run_id)
                hosts = deployment.start_hosts(hosted, restore, 0, hosts)
                try:
                    controller = make_controller(hosts[0], deployment.host_ids[0])
                except BaseException:
                    kill(hosts)
                    raise
                self.topology.set_controller(controller)
            else:
                hosts = deployment.start_hosts(controller, restore, 0)
            self.topology.install(hosts, deployment.host_ids, deployment.placement)
            ray.get(controller.start.remote(hosts, 0, restore is not None))
            ray.get([h.start.remote() for h in hosts])
        except BaseException:
            self._shutdown()
            raise
        self._deployment = deployment
        deployment.start_spares()
        self._supervisor = Supervisor(self, deployment, make_controller)
        self._supervisor.start()

    @property
    def checkpoint_dir(self) -> str | None:
        """Where this job's checkpoints go."""
        return self._deployment.storage.root_uri if self._deployment else None

    @property
    def deployment(self) -> Deployment | None:
        """How the job's hosts are (re)started; ``None`` until ``launch`` started them."""
        return self._deployment

    @property
    def final_snapshot(self) -> LifecycleSnapshot | None:
        """The job's last lifecycle snapshot once it ended; ``None`` while it runs."""
        return self._final

    @property
    def side_controllers(self) -> dict[str, Any]:
        """Side controller name -> its actor (``add_controller``)."""
        return dict(self._side)

    def apply_rescale_step(self, plan: PhysicalPlan, placement: dict[tuple[str, int], int]) -> None:
        """A rescale step completed: the job, its deployment and its side controllers see ``plan``.

        Args:
            plan: the plan after the step.
            placement: instance -> host id, for each instance of ``plan``.
        """
        with self.topology.lock:
            self.plan = plan
            self.view = job_view(self.name, plan)
            self.topology.set_placement(placement)
            if self._deployment is not None:
                self._deployment.update(plan, placement, list(self.topology.snapshot().host_ids))
        for side in self._side.values():
            side.set_view.remote(self.view)

    def _call(self, send: Callable[[Any], Any], timeout: float | None = None) -> Any:
        """``send(controller)`` (a remote call on the job controller) and its answer; retry while the
        supervisor replaces a dead controller."""
        deadline = time.monotonic() + 60.0
        while True:
            controller = self.topology.controller
            try:
                return ray.get(send(controller), timeout=timeout)
            except ray.exceptions.RayActorError:
                if self._lost is not None and self._final is None:
                    self._end_lost()
                if self._final is not None and self._final is self._lost:
                    raise self._final.error from None  # type: ignore[misc]
                if self._final is not None or time.monotonic() > deadline:
                    raise
                while (self.topology.controller is controller and self._lost is None
                       and time.monotonic() < deadline):
                    time.sleep(0.05)

    def controller_lost(self, reason: str, events: tuple[str, ...], restarts: int) -> None:
        """The supervisor gave up starting a job controller (``recovery_timeout_s``): the job has failed;
        the next verb ends it (its hosts are killed) and reports ``reason``."""
        self._lost = LifecycleSnapshot(JobState.FAILED, (), (), JobFailedError(f"job {self.name!r} failed: "
                                                                                f"{reason}"),
                                       (*events, f"failed: {reason}"), restarts)

    def _end_lost(self) -> None:
        assert self._lost is not None
        self._final = self._lost
        self.ended_at = time.time()
        self._shutdown()

    def _answer(self, send: Callable[[Any], Any], verb: str, timeout: float = 30.0) -> Any:
        """``_call`` for a reading verb: a controller that does not answer in ``timeout`` seconds (its
        process stopped or overloaded) is a clear error, never a hang."""
        try:
            return self._call(send, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise JobUnresponsiveError(f"job {self.name!r}: its controller did not answer {verb} within "
                                       f"{timeout:g} s (its process may be stopped or overloaded)") from None

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
            JobNotFoundError: the job was forgotten.
        """
        check_timeout(timeout)
        self._known()
        if self._final is None:
            snap = self._call(lambda c: c.wait.remote(timeout))
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
        if self._supervisor is not None:
            self._supervisor.stop()
        if snap.state is JobState.FINISHED:
            per_instance = self._call(lambda c: c.results.remote())
            try:
                self._last_stats = self._collect_statistics()
            except ray.exceptions.RayError:
                pass
            for node in self.plan.graph.nodes.values():
                if node.kind is OperatorKind.SINK:
                    assert node.sink is not None
                    parts = [per_instance.get((node.name, i)) for i in range(node.parallelism)]
                    node.sink.commit_final(parts)  # every instance finished: the last epoch is safe
                    self._results[node.name] = node.sink.combine(parts)
        self._final = snap
        self.ended_at = time.time()
        self._shutdown()
        if self._own_dir is not None and snap.state is JobState.FINISHED:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def result(self, sink: str | None = None) -> Any:
        """The combined output of a sink (``collect()``: a ``pyarrow.Table``).

        Args:
            sink: the sink operator's name; may be omitted when there is one sink.

        Raises:
            ValueError: no such sink, or several and none named.
            JobNotFoundError: the job was forgotten.
        """
        self._known()
        if self._final is None:
            self.wait()
        self._raise_if_failed()
        return self._results[sink_node(self.name, self.plan.graph, sink).name]

    def tail(self, sink: str | None = None, n: int = 10) -> Any:
        """The newest ``n`` rows that reached ``sink`` of the running job, oldest first (a ``pyarrow.Table``).

        A look at the output as it flows, whatever the sink (``collect()``, ``to_parquet``, ``print()``...):
        the rows are counted as they reach the sink, before a checkpoint commits them. Each sink instance
        keeps its newest 1,000 rows.

        Args:
            sink: the sink operator's name; may be omitted when there is one sink.
            n: how many rows, 1 to 1,000.

        Raises:
            ValueError: no such sink (or several and none named), or ``n`` out of range.
            JobEndedError: the job has ended (its output is in ``result()``).

        Example::

            job = chiray.submit(flow)
            print(job.tail("out", 5).to_pandas())
        """
        self._running("tail")
        return tail_rows(self.name, self.plan.graph, self.topology.hosts(), sink, n)

    # -- control ---------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the job and remove its actors; unfinished sink output is discarded. An ended job is left as
        it is (idempotent)."""
        if self._final is not None:
            return
        snap = self._halt()
        if snap.state is JobState.FINISHED:
            self._finalize(snap)
            return
        self._final = snap
        self.ended_at = time.time()
        self._shutdown()
        if self._own_dir is not None:  # nothing to restore from after a cancel
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def _halt(self) -> LifecycleSnapshot:
        """Stop the supervisor, the controller and the hosts; the controller's last snapshot."""
        if self._supervisor is not None:
            self._supervisor.stop()
        try:
            snap = ray.get(self.topology.controller.cancel.remote(), timeout=30)
        except ray.exceptions.RayError:
            snap = LifecycleSnapshot(JobState.CANCELLED, (), (), None, ("cancelled",))
        if snap.state is not JobState.FINISHED:
            try:
                ray.get([h.abort.remote() for h in self.topology.hosts()], timeout=30)
            except ray.exceptions.RayError:
                pass
        return snap

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """Stop gracefully: a final checkpoint (a savepoint into ``savepoint`` if given), its sink output
        committed, later output discarded, the hosts stopped; the job ends as finished.

        The final checkpoint is the job's last cut: first the autoscaler stops, running rescales and a
        running checkpoint end, and no periodic checkpoint, rescale or autoscale decision starts after
        it; so the committed output is exactly what the checkpoint (the savepoint) holds, and a job
        restored from it repeats none of it. If the final checkpoint fails, the job runs on as before.

        Args:
            savepoint: a directory to keep the final checkpoint in (as :meth:`savepoint`).
            timeout: seconds for the checkpoint.

        Returns:
            The final checkpoint (a savepoint's path if one was asked for).

        Raises:
            JobEndedError: the job has ended.
            OpFailedError / OpTimeoutError: the checkpoint failed; the job runs on.
        """
        self._running("stop")
        scaler, self._stopping = self.autoscaler, True
        try:
            self._quiesce(timeout)
            taken = self.savepoint_info(savepoint, timeout) if savepoint else self.checkpoint_info(timeout)
        except BaseException:
            self._stopping = False
            if self._final is None:
                try:
                    self._call(lambda c: c.cancel_stop.remote(), timeout=30)
                except ray.exceptions.RayError:
                    pass
                if scaler is not None and self.autoscaler is None:
                    start_autoscale(self, True, **scaler.options)
            raise
        try:
            self._last_stats = self._collect_statistics()
        except ray.exceptions.RayError:
            pass
        snap = self._halt()
        if snap.state is JobState.FINISHED:  # it reached the end of its input meanwhile: all output is final
            self._finalize(snap)
            return taken
        assert self._deployment is not None
        self._results = commit_stopped(self.plan.graph, self._deployment.storage, taken.id,
                                       self._deployment.config.run_id or "")
        self._stopped = taken
        events = (*snap.events, f"stopped at checkpoint {taken.id}" + (f" (savepoint {taken.path})" if savepoint
                                                                        else ""))
        self._final = LifecycleSnapshot(JobState.FINISHED, snap.finished_instances, (), None, events,
                                        snap.restarts)
        self.ended_at = time.time()
        self._shutdown()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
        return taken

    def note_event(self, text: str) -> None:
        """Add ``text`` to the job's events (``status().events``), as the autoscaler does when it pauses."""
        self._call(lambda c: c.note.remote(text), timeout=30)

    def _quiesce(self, timeout: float | None) -> None:
        """Before a stop's final checkpoint: stop the autoscaler, let running rescales end, and tell the
        controller that no other checkpoint may start (a running one ends first)."""
        if self.autoscaler is not None:
            scaler = self.autoscaler
            start_autoscale(self, False)
            scaler.join(timeout)
        for _, handle in list(self._rescales):
            if not handle.done():
                try:
                    handle.result(timeout)
                except Exception:  # its outcome is in rescales(); the stop goes on
                    pass
        self._call(lambda c: c.begin_stop.remote(timeout or 120.0), timeout=None if timeout is None else timeout + 30)

    def _not_stopping(self, verb: str) -> None:
        self._running(verb)
        if self._stopping:
            raise ChirayError(f"job {self.name!r} is stopping: cannot {verb} it")

    def forget(self) -> None:
        """Drop an ended job's results and statistics; later verbs raise ``JobNotFoundError``.

        The driver's job keeps no record elsewhere: forgetting releases what this handle holds.

        Raises:
            ChirayError: the job still runs (stop or cancel it first).
        """
        if self._final is None:
            raise ChirayError(f"job {self.name!r} is {self.status().state.value.lower()}: stop or cancel it "
                              f"first")
        self._results, self._last_stats, self._rescales, self._forgotten = {}, None, [], True

    def _known(self) -> None:
        if self._forgotten:
            raise JobNotFoundError(f"job {self.name!r} is gone (forgotten)")

    def _running(self, verb: str) -> None:
        """Raise ``JobEndedError`` if the job has ended (``JobNotFoundError`` once forgotten)."""
        self._known()
        if self._final is not None:
            raise ended_error(self.name, self._final.state, verb)

    def _shutdown(self) -> None:
        if self._supervisor is not None:
            self._supervisor.stop()
        if self.autoscaler is not None:  # no decision after the end (its thread sees the job ended)
            self.autoscaler.stop()
        with self._lock:
            senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            sender.close()
        deployment = self._deployment
        config = deployment.config if deployment is not None else None
        fed = any(n.source.fed_from_outside() for n in self.plan.graph.nodes.values()
                  if n.kind is OperatorKind.SOURCE and n.source is not None)
        reuse = config is not None and (config.warm_hosts or config.reuse_hosts) and not fed
        hosts = self.topology.hosts() if reuse else []
        for actor in self.actors:
            if actor not in hosts:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass
        if deployment is not None:  # unused spares are still bare: they may serve the next job
            deployment.recycle_hosts(list(hosts))
            release_outputs(deployment.sinks)
            spares, deployment.spares = deployment.spares, []
            deployment.refill_pool(spares)
            if deployment.config.warm_hosts and deployment.config.controller_process:
                warm_pool().fill(CONTROLLER_POOL_KEY, 1, JobController.remote)  # type: ignore[attr-defined]

    # -- control operations ----------------------------------------------------------

    def run_control(self, op: Any, controller: str | None = None, op_id: str | None = None) -> OpHandle:
        """Start a control op on the running job.

        Args:
            op: a ``control.ControlOp``.
            controller: the name of a side controller (``add_controller``) to run it; default the job's.
            op_id: the op's id (default: a fresh unique one).

        Returns:
            A handle: ``result(timeout)`` waits for the op's result.

        Raises:
            JobEndedError: the job has ended.
        """
        self._running("run a control op on")
        op_id = op_id or f"{controller or 'controller'}:{uuid.uuid4().hex[:12]}:{type(op).__name__}"
        handle = self.topology.controller if controller is None else self._side_controller(controller)
        with self._lock:  # a recovery gives the job a new controller: a new sender for it
            sender = self._senders.get(handle._actor_id)
            if sender is None:
                sender = self._senders[handle._actor_id] = OpSender(handle, controller or "controller")
        sender.submit(op, op_id)  # no round trip: result() waits for it
        return OpHandle(op_id, handle, getattr(op, "timeout_s", None))

    def add_controller(self, name: str) -> str:
        """Start a side controller (its own actor) that can run ops concurrently; returns its name."""
        side = SideController.options(name=None).remote(  # type: ignore[attr-defined]
            name, self.view, self.topology.controller)
        ray.get(self.topology.controller.register_controller.remote(name, side))
        self._side[name] = side
        return name

    def _side_controller(self, name: str) -> Any:
        if name not in self._side:
            raise ValueError(f"job {self.name!r} has no controller {name!r}; add it with add_controller()")
        return self._side[name]

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: Any) -> RescaleHandle:
        """Change an operator's parallelism while the job runs; no record is lost or processed twice.

        Args:
            operator: a keyed or stateless operator (not a source or sink).
            parallelism: the new number of instances (>= 1).
            strategy: "all_at_once" (one blocking step), "batched" (``chunk_bins`` per
                step), "fluid" (one bin per step) or "non_disruptive" (non-blocking steps;
                only records of moving bins wait for their state).
            planner: "ssm" (minimum bytes moved within load bound ``theta``),
                "round_robin" or "consistent_hash".
            **knobs: ``chunk_bins``, ``chunks``, ``priority`` ("hot_first", "arrival",
                "random"), ``replicate`` (non_disruptive), ``gap_s``, ``pace`` (each step
                waits for the backlog the one before left), ``theta``, ``seed``, ``step_timeout_s``.

        Returns:
            A handle: ``progress()`` and ``result(timeout)``.

        Raises:
            ValueError / TypeError: an unknown operator, strategy, planner or knob, a
                parallelism < 1, a source or sink, a keyed strategy for a stateless operator.
            RescaleError: another rescale of the operator is running.
            JobEndedError: the job has ended (a ``RescaleError`` too).
        """
        self._not_stopping("rescale")
        before = self.plan.graph.nodes[operator].parallelism if operator in self.plan.graph.nodes else None
        handle = start_rescale(self, operator, parallelism, strategy, planner, None, knobs)
        return self._note_rescale(handle, before, parallelism, strategy)

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                **knobs: Any) -> RescaleHandle:
        """Move bins among the existing instances of a keyed operator (load balancing).

        Args:
            operator: a keyed operator.
            assignment: the new bin -> instance table (one entry per bin).
            strategy: as for :meth:`rescale`.
            **knobs: as for :meth:`rescale`.
        """
        self._not_stopping("rescale")
        node = self.plan.graph.nodes.get(operator)
        parallelism = node.parallelism if node is not None else None
        handle = start_rescale(self, operator, parallelism, strategy, "ssm", list(assignment), knobs)  # type: ignore[arg-type]
        return self._note_rescale(handle, parallelism, parallelism, strategy)

    def _note_rescale(self, handle: RescaleHandle, before: int | None, after: int | None,
                      strategy: str) -> RescaleHandle:
        entry = RescaleRecord(uuid.uuid4().hex[:10], time.time(), handle.operator, before, after, strategy,
                              RescaleOutcome.RUNNING)
        self._rescales.append((entry, handle))
        return handle

    def rescales(self) -> tuple[RescaleRecord, ...]:
        """The rescales and migrations started through this handle, oldest first, with their outcomes."""
        self._known()
        out = []
        for entry, handle in self._rescales:
            if not handle.done():
                out.append(entry)
                continue
            progress = handle.progress()
            try:
                handle.result(0)
                outcome, error = RescaleOutcome.DONE, None
            except Exception as exc:
                outcome, error = RescaleOutcome.FAILED, str(exc)
            out.append(entry.replace(state=outcome, error=error, duration_s=progress.elapsed_s,
                                     bytes_moved=progress.bytes_moved, bins_moved=progress.bins_moved))
        return tuple(out)

    def upgrade(self, operator: str, fn: Any, *, on_timer: Any = None, schema: Any = None,
                migrate_state: Any = None, canary: int = 0, rate_bound: float = 0.5,
                timeout: float | None = 60.0) -> UpgradeRecord:
        """Replace ``operator``'s code while the job runs: every record is processed wholly by the old or wholly
        by the new code, the operators upstream never stop, and keyed state is kept.

        The new code is first run on a sample of the operator's recent input (it must not raise, and must return
        the declared ``schema``, else the old code's output schema). Then a blocking control op that holds only the
        operator's inputs swaps it in at each instance, at a cut whose position the returned record gives. A later
        checkpoint records the new code, so a recovery or a restore runs it.

        Example::

            record = job.upgrade("enrich", enrich_v2)                  # map, filter, flat_map
            job.upgrade("sessions", count_v2, migrate_state=lambda key, old: {"n": old, "sum": 0}, canary=20)
            job.upgrades()                                             # the history

        Args:
            operator: a ``map``, ``filter``, ``flat_map`` (batch or record level) or keyed ``process``.
            fn: the new function (its signature as the old one's).
            on_timer: a keyed process's new ``on_timer`` (None: keep it).
            schema: the output schema the new code returns (None: the old code's).
            migrate_state: ``fn(key, old_value) -> new_value`` (None deletes the key), applied to each key's
                state of a keyed process at the cut.
            canary: run the new code on instance 0 for this many batches first, its output held; if it raises,
                changes the output schema or its records out per record in depart from the old code's by more
                than ``rate_bound`` (a fraction of the larger), the old code and state come back at the cut and
                the records it saw are processed again by the old code (nothing lost, nothing emitted twice).
            rate_bound: the canary's output rate bound.
            timeout: seconds each of its control ops may take (the canary's trial included).

        Returns:
            The upgrade's ``UpgradeRecord``: old and new code identity, cut, pause, duration.

        Raises:
            UpgradeError: refused before the cut: an unknown operator or one without user code, code that does not
                pickle, raises on the sample or returns another schema.
            CanaryRolledBackError: the canary failed (an ``UpgradeError``); the old code runs on.
            JobEndedError: the job has ended.
        """
        self._not_stopping("upgrade")
        started = time.time()

        def run_op(op: Any, op_timeout: float | None) -> Any:
            return self.run_control(op).result(op_timeout)

        try:
            record = run_upgrade(run_op, self.plan, operator, fn, on_timer, schema, migrate_state, canary,
                                 rate_bound, timeout)
        except CanaryRolledBackError as exc:
            self._upgrades.append(exc.record)
            raise
        except UpgradeError as exc:
            self._upgrades.append(UpgradeRecord(uuid.uuid4().hex[:10], started, operator, "-", "-",
                                                UpgradeOutcome.REFUSED, time.time() - started, canary=canary,
                                                error=str(exc)))
            raise
        except Exception as exc:
            self._upgrades.append(UpgradeRecord(uuid.uuid4().hex[:10], started, operator, "-", "-",
                                                UpgradeOutcome.FAILED, time.time() - started, canary=canary,
                                                error=str(exc)))
            raise
        if self._deployment is not None and self._deployment.plan is not self.plan:
            node = self._deployment.plan.graph.nodes.get(operator) if self._deployment.plan else None
            if node is not None:
                node.code = self.plan.graph.nodes[operator].code
        self._upgrades.append(record)
        self.note_event(f"upgrade {operator} {record.old_code} -> {record.new_code} (pause "
                        f"{record.pause_ms or 0:.1f} ms)")
        return record

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        """The upgrades made through this handle, oldest first, with their outcomes."""
        self._known()
        return tuple(self._upgrades)

    def add_branch(self, from_operator: str, build: Callable[[Any], Any]) -> Any:
        """Add operators and sinks downstream of the running operator ``from_operator``, built by ``build(stream)``
        with the usual verbs; the branch starts at a cut and sees every record ``from_operator`` emits after it.

        Not carried out on Ray yet: the branch is checked (so a bad one is refused with its reason), then
        ``BranchNotSupportedError`` says how to make the change instead. The in-process harness
        (``actors.harness.LocalRun.add_branch``) adds branches.

        Raises:
            BranchError: an unknown operator, a sink to branch from, a branch without a sink, with a source,
                reading another running operator or leaving an operator unconsumed.
            BranchNotSupportedError: the branch is valid.
        """
        self._not_stopping("add_branch")
        branch_nodes(self.plan.graph, from_operator, build, DEFAULT_NUM_BINS)
        raise BranchNotSupportedError(
            f"job {self.name!r}: add_branch from {from_operator!r} is not carried out on Ray yet (a running job "
            "cannot take new sinks); stop it with a savepoint and submit the dataflow with the branch, "
            "restore_from= that savepoint (the branch then starts at the savepoint's cut)")

    def remove_branch(self, sink: str) -> Any:
        """Drain and remove the branch that ends in ``sink`` (the sink and the operators that feed only it).

        Not carried out yet: the branch is checked, then ``BranchNotSupportedError`` says how to make the change.

        Raises:
            BranchError: ``sink`` is no sink of the job, or its only one.
            BranchNotSupportedError: the branch is valid.
        """
        self._not_stopping("remove_branch")
        removed = branch_of(self.plan.graph, sink)
        raise BranchNotSupportedError(
            f"job {self.name!r}: remove_branch({sink!r}) (operators {removed}) is not carried out yet; stop the "
            "job with a savepoint and submit the dataflow without them, restore_from= that savepoint and "
            "allow_non_restored_state=True if they held state")

    def refill_spare_hosts(self, timeout: float | None = None) -> None:
        """Start spare hosts for those scale-outs took (``JobConfig.spare_hosts``) and wait until they are up.

        Starting a process costs a second or more of CPU; call this when the job can
        spare it (between rescales), so that the next scale-out finds its hosts ready.

        Args:
            timeout: seconds; ``None`` waits forever, ``0`` starts them without waiting.

        Raises:
            TimeoutError: not all up after ``timeout``.
        """
        check_timeout(timeout)
        if self._deployment is None or self._final is not None:
            return
        self._deployment.start_spares()
        if timeout == 0:
            return
        try:
            self._deployment.wait_spares(timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"job {self.name!r}: spare hosts not up after {timeout} s") from None

    def checkpoint(self, timeout: float | None = 120.0, full: bool = False) -> int:
        """Take an aligned, durable checkpoint now; returns its id once committed.

        A checkpoint is incremental (per key bin, what changed since the bin's previous checkpoint;
        ``JobConfig.checkpoint_max_deltas``); ``full=True`` writes every bin whole (a savepoint does).

        If the job controller dies while the checkpoint runs, the answer comes from storage: a complete
        checkpoint newer than any before the call is returned (it became durable), else it failed.

        Raises:
            JobEndedError: the job has ended (an ``OpFailedError`` too).
            OpFailedError / OpTimeoutError: the checkpoint failed (a host died, the input ended).
        """
        self._running("checkpoint")
        final = self._stopping  # the final checkpoint of stop(), the only one while it runs
        storage = self._deployment.storage if self._deployment is not None else None
        before = max(storage.committed(), default=0) if storage is not None else 0
        op_id = self._call(lambda c: c.checkpoint.remote(final, full))
        try:
            return OpHandle(op_id, self.topology.controller, timeout).result(timeout)
        except OpFailedError as exc:
            if storage is None or not isinstance(exc.__cause__, ray.exceptions.RayActorError):
                raise
            durable = max(storage.committed(), default=0)
            if durable > before:
                log.warning("job %s: the controller died after checkpoint %d became durable", self.name, durable)
                return durable
            raise OpFailedError(f"job {self.name!r}: the checkpoint did not complete: the job controller died "
                                f"before it was durable (the newest complete checkpoint is still "
                                f"{before or 'none'})") from exc

    def checkpoint_info(self, timeout: float | None = 120.0, full: bool = False) -> CheckpointInfo:
        """As :meth:`checkpoint`; returns the checkpoint's id, path and how long it took."""
        started = time.monotonic()
        checkpoint_id = self.checkpoint(timeout, full)
        assert self._deployment is not None
        return CheckpointInfo(checkpoint_id, self._deployment.storage.chk_dir(checkpoint_id),
                              time.monotonic() - started)

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        """A checkpoint now, copied to ``dir`` (default ``<checkpoint_dir>/savepoints``), kept until deleted.

        Each job life (run) has a directory of its own there, ``{dir}/{job}-{run}/chk-{id}``, so the
        savepoints of two jobs (or two lives of one) never replace each other.

        Returns:
            The savepoint's path: ``submit(flow, restore_from=<path>)`` starts a job from it (``dir``
            itself does too while it holds one job life's savepoints: the newest).

        Raises:
            ValueError: no ``dir`` for a job whose checkpoints go to a temporary directory (removed at its end).
            JobEndedError: the job has ended.
            OpFailedError / OpTimeoutError / CheckpointError: the checkpoint or its copy failed.
        """
        return self.savepoint_info(dir, timeout).path

    def savepoint_info(self, dir: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """As :meth:`savepoint`; returns the savepoint's id, path, duration and root directory."""
        self._running("savepoint")
        if dir is None and self._own_dir is not None:
            raise ValueError(f"job {self.name!r} keeps its checkpoints in a temporary directory, removed when it "
                             f"ends: give savepoint a directory (or submit with checkpoint_dir=...)")
        assert self._deployment is not None
        storage = self._deployment.storage
        life = life_dir(savepoint_root(storage.root_uri, dir), self.name, self._deployment.config.run_id)
        # full: every bin whole in the checkpoint's own directory, which the copy takes; never over another job's
        taken = copy_savepoint(storage, self.checkpoint_info(timeout, full=True), life)
        self._savepoints_taken.append(taken.path)
        return taken

    def savepoints(self) -> tuple[SavepointInfo, ...]:
        """The job's savepoints, oldest first: those under ``<checkpoint_dir>/savepoints`` and those this handle
        took into other directories (see ``chiray.actors.jobs.savepoints``)."""
        self._known()
        roots = [savepoint_root(self.checkpoint_dir)] if self.checkpoint_dir is not None else []
        return find_savepoints(self.name, roots, self._savepoints_taken)

    def delete_savepoint(self, path: str) -> SavepointInfo:
        """Delete savepoint ``path`` (its ``chk-N`` directory) of this job; returns it.

        Raises:
            SavepointError: not a savepoint of this job, or a running job was restored from it.
        """
        restores = running_restores()
        fallback = self._deployment.fallback if self._deployment is not None and self._final is None else None
        if fallback is not None:  # this job started from it: its recovery may still need it
            restores[self.name] = child_uri(fallback.storage.root_uri, f"chk-{fallback.checkpoint_id:06d}")
        return delete_savepoint(self.name, path, self.savepoints(), restores)

    def logs(self, lines: int = 100, since: Any = None) -> JobLogs:
        """The log lines Ray keeps of the job's hosts and controller (see ``chiray.actors.jobs.joblogs``)."""
        self._known()
        return job_logs(job_log_actors(self), lines, since)

    def metrics(self, timeout: float | None = 60.0) -> Any:
        """Run a non-blocking ``Monitor`` op in-band and return its result.

        Raises:
            JobEndedError: the job has ended.
        """
        from chiray.control.ops.monitor import Monitor

        self._running("read metrics of")
        return self.run_control(Monitor()).result(timeout)

    def autoscale(self, enabled: bool = True, **options: Any) -> Any:
        """Switch the DS2 autoscaler on (``latency_budget_ms=``, ``min_parallelism=``, ...) or off.

        See ``chiray.actors.jobs.autoscaler.start_autoscale`` for the options; decisions are in
        ``job.autoscaler.events``.

        Returns:
            The running ``Autoscaler`` (``None`` when switched off).

        Raises:
            JobEndedError: the job has ended.
        """
        self._not_stopping("autoscale")
        return start_autoscale(self, enabled, **options)

    # -- observing -------------------------------------------------------------------

    def status(self) -> JobStatus:
        """The job's state and events (``JobNotFoundError`` once forgotten)."""
        self._known()
        try:
            snap = self._final or self._answer(lambda c: c.snapshot.remote(), "status")
        except JobFailedError:  # the supervisor gave up on the controller meanwhile
            assert self._final is not None
            snap = self._final
        history = tuple(JobEvent.of(EventKind.RUN, text=e) for e in snap.events)
        return JobStatus(self.name, snap.state, snap.finished_instances, snap.events, snap.error, history)

    def info(self) -> JobInfo:
        """A summary: state, uptime, operators and parallelism, last checkpoint, records/s."""
        state = self.status().state
        storage = self._deployment.storage if self._deployment is not None else None
        ids = storage.committed() if storage is not None and not (self._own_dir and self._final) else []
        last = CheckpointInfo(ids[-1], storage.chk_dir(ids[-1])) if ids and storage is not None else None
        error = self._final.error if self._final is not None else None
        rate = None
        if self._final is None:
            try:
                sources = {n.name for n in self.plan.graph.nodes.values() if n.kind is OperatorKind.SOURCE}
                out = sum(s.records_out for s in self.statistics().instances if s.operator in sources)
                rate = out / max(time.time() - self.started_at, 1e-6)
            except ray.exceptions.RayError:
                pass
        return JobInfo(self.name, state, self.started_at, self.ended_at,
                       (self.ended_at or time.time()) - self.started_at,
                       tuple((n.name, n.parallelism) for n in self.plan.graph.nodes.values()), 0,
                       None if error is None else f"{type(error).__name__}: {error}", self.checkpoint_dir, last,
                       rate)

    def _collect_statistics(self) -> JobStatistics:
        hosts = self.topology.hosts()
        per_host = ray.get([h.statistics.remote() for h in hosts], timeout=30)
        return JobStatistics(tuple(s for stats in per_host for s in stats), time.time())

    def statistics(self) -> JobStatistics:
        """Per-instance counters, queue depths and back-pressured time (last snapshot once ended).

        Raises:
            ChirayError: the job ended without statistics (its hosts were gone).
        """
        self._known()
        if self._final is not None:
            if self._last_stats is None:
                raise ChirayError(f"job {self.name!r} ended without statistics")
            return self._last_stats
        self._last_stats = self._collect_statistics()
        return self._last_stats

    @property
    def actors(self) -> list[Any]:
        """The job's Ray actors (hosts, side controllers, and the controller where it has an actor of
        its own: see ``controller_process``), for tests and tooling."""
        snap = self.topology.snapshot()
        own = [] if snap.controller is None or controller_host(snap.controller) is not None else [snap.controller]
        return [*snap.hosts, *self._side.values(), *own]
