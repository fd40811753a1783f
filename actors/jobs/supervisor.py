"""supervisor.py: deploying a job's hosts, and the driver-side supervisor that recovers the job.

Chi's default checkpoint-replay policy: when the controller reports that a
host died (and restarts are left), the supervisor rolls the *whole* dataflow
back to the last complete checkpoint. It kills every host (the survivors too:
this is the simplest way to make sure nothing of the failed run keeps going),
finishes the sinks' commit of that checkpoint and discards their later
staged output (having first taken the next fence token, ``control.fencing``,
so that a part of the old run cut off by a network partition commits
nothing from then on), starts new hosts where Ray finds room (on another node if one
is gone), restores their state from the checkpoint, seeks the sources to its
offsets, and resumes. If the job controller itself dies, a new one is started
from the same configuration and storage and the job is rolled back the same
way; ops that were in flight fail.

The supervisor runs in a thread of the driver process, which owns every
actor of the job.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Protocol

import ray

from chiray.control.coordination import JobState
from chiray.control.fencing import Fence
from chiray.operators.graph import OperatorKind

from ..config import JobConfig
from ..runtime.controller import controller_host
from ..errors import JobFailedError, OperatorError
from ..runtime.host import SPARE_HOST_ID, OperatorHost
from .jobactors import ControllerHandle, HostActor, PoolKey
from .pool import kill, warm_pool
from ..runtime.restore import RestoreInfo, reset_code
from ..runtime.storage import CheckpointError, CheckpointStorage

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from chiray.operators.graph import OperatorNode, PhysicalPlan
    from chiray.operators.logic import Sink

    from .jobtopology import JobTopology

__all__ = ["Deployment", "Supervisor", "bind_sinks", "claim_outputs", "release_outputs"]

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 60.0
"""How long the supervisor waits for any one answer of the controller or a host (a stopped process never
answers): a recovery attempt that waits longer fails and is tried again."""

RECYCLE_TIMEOUT_S = 5.0
"""How long a job's end waits for its hosts to become bare again for the warm pool (else they are killed)."""


def backoff(attempt: int, first: float = 0.1, longest: float = 5.0) -> float:
    """Seconds to wait after the ``attempt``-th failure in a row: doubling from ``first`` up to
    ``longest``, with +-20 % jitter (so that jobs that failed together do not retry in step)."""
    return min(longest, first * 2 ** max(0, attempt - 1)) * random.uniform(0.8, 1.2)


class Deployment:
    """What it takes to (re)start a job's hosts.

    Attributes:
        name: the job's name.
        plan_ref: the physical plan in the object store.
        placement: instance -> host id.
        num_hosts: how many hosts.
        host_ids: the ids of the hosts (0..num_hosts-1 at first; a rescale adds and retires ids).
        plan: the physical plan (``plan_ref`` holds it in the object store).
        config: the runtime options.
        storage: the checkpoint storage.
        sinks: sink operator name -> its (bound) ``Sink``.
        fallback: the checkpoint the job was restored from (``submit(restore_from=...)``): a recovery
            before the job's own first checkpoint rolls back to it, never to the start.
    """

    def __init__(self, name: str, plan_ref: ObjectRef, placement: dict, num_hosts: int, config: JobConfig,
                 storage: CheckpointStorage, sinks: dict[str, Sink], fallback: RestoreInfo | None = None):
        self.name = name
        self.fallback = fallback
        self.plan_ref = plan_ref
        self.placement = placement
        self.num_hosts = num_hosts
        self.config = config
        self.storage = storage
        self.sinks = sinks
        self.host_ids = list(range(num_hosts))
        self.plan: PhysicalPlan | None = None
        self.spares: list[HostActor] = []  # started, not set up (``config.spare_hosts``)

    def update(self, plan: PhysicalPlan, placement: dict, host_ids: list[int]) -> None:
        """A rescale step completed: recoveries from now on deploy this topology."""
        self.plan = plan
        self.plan_ref = ray.put(plan)
        self.placement = dict(placement)
        self.host_ids = sorted(host_ids)
        self.num_hosts = len(self.host_ids)

    def _start_host(self, host_id: int) -> HostActor:
        config = self.config
        opts = {"num_cpus": config.host_num_cpus, "resources": config.host_resources or None,
                "max_concurrency": 1000, **config.host_options}
        return OperatorHost.options(**opts).remote(host_id, self.name)  # type: ignore[attr-defined]

    def new_hosts(self, host_ids: list[int]) -> list[HostActor]:
        """Host actors (not yet set up) for these ids: warm ones first (they take their ids at setup)."""
        key = host_pool_key(self.config)
        warm = warm_pool().take(key, len(host_ids)) if key is not None else []
        if len(warm) < len(host_ids):  # idle hosts of another size must not hold the CPUs these need
            warm_pool().release(other_hosts_than=key)
        return warm + [self._start_host(i) for i in host_ids[len(warm):]]

    def recycle_hosts(self, hosts: list[HostActor]) -> None:
        """The job ended: its live hosts become bare again and join the warm pool, up to
        ``config.warm_hosts`` or ``config.reuse_hosts`` of them (see ``OperatorHost.recycle``); the
        others are killed."""
        key = host_pool_key(self.config)
        keep = max(self.config.warm_hosts, self.config.reuse_hosts)
        room = keep - warm_pool().size(key) if key is not None else 0
        if key is None or room <= 0 or not hosts:
            kill(hosts)
            return
        refs = [h.recycle.remote() for h in hosts[:room]]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=RECYCLE_TIMEOUT_S)
        done = set(ready)
        bare = []
        for host, ref in zip(hosts, refs):
            try:
                if ref in done and ray.get(ref, timeout=0):
                    bare.append(host)
                    continue
            except Exception:  # it died with the job
                pass
            kill([host])
        kill(hosts[room:])
        warm_pool().put(key, bare)

    def refill_pool(self, unused: list[HostActor]) -> None:
        """The job ended: keep ``unused`` (bare spares) and start warm hosts up to ``config.warm_hosts``."""
        key = host_pool_key(self.config)
        if key is None or self.config.warm_hosts == 0:
            kill(unused)
            return
        pool = warm_pool()
        keep = max(self.config.warm_hosts - pool.size(key), 0)
        pool.put(key, unused[:keep])
        kill(unused[keep:])
        pool.fill(key, self.config.warm_hosts, lambda: self._start_host(SPARE_HOST_ID))

    def start_spares(self) -> None:
        """Start hosts (in the background) until ``config.spare_hosts`` spares are up or coming."""
        missing = self.config.spare_hosts - len(self.spares)
        if missing > 0:
            self.spares.extend(self.new_hosts([SPARE_HOST_ID] * missing))

    def wait_spares(self, timeout: float | None) -> None:
        """Wait until every spare host's process has started."""
        ray.get([h.ping.remote() for h in self.spares], timeout=timeout)

    def take_hosts(self, host_ids: list[int]) -> list[HostActor]:
        """Hosts for a scale-out: spares first (they take their ids at setup), then new ones."""
        taken, self.spares = self.spares[:len(host_ids)], self.spares[len(host_ids):]
        return taken + self.new_hosts(host_ids[len(taken):])

    def start_hosts(self, controller: ControllerHandle, restore: RestoreInfo | None, incarnation: int,
                    hosts: list[HostActor] | None = None) -> list[HostActor]:
        """Set up every host (in ``host_ids`` order; ``hosts`` started before, else new ones); raises a
        user constructor's error. The hosts are killed if any fails."""
        config = self.config
        hosts = self.new_hosts(self.host_ids) if hosts is None else hosts
        try:
            peers = dict(zip(self.host_ids, hosts))
            try:
                errors = ray.get([h.setup.remote(self.plan_ref, self.placement, config, peers, controller,
                                                 restore, incarnation, i) for i, h in peers.items()],
                                 timeout=config.deploy_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise JobFailedError(
                    f"job {self.name!r}: could not start its {self.num_hosts} hosts in "
                    f"{config.deploy_timeout_s} s; each asks for {config.host_num_cpus} CPUs"
                    f"{f' and {config.host_resources}' if config.host_resources else ''}, and Ray has "
                    f"{ray.available_resources().get('CPU', 0)} CPUs free (lower host_num_cpus or add nodes)"
                ) from None
            for error in errors:
                if error is not None:
                    raise error
        except BaseException:
            kill(hosts)
            raise
        return hosts


def bind_sinks(nodes: Iterable[OperatorNode], storage: CheckpointStorage, run: str | None) -> dict[str, Sink]:
    """Each sink among ``nodes`` bound to its output under ``storage`` for job life ``run``, by name (the nodes
    keep the bound sinks)."""
    assert run is not None  # the job was given its run id before it deploys
    sinks = {}
    for node in nodes:
        if node.kind is OperatorKind.SINK:
            assert node.sink is not None
            node.sink = node.sink.bind_output(storage.output_dir(node.name), node.name, run)
            sinks[node.name] = node.sink
    return sinks


def claim_outputs(job: str, sinks: dict[str, Sink]) -> None:
    """Each sink claims its output for this run; a sink whose output another running job writes
    (``OutputInUseError``) refuses the job (or the branch), and the claims already taken are dropped."""
    claimed = []
    try:
        for sink in sinks.values():
            sink.claim(job)
            claimed.append(sink)
    except BaseException:
        release_outputs(claimed)
        raise


def release_outputs(sinks: dict[str, Sink] | list[Sink]) -> None:
    """The job ended (or never started): its sinks drop their claims on their output (``Sink.claim``)."""
    for sink in (sinks.values() if isinstance(sinks, dict) else sinks):
        try:
            sink.release()
        except Exception as exc:  # storage unreachable: the claim stays, and names this job
            log.warning("could not release the output claim of %s: %r", sink.describe(), exc)


def host_pool_key(config: JobConfig) -> PoolKey | None:
    """The warm pool's key for this config's hosts; ``None``: not pooled (custom ``host_options``)."""
    if config.host_options:
        return None
    return "host", (config.host_num_cpus, tuple(sorted(config.host_resources.items())))


CONTROLLER_POOL_KEY: PoolKey = ("controller", None)


class SupervisedJob(Protocol):
    """What the supervisor needs of a job (``Job``): its topology, plan and side controllers, and a way to
    end it when no controller can be started."""

    name: str
    topology: JobTopology
    plan: PhysicalPlan

    @property
    def side_controllers(self) -> Mapping[str, ActorHandle]: ...

    def controller_lost(self, reason: str, events: tuple[str, ...], restarts: int) -> None: ...


class Supervisor(threading.Thread):
    """Watches a job's controller and carries out recoveries.

    Args:
        job: the ``Job`` (its ``topology``'s hosts and controller are replaced at a recovery).
        deployment: how to start hosts.
        make_controller: starts a fresh job controller (after the old one died).
    """

    def __init__(self, job: SupervisedJob, deployment: Deployment, make_controller: Callable[[], ControllerHandle]):
        super().__init__(name=f"chiray-supervisor-{job.name}", daemon=True)
        self.job = job
        self.deployment = deployment
        self.make_controller = make_controller
        self.incarnation = 0
        self._failed_attempts = 0
        self._failing_since: float | None = None  # monotonic time of the first failed attempt in a row
        self._halting = threading.Event()
        self._history: tuple[tuple[str, ...], int] = ((), 0)  # the controller's events and restarts, last seen

    def stop(self) -> None:
        self._halting.set()

    def run(self) -> None:
        while not self._halting.is_set():
            try:
                snap = ray.get(self.job.topology.controller.wait_event.remote(0.5), timeout=CALL_TIMEOUT_S)
                self._history = (snap.events, snap.restarts)
            except ray.exceptions.RayActorError:
                if not self._halting.is_set():
                    try:
                        self._replace_controller()
                        self._failed_attempts, self._failing_since = 0, None
                    except Exception as exc:  # the new one died too (placed on a node that was dying)
                        pause = self._failed(exc, "replacing the job controller")
                        if self._out_of_time(pause):
                            budget = self.deployment.config.recovery_timeout_s
                            self.job.controller_lost(
                                f"no job controller could be started: {self._failed_attempts} attempts in "
                                f"{budget:g} s (recovery_timeout_s) failed, the last with {exc!r}", *self._history)
                            return
                        log.warning("job %s: replacing the controller failed (%r); trying again in %.1f s",
                                    self.deployment.name, exc, pause)
                        self._halting.wait(pause)
                continue
            except Exception:  # Ray shutting down under us
                if self._halting.is_set():
                    return
                time.sleep(0.2)
                continue
            if snap.state.terminal or self._halting.is_set():
                return
            if snap.state is JobState.RECOVERING:
                self._attempt_recovery()

    def _attempt_recovery(self) -> None:
        """One recovery; a host that dies meanwhile just means another attempt."""
        try:
            self._recover()
            self._failed_attempts, self._failing_since = 0, None
        except OperatorError as error:  # a user constructor raised on restart: it would again
            self._give_up(error, "restarting the job failed in user code")
        except Exception as exc:
            pause = self._failed(exc, "recovery")
            budget = self.deployment.config.recovery_timeout_s
            if self._out_of_time(pause):
                self._give_up(exc, f"recovery failed {self._failed_attempts} times in {budget:g} s "
                                   f"(recovery_timeout_s)")
            else:
                self._halting.wait(pause)

    def _failed(self, exc: BaseException, what: str) -> float:
        """Count a failed attempt in a row; returns the pause before the next."""
        self._failed_attempts += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        pause = backoff(self._failed_attempts)
        log.warning("job %s: %s attempt %d failed: %r", self.deployment.name, what, self._failed_attempts, exc)
        return pause

    def _out_of_time(self, pause: float) -> bool:
        """Whether the failed attempts in a row, and ``pause`` before the next, pass ``recovery_timeout_s``."""
        assert self._failing_since is not None
        return time.monotonic() - self._failing_since + pause > self.deployment.config.recovery_timeout_s

    def _give_up(self, error: BaseException, reason: str) -> None:
        try:
            ray.get(self.job.topology.controller.recovery_failed.remote(error, f"{reason}: {error!r}"),
                    timeout=CALL_TIMEOUT_S)
        except Exception:  # the controller is gone too: the job's next wait() reports it
            log.exception("job %s: could not report a failed recovery", self.deployment.name)

    def _recover(self) -> None:
        started = time.monotonic()
        dep = self.deployment
        topology = self.job.topology
        if controller_host(topology.controller) is not None:  # the hosts go: the controller moves first
            self._move_controller()
        with topology.lock:
            kill(topology.hosts())
            topology.replacing()  # a rescale's new hosts must not join the hosts that go
        # before the failed run's staged output is discarded: from now on no controller of it commits
        fence_token = Fence.of(dep.storage).advance() if dep.storage is not None else None
        own, unreadable = self._newest_readable()
        restore = own or dep.fallback  # else the checkpoint the job was restored from, if any
        for name, sink in dep.sinks.items():  # the restored-from job committed its own output
            if unreadable:  # newer checkpoints committed output that the replay writes again
                sink.take_back(own.checkpoint_id if own is not None else 0)
            sink.recover(restore.sink_staged(name) if own is not None and restore is not None else [])
        self.incarnation += 1
        with topology.lock:
            self._reset_code(restore)
        controller = topology.controller
        hosts = dep.start_hosts(controller, restore, self.incarnation)
        sides = self.job.side_controllers  # the new hosts return their ops' results to them too
        ray.get([h.add_controller.remote(name, side) for h in hosts for name, side in sides.items()],
                timeout=CALL_TIMEOUT_S)
        with topology.lock:  # the deployment is read under it: a rescale step updates both under it
            topology.swap(hosts, dep.host_ids, dep.placement, self.incarnation)
        checkpoint_id = restore.checkpoint_id if restore is not None else None
        where = None if own is not None or restore is None else f"the restore point {restore.path}"
        if unreadable:  # say which checkpoints were passed over, and why
            named = where or (f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "the start")
            where = f"{named} ({'; '.join(unreadable)})"
        ray.get(controller.resume.remote(dict(zip(dep.host_ids, hosts)), self.incarnation, checkpoint_id,
                                         time.monotonic() - started, where, fence_token), timeout=CALL_TIMEOUT_S)
        ray.get([h.start.remote() for h in hosts], timeout=CALL_TIMEOUT_S)
        snap = ray.get(controller.snapshot.remote(), timeout=CALL_TIMEOUT_S)
        self._history = (snap.events, snap.restarts)  # a controller that dies next keeps this recovery too
        log.warning("job %s recovered from %s in %.2f s", dep.name,
                    where or (f"checkpoint {checkpoint_id}" if checkpoint_id else "the start"),
                    time.monotonic() - started)

    def _reset_code(self, restore: RestoreInfo | None) -> None:
        """The operators' recorded code as the checkpoint the job rolls back to recorded it (an upgrade after it
        is undone): what a later scale-out, or a recovery from the start, builds."""
        dep = self.deployment
        changed = False
        for plan in {id(p): p for p in (self.job.plan, dep.plan) if p is not None}.values():
            changed = reset_code(plan, restore) or changed
        if changed and dep.plan is not None:
            dep.plan_ref = ray.put(dep.plan)

    def _newest_readable(self) -> tuple[RestoreInfo | None, list[str]]:
        """The newest of the job's own checkpoints whose files read back, and why each newer one did not."""
        storage = self.deployment.storage
        unreadable: list[str] = []
        for checkpoint_id in reversed(storage.checkpoint_ids() if storage is not None else []):
            try:
                manifest = storage.load(checkpoint_id)
                storage.verify(manifest)
            except CheckpointError as exc:
                if not storage.has_manifest(checkpoint_id):
                    continue  # never completed: not a checkpoint
                unreadable.append(f"checkpoint {checkpoint_id} is unreadable: {exc}")
                continue
            return RestoreInfo(storage, manifest), unreadable
        return None, unreadable

    def _move_controller(self) -> None:
        """A recovery replaces the hosts, among them the one the controller runs in: a controller in
        an actor of its own takes over the recovery (same history, same restart) and stays."""
        old = self.job.topology.controller
        snap = ray.get(old.snapshot.remote(), timeout=30)
        reason = ray.get(old.recovery_reason.remote(), timeout=30)
        controller = self.make_controller()
        ray.get(controller.take_over_recovery.remote(snap.events, snap.restarts, reason or "recovery"),
                timeout=CALL_TIMEOUT_S)
        self._adopt_side_controllers(controller)
        self.job.topology.set_controller(controller)
        self._history = (snap.events, snap.restarts)

    def _adopt_side_controllers(self, controller: ControllerHandle) -> None:
        """The job's side controllers inject through ``controller`` from now on, and it tells them of
        the job's sinks and failures."""
        for name, side in self.job.side_controllers.items():
            try:
                ray.get([side.set_job_controller.remote(controller),
                         controller.register_controller.remote(name, side)], timeout=30)
            except Exception as exc:  # that side controller is gone: its ops fail, the job goes on
                log.warning("job %s: side controller %r was not handed the new controller: %r",
                            self.deployment.name, name, exc)

    def _replace_controller(self) -> None:
        """The job controller died: start a new one, which rolls the job back to its last checkpoint.

        A rollback, not a hand-over: ops the old controller had injected into
        only some sources would otherwise leave aligned instances waiting for
        ever. The new controller finds the checkpoints on storage; ops that
        were in flight fail.
        """
        host = controller_host(self.job.topology.controller)
        reason = ("the job controller died" if host is None else
                  f"host {host} died, and the job controller with it (it ran there)")
        controller = self.make_controller()
        self._adopt_side_controllers(controller)
        self.job.topology.set_controller(controller)
        events, restarts = self._history  # the new controller keeps the job's history and its restart count
        ray.get(controller.begin_recovery.remote(reason, events, restarts), timeout=CALL_TIMEOUT_S)
        log.warning("job %s: %s; a new controller rolls the job back", self.deployment.name, reason)
