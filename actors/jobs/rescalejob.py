"""rescalejob.py: a rescale's view of a job on Ray: its controller, its ops and its host actors.

:class:`JobTarget` is the ``rescale.RescaleTarget`` of a running ``Job``: the
runner (``rescale.Rescaler``) decides, this module makes the Ray calls. New
hosts are started (set up, given the side controllers, started) before any
host of the job changes, so a scale-out with no room for them fails with the
job untouched; a step that fails after that rolls the job back to its last
checkpoint (``abandon``); a job that ended or recovers under a rescale turns
the rescale's error into one that says so (``explain``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

import ray

from chiray.control.coordination import JobState, LifecycleSnapshot
from chiray.control.message import InstanceId
from chiray.control.op import ControlOp
from chiray.control.oprun import JobView, OpTimeoutError
from chiray.operators.graph import PhysicalPlan

from ..runtime.controller import controller_host
from .jobstatus import JobStatistics
from .jobtopology import JobTopology
from .ophandle import OpHandle
from .rescaler import HostChange, RescaleError, StartedOp, Tally, place_change
from ..runtime.topology import ChangePrepared
from .supervisor import Deployment

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["JobTarget", "RunningJob", "STEP_POLL_S"]

STEP_POLL_S = 1.0
"""While a step's op runs, whether the job ended is checked this often."""

RETIRE_TIMEOUT_S = 120.0
"""How long retired hosts may take to drain."""


class RunningJob(Protocol):
    """What a rescale asks of the driver's ``Job`` (``job.Job``, which imports this module, is one)."""

    name: str
    plan: PhysicalPlan
    topology: JobTopology

    @property
    def deployment(self) -> Deployment | None: ...

    @property
    def final_snapshot(self) -> LifecycleSnapshot | None: ...

    @property
    def side_controllers(self) -> dict[str, ActorHandle]: ...

    def statistics(self) -> JobStatistics: ...

    def run_control(self, op: ControlOp, controller: str | None = None, op_id: str | None = None) -> OpHandle: ...

    def apply_rescale_step(self, plan: PhysicalPlan, placement: dict[InstanceId, int]) -> None: ...


class JobTarget:
    """The job ``job`` as the rescale of ``operator`` sees it (its errors name the operator and the steps
    ``tally`` counted)."""

    def __init__(self, job: RunningJob, operator: str, tally: Tally | None, what: str | None = None):
        self.job, self.operator, self.tally = job, operator, tally
        self.name = job.name
        self.what = what or f"rescale of {operator!r}"  # the change, as its errors name it

    @property
    def plan(self) -> PhysicalPlan:
        return self.job.plan

    def placement(self) -> dict[InstanceId, int]:
        return dict(self.job.topology.snapshot().placement)

    def finished(self) -> set[InstanceId]:
        return {(s.operator, s.index) for s in self.job.statistics().instances if s.finished}

    def wait_running(self, timeout_s: float) -> None:
        """A job that is recovering is rescaled once it runs again (within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            snap = ray.get(self.job.topology.controller.snapshot.remote(), timeout=30)
            if snap.state is not JobState.RECOVERING:
                return
            if time.monotonic() > deadline:
                last = snap.events[-1] if snap.events else "a restart"
                raise RescaleError(f"cannot rescale {self.operator!r}: the job is still recovering ({last}); "
                                   "rescale once it runs")
            time.sleep(0.1)

    # -- ops -------------------------------------------------------------------------------------

    def start_op(self, op: ControlOp, op_id: str | None = None,
                 views: tuple[JobView, JobView] | None = None) -> OpHandle:
        """Start ``op``; with ``views`` (a topology change) it sees the first, ops after it the second."""
        if views is None or op_id is None:
            return self.job.run_control(op, op_id=op_id)
        controller = self.job.topology.controller
        handle = OpHandle(op_id, controller, op.timeout_s)
        controller.run_op.remote(op, op_id, *views)
        return handle

    def wait_op(self, handle: StartedOp, timeout_s: float | None) -> Any:
        """The op's result, waiting up to ``timeout_s``; a job that ended meanwhile (its input did) raises
        at once. The op of a step injected just before the input ended can reach instances that finish
        without acting on it: it would only fail at its timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = STEP_POLL_S if deadline is None else min(STEP_POLL_S, deadline - time.monotonic())
            try:
                return handle.result(max(left, 0.0))
            except TimeoutError as exc:
                if isinstance(exc, OpTimeoutError):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{exc}: {waiting_for(handle)}") from exc
                ended = self.ended_first(exc)
                if ended is not None:
                    raise ended from exc

    # -- hosts -------------------------------------------------------------------------------------

    def place(self, new: PhysicalPlan) -> HostChange:
        """Each new instance on a new host (ids never reused: peers forget retired ones); hosts left empty
        retire, but for the one the controller runs in."""
        topology = self.job.topology
        snap = topology.snapshot()
        at = controller_host(snap.controller)
        return place_change(snap.placement, snap.host_ids, new, topology.allocate_host_ids,
                            () if at is None else (at,))

    def prepare(self, op_id: str, new: PhysicalPlan, change: HostChange) -> list[ChangePrepared]:
        """Start the new hosts, then have every other host prepare the change (before the op is injected)."""
        job, added = self.job, list(change.added)
        dep = self._deployment()
        fresh = dep.take_hosts(added) if added else []
        before = job.topology.snapshot()
        peers = {**before.peers(), **dict(zip(added, fresh))}
        new_ref, placement = ray.put(new), dict(change.placement)
        self._start_hosts(new_ref, placement, dict(zip(added, fresh)), peers, before.incarnation)
        timeout = dep.config.deploy_timeout_s
        try:
            prepared = ray.get([h.prepare_change.remote(op_id, new_ref, placement, peers)
                                for hid, h in peers.items() if hid not in added], timeout=timeout)
            ray.get(job.topology.controller.set_hosts.remote(peers), timeout=timeout)
        except Exception as exc:
            self.abandon(f"preparing the new topology failed: {exc!r}")
            raise RescaleError(f"{self.what}: could not start its new instances: "
                               f"{exc}") from exc
        return list(prepared)

    def _start_hosts(self, new_ref: ray.ObjectRef, placement: dict[InstanceId, int], fresh: dict[int, ActorHandle],
                     peers: dict[int, ActorHandle], incarnation: int) -> None:
        """The new hosts set up and started (until they run, nothing of the job has changed), then joined."""
        job, dep = self.job, self._deployment()
        timeout, controller = dep.config.deploy_timeout_s, job.topology.controller
        try:
            errors = ray.get([h.setup.remote(new_ref, placement, dep.config, peers, controller, None,
                                             incarnation, hid) for hid, h in fresh.items()], timeout=timeout)
            for error in errors:
                if error is not None:
                    raise error
            ray.get([h.add_controller.remote(name, side) for h in fresh.values()
                     for name, side in job.side_controllers.items()], timeout=timeout)
            ray.get([h.start.remote() for h in fresh.values()], timeout=timeout)
        except Exception as exc:
            _kill(fresh.values())
            free = ray.available_resources().get("CPU", 0)
            why = (f"no room for {len(fresh)} new host(s) of {dep.config.host_num_cpus} CPUs within "
                   f"deploy_timeout_s={timeout} s (Ray has {free} CPUs free)"
                   if isinstance(exc, ray.exceptions.GetTimeoutError)
                   else f"its new hosts failed to start: {exc}")
            raise RescaleError(f"{self.what} failed before any bin moved: {why}; the job "
                               f"runs on unchanged") from exc
        with job.topology.lock:  # a recovery swaps the hosts under this lock
            recovered = job.topology.being_replaced or job.topology.snapshot().incarnation != incarnation
            if not recovered and job.final_snapshot is None:
                job.topology.add_hosts(list(fresh), list(fresh.values()))
                return
        _kill(fresh.values())  # the hosts it knew of are gone; these were never its
        final = job.final_snapshot
        why = "the job recovered" if recovered or final is None else f"the job ended ({final.state.value})"
        raise RescaleError(f"{self.what} did not complete: {why} while its new hosts "
                           "started")

    def _deployment(self) -> Deployment:
        """How the job's hosts start (a job that runs was launched: it has one)."""
        dep = self.job.deployment
        assert dep is not None, "bug in rescalejob: a rescale of a job that was never launched"
        return dep

    def apply(self, new: PhysicalPlan, placement: Mapping[InstanceId, int]) -> None:
        self.job.apply_rescale_step(new, dict(placement))

    def retire(self, host_ids: Sequence[int]) -> None:
        """Wait until the retired hosts drained, then remove them."""
        job = self.job
        table = job.topology.peers()
        retired = [table[h] for h in host_ids if h in table]
        deadline = time.monotonic() + RETIRE_TIMEOUT_S
        while retired and not all(ray.get([h.is_done.remote() for h in retired], timeout=60)):
            if time.monotonic() > deadline:
                raise RescaleError(f"{self.what}: retired hosts {list(host_ids)} did not "
                                   "drain")
            time.sleep(0.02)
        live = job.topology.retire_hosts(host_ids)
        ray.get(job.topology.controller.set_hosts.remote(live))
        ray.get([h.forget_peers.remote(list(host_ids)) for h in live.values()])
        _kill(retired)

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def sink_results(self, instances: list[InstanceId], timeout_s: float | None) -> dict[InstanceId, object]:
        """What these sink instances returned when they finished, once the controller has each (a removed
        branch drains: ``brancher.remove_branch``)."""
        wanted = set(instances)
        deadline = time.monotonic() + (RETIRE_TIMEOUT_S if timeout_s is None else max(timeout_s, RETIRE_TIMEOUT_S))
        while True:
            results = ray.get(self.job.topology.controller.results.remote(), timeout=60)
            if wanted <= set(results):
                return {i: results[i] for i in wanted}
            if time.monotonic() > deadline:
                raise RescaleError(f"{self.what}: sink instances {sorted(wanted - set(results))} did not finish")
            time.sleep(0.02)

    # -- failures ----------------------------------------------------------------------------------

    def _where(self) -> str:
        return self.tally.where() if self.tally is not None else "its op"

    def abandon(self, reason: str) -> None:
        """A step failed half-way: if the job still runs, roll it back to its last checkpoint."""
        try:
            controller = self.job.topology.controller
            snap = ray.get(controller.snapshot.remote(), timeout=30)
            if snap.state is JobState.RUNNING:
                ray.get(controller.begin_recovery.remote(
                    f"{self.what} failed: {reason}"), timeout=30)
        except Exception:
            pass

    def explain(self, exc: BaseException) -> RescaleError:
        """The error the rescale reports for ``exc``: what happened to the job, where that is known."""
        if isinstance(exc, RescaleError):
            return self.ended_first(exc) or exc
        error = (self.ended_first(exc) or self._recovering(exc)
                 or RescaleError(f"{self.what} failed: {exc!r}"))
        error.__cause__ = exc
        return error

    def ended_first(self, exc: BaseException) -> RescaleError | None:
        """The clearer error when the job itself ended (e.g. its input did) before the rescale completed."""
        snap = self.job.final_snapshot
        if snap is None:
            try:
                snap = ray.get(self.job.topology.controller.snapshot.remote(), timeout=5)
            except Exception:
                return None
        if not snap.state.terminal:
            return None
        error = RescaleError(f"{self.what} did not complete: the job ended "
                             f"({snap.state.value}) after {self._where()}")
        error.__cause__ = exc
        return error

    def _recovering(self, exc: BaseException) -> RescaleError | None:
        """The clearer error when an actor died under the rescale because the job is recovering."""
        if not isinstance(exc, ray.exceptions.RayActorError):
            return None
        return RescaleError(
            f"{self.what} did not complete: an actor of the job died after "
            f"{self._where()}, and the job rolls back to its last checkpoint (recovering); "
            "rescale again once it runs")


def _kill(hosts: Iterable[ActorHandle]) -> None:
    for h in hosts:
        try:
            ray.kill(h, no_restart=True)
        except Exception:
            pass


def waiting_for(handle: StartedOp) -> str:
    """Which instances a running op still waits for, as its controller tells (or why it cannot)."""
    try:
        progress = handle.progress()  # type: ignore[attr-defined]
    except Exception as exc:  # the controller may be what went wrong
        return f"its controller could not say what it waits for ({type(exc).__name__}: {exc})"
    return (f"sinks still to return it: {progress['sinks_waiting'][:8]}; instances still to acknowledge it: "
            f"{progress['acks_waiting'][:8]}")
