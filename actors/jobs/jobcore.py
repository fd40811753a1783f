"""jobcore.py: ``JobCore``, the machinery under the driver's ``Job``: its lifecycle state, its hosts' start, the
link to its controller (retried while the supervisor replaces a dead one) and what its end leaves behind.

``Job`` (``job.py``) adds the verbs of ``JobHandle`` on top; the supervisor, a rescale and ``submit`` use the
few public methods here (``launch``, ``apply_rescale_step``, ``controller_lost``).

Lifecycle: ``RUNNING (<-> RECOVERING) -> FINISHED | FAILED | CANCELLED`` (``_final`` set, once, by ``_end``),
then, for the driver's handle, forgotten (``_forgotten``). ``_stopping`` is set while ``stop()`` takes its
final checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import ray

from chiray.control.coordination import JobState, LifecycleSnapshot
from chiray.control.oprun import JobView, OpFailedError, job_view

from .autoscaler import Autoscaler
from ..runtime.controller import HostedController, controller_host
from ..errors import ChirayError, JobCancelledError, JobFailedError, JobUnresponsiveError
from .handle import JobNotFoundError, ended_error
from .jobchanges import ChangeLog
from .jobcontrols import OpRouter
from .jobfiles import commit_stopped
from .jobrelease import release_actors
from .jobstatus import JobStatistics, collect_statistics, combine_results
from .jobtopology import JobTopology
from .jobvalues import CheckpointInfo
from .pool import kill
from ..runtime.restore import RestoreInfo
from .supervisor import Deployment, Supervisor

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from chiray.operators.graph import PhysicalPlan

    from ..runtime.storage import CheckpointStorage

__all__ = ["JobCore"]

log = logging.getLogger(__name__)

SUPERVISOR_JOIN_S = 60.0
"""How long a job that ends waits for its supervisor to finish what it is doing (a recovery under way)."""


class JobCore:
    """A running (or finished) job's state and machinery; ``job.Job`` is the handle users hold.

    Use one handle from one thread; its supervisor thread may swap the
    actors underneath (recovery) in ``topology`` (a ``JobTopology``, which
    says who changes what). ``plan`` and ``view`` change with rescale steps
    (``apply_rescale_step``). Once terminal, its actors are gone.
    """

    def __init__(self, name: str, plan: PhysicalPlan, controller: ActorHandle | None, hosts: list[ActorHandle],
                 view: JobView | None = None, own_dir: str | None = None):
        self.name = name
        self.plan = plan
        self.view = view or job_view(name, plan)
        self.topology = JobTopology(controller, hosts)
        self._ops = OpRouter(name)  # the job controller's and side controllers' op senders
        self._changes = ChangeLog()  # this handle's rescales and upgrades
        self._final: LifecycleSnapshot | None = None
        self._lost: LifecycleSnapshot | None = None  # set by the supervisor when no controller could be started
        self._results: dict[str, object] = {}
        self._removed_results: dict[str, object] = {}  # sinks whose branch was removed (Job.remove_branch)
        self._last_stats: JobStatistics | None = None
        self._own_dir = own_dir  # a temporary checkpoint directory the job removes when it ends
        self._deployment: Deployment | None = None
        self._supervisor: Supervisor | None = None
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.autoscaler: Autoscaler | None = None  # see autoscale()
        self._stopped: CheckpointInfo | None = None  # the checkpoint stop() ended the job at
        self._stopping = False  # stop() is taking its final checkpoint: other changes are refused
        self._forgotten = False
        self._savepoints_taken: list[str] = []  # the savepoints this handle took (savepoints() lists them)

    def launch(self, deployment: Deployment, restore: RestoreInfo | None,
               make_controller: Callable[..., ActorHandle]) -> None:
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
        try:
            controller, hosts = self._start_hosts(deployment, restore, make_controller)
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

    def _start_hosts(self, deployment: Deployment, restore: RestoreInfo | None,
                     make_controller: Callable[..., ActorHandle]) -> tuple[ActorHandle, list[ActorHandle]]:
        """The job's hosts, set up, and its controller (started in host 0's process where the job has none yet:
        not ``JobConfig.controller_process``)."""
        controller = self.topology.controller
        if controller is not None:
            return controller, deployment.start_hosts(controller, restore, 0)
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
        return controller, hosts

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
    def side_controllers(self) -> dict[str, ActorHandle]:
        """Side controller name -> its actor (``add_controller``)."""
        return self._ops.sides

    @property
    def removed_results(self) -> dict[str, object]:
        """The results of the sinks whose branch ``remove_branch`` removed, by sink."""
        return dict(self._removed_results)

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
        self._ops.set_view(self.view)

    def _call(self, send: Callable[[ActorHandle], ray.ObjectRef], timeout: float | None = None) -> Any:
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
        self._end(self._lost, remove_dir=False)

    def _end(self, snap: LifecycleSnapshot, remove_dir: bool) -> None:
        """The job has ended as ``snap`` says: its actors go (``_shutdown``) and, with ``remove_dir``, its temporary
        checkpoint directory."""
        self._final = snap
        self.ended_at = time.time()
        self._shutdown()
        if remove_dir and self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def _answer(self, send: Callable[[ActorHandle], ray.ObjectRef], verb: str, timeout: float = 30.0) -> Any:
        """``_call`` for a reading verb: a controller that does not answer in ``timeout`` seconds (its
        process stopped or overloaded) is a clear error, never a hang."""
        try:
            return self._call(send, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise JobUnresponsiveError(f"job {self.name!r}: its controller did not answer {verb} within "
                                       f"{timeout:g} s (its process may be stopped or overloaded)") from None

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
            self._keep_statistics()
            self._results = combine_results(self.plan, per_instance)
        self._end(snap, remove_dir=snap.state is JobState.FINISHED)

    def _keep_statistics(self) -> None:
        """Keep the job's statistics as they are now (``statistics()`` answers with them once it ended)."""
        try:
            self._last_stats = collect_statistics(self.topology.hosts())
        except ray.exceptions.RayError:
            pass

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

    def _start_spares(self, deployment: Deployment, timeout: float | None) -> None:
        """Start the spare hosts scale-outs took and wait up to ``timeout`` s for them (``0``: no wait)."""
        deployment.start_spares()
        if timeout == 0:
            return
        try:
            deployment.wait_spares(timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"job {self.name!r}: spare hosts not up after {timeout} s") from None

    def _durable_since(self, storage: CheckpointStorage, before: int, exc: OpFailedError) -> int:
        """A checkpoint failed with its controller (``exc``): a complete one newer than ``before`` in
        ``storage`` became durable all the same (its id), else the checkpoint failed.

        Raises:
            OpFailedError: no checkpoint newer than ``before`` is complete.
        """
        durable = max(storage.committed(), default=0)
        if durable > before:
            log.warning("job %s: the controller died after checkpoint %d became durable", self.name, durable)
            return durable
        raise OpFailedError(f"job {self.name!r}: the checkpoint did not complete: the job controller died "
                            f"before it was durable (the newest complete checkpoint is still "
                            f"{before or 'none'})") from exc

    def _end_stopped(self, snap: LifecycleSnapshot, taken: CheckpointInfo, savepoint: bool) -> None:
        """The job ends at stop's checkpoint ``taken`` (a savepoint's, with ``savepoint``): the sinks commit the
        output it holds, and the job is finished."""
        assert self._deployment is not None
        self._results = commit_stopped(self.plan.graph, self._deployment.storage, taken.id,
                                       self._deployment.config.run_id or "")
        self._stopped = taken
        note = f"stopped at checkpoint {taken.id}" + (f" (savepoint {taken.path})" if savepoint else "")
        self._end(LifecycleSnapshot(JobState.FINISHED, snap.finished_instances, (), None, (*snap.events, note),
                                    snap.restarts), remove_dir=True)

    def _not_stopping(self, verb: str) -> None:
        self._running(verb)
        if self._stopping:
            raise ChirayError(f"job {self.name!r} is stopping: cannot {verb} it")

    def _known(self) -> None:
        if self._forgotten:
            raise JobNotFoundError(f"job {self.name!r} is gone (forgotten)")

    def _running(self, verb: str) -> None:
        """Raise ``JobEndedError`` if the job has ended (``JobNotFoundError`` once forgotten)."""
        self._known()
        if self._final is not None:
            raise ended_error(self.name, self._final.state, verb)

    def _shutdown(self) -> None:
        supervisor = self._supervisor
        if supervisor is not None:
            supervisor.stop()
            # A recovery it was carrying out ends first: it may still swap in new hosts, which must go with
            # the job (and it must not kill hosts that were already recycled for the next job).
            if supervisor.is_alive() and supervisor is not threading.current_thread():
                supervisor.join(SUPERVISOR_JOIN_S)
                if supervisor.is_alive():
                    log.warning("job %s: its supervisor is still busy after %.0f s; ending the job without it",
                                self.name, SUPERVISOR_JOIN_S)
        if self.autoscaler is not None:  # no decision after the end (its thread sees the job ended)
            self.autoscaler.stop()
        self._ops.close()
        release_actors(self.plan, self._deployment, self.topology.hosts(), self.actors)

    def _adopt_code(self, operator: str) -> None:
        """After an upgrade: the deployment's plan (what a recovery restarts) has ``operator``'s new code too."""
        deployment = self._deployment
        if deployment is not None and deployment.plan is not self.plan:
            node = deployment.plan.graph.nodes.get(operator) if deployment.plan else None
            if node is not None:
                node.code = self.plan.graph.nodes[operator].code

    @property
    def actors(self) -> list[ActorHandle]:
        """The job's Ray actors (hosts, side controllers, and the controller where it has an actor of
        its own: see ``controller_process``), for tests and tooling."""
        snap = self.topology.snapshot()
        own = [] if snap.controller is None or controller_host(snap.controller) is not None else [snap.controller]
        return [*snap.hosts, *self._ops.sides.values(), *own]
