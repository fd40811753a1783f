"""client.py: reaching a detached job from any process: ``attach(name)``, ``jobs()`` and ``AttachedJob``.

An ``AttachedJob`` is a ``JobHandle``: the verbs of the driver's ``Job``,
each sent to the remote method of the same name on the job's manager actor
(``actors/jobs/manager.py``). Reading verbs (status, statistics, wait, ...)
retry while Ray restarts the manager; a changing verb (checkpoint, rescale,
stop, ...) that was in flight when the manager died fails with a
``ManagerRestartedError``: the job rolled back to its last checkpoint
without it, so it is safe to run again.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

import ray

from chiray.control.coordination import JobState

from . import jobstore
from ..errors import ChirayError, JobCancelledError, JobFailedError
from .handle import READING_VERBS, JobNotFoundError, check_timeout
from .jobstore import NAMESPACE
from .joblogs import JobLogs
from .jobvalues import CheckpointInfo, JobInfo, RescaleProgress, RescaleRecord, UpgradeRecord
from .savepoints import SavepointInfo

if TYPE_CHECKING:
    import pyarrow as pa
    from ray.actor import ActorHandle, ActorMethod

    from chiray.control.op import ControlOp
    from chiray.control.ops.monitor import MonitorResult

    from .brancher import BranchCut
    from .jobstatus import JobStatistics, JobStatus
    from .ophandle import OpHandle

__all__ = ["attach", "jobs", "AttachedJob", "RemoteRescale", "JobNotFoundError", "ManagerRestartedError",
           "connect", "find_manager"]

log = logging.getLogger(__name__)

RESTART_WAIT_S = 60.0
"""How long a reading verb waits for a restarting manager."""


class ManagerRestartedError(ChirayError):
    """The job manager died while it carried out a verb; the verb did not take effect."""


def connect(address: str | None = None) -> None:
    """Connect this process to the Ray cluster at ``address`` (default: ``RAY_ADDRESS``, else ``"auto"``)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", namespace=NAMESPACE,
             logging_level=logging.ERROR, log_to_driver=False)


def find_manager(name: str) -> ActorHandle | None:
    """The manager actor of job ``name``, or None."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def attach(name: str, address: str | None = None) -> "AttachedJob":
    """A handle on the detached job ``name``, from any process that reaches the cluster.

    Args:
        name: the job's name.
        address: the Ray cluster (default: this process's, else ``RAY_ADDRESS``, else ``"auto"``).

    Raises:
        JobNotFoundError: no job of that name (the message lists the jobs there are).
        ConnectionError: no cluster at ``address``.
    """
    connect(address)
    manager = find_manager(name)
    if manager is None:
        known = [j.name for j in jobs(all=True)]
        raise JobNotFoundError(f"no job named {name!r} on this cluster; jobs: {known or 'none'}")
    return AttachedJob(name, manager)


def jobs(address: str | None = None, all: bool = False) -> list[JobInfo]:
    """A summary of each detached job (``AttachedJob.info()``), running ones only unless ``all``."""
    connect(address)
    names = set(jobstore.names())
    names |= {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
    out = []
    for name in sorted(names):
        manager = find_manager(name)
        try:
            info = ray.get(manager.info.remote(), timeout=10) if manager is not None else None
        except ray.exceptions.RayError:
            info = None
        if info is None:
            try:
                record = jobstore.load(name)
            except jobstore.JobRecordError as exc:
                log.warning("%s", exc)
                continue
            if record is None:
                continue
            info = JobInfo(name, record.state, record.submitted_at, record.ended_at,
                           time.time() - record.submitted_at, record.parallelism, record.restarts, record.error,
                           record.checkpoint_dir, restarting=manager is not None)
        if all or info.restarting or not info.state.terminal:
            out.append(info)
    return out


class AttachedJob:
    """A detached job's handle: a ``JobHandle``, whose verbs the job's manager carries out."""

    def __init__(self, name: str, manager: ActorHandle):
        self.name = name
        self._manager = manager

    def __repr__(self) -> str:
        return f"AttachedJob({self.name!r})"

    def _call(self, method: ActorMethod, verb: str, *args: object, timeout: float | None = None) -> Any:
        """``method.remote(*args)`` on the manager (``method``: its remote method ``verb``), with the errors
        the verb raised there; a reading verb retries while the manager restarts."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            try:
                return ray.get(method.remote(*args), timeout=timeout)
            except ray.exceptions.RayTaskError as exc:
                raise (exc.cause if isinstance(exc.cause, BaseException) else exc) from None
            except ray.exceptions.RayActorError as exc:
                if find_manager(self.name) is None:
                    raise JobNotFoundError(f"job {self.name!r} is gone (forgotten or its cluster "
                                           f"restarted)") from None
                if verb not in READING_VERBS:
                    raise ManagerRestartedError(
                        f"job {self.name!r}: its manager died during {verb}; the job rolls back to its last "
                        f"checkpoint without it; run {verb} again") from exc
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # -- observing ---------------------------------------------------------------------

    def status(self) -> JobStatus:
        """The job's ``JobStatus``: state, events (the manager's and the current run's)."""
        return self._call(self._manager.status, "status")

    def info(self) -> JobInfo:
        """A summary: state, uptime, operators and their parallelism, last checkpoint, records/s."""
        return self._call(self._manager.info, "info")

    def statistics(self) -> JobStatistics:
        """Per-instance ``JobStatistics`` (the last snapshot once the job ended)."""
        return self._call(self._manager.statistics, "statistics")

    def metrics(self, timeout: float | None = 60.0) -> MonitorResult:
        """A ``Monitor`` op's result, run in-band now."""
        return self._call(self._manager.metrics, "metrics", timeout)

    def rescales(self) -> tuple[RescaleRecord, ...]:
        """The rescale history: when, operator, from -> to, strategy, duration, bytes, outcome."""
        return self._call(self._manager.rescales, "rescales")

    def logs(self, lines: int = 100, since: JobLogs | tuple | None = None) -> JobLogs:
        """The log lines of the job's manager, hosts and controller (as ``JobHandle.logs``)."""
        return self._call(self._manager.logs, "logs", lines, since)

    def savepoints(self) -> tuple[SavepointInfo, ...]:
        """The job's savepoints, oldest first (as ``JobHandle.savepoints``)."""
        return self._call(self._manager.savepoints, "savepoints")

    def rescale_progress(self, rescale_id: str) -> RescaleProgress:
        """The progress of rescale ``rescale_id`` (as ``RemoteRescale.progress``)."""
        return self._call(self._manager.rescale_progress, "rescale_progress", rescale_id)

    def rescale_result(self, rescale_id: str, timeout: float | None) -> RescaleProgress:
        """Wait up to ``timeout`` s for rescale ``rescale_id``; its final progress (else ``TimeoutError``)."""
        return self._call(self._manager.rescale_result, "rescale_result", rescale_id, timeout)

    # -- operating ---------------------------------------------------------------------

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: object) -> "RemoteRescale":
        """As ``Job.rescale``; returns a handle with ``progress()``, ``done()`` and ``result(timeout)``."""
        return RemoteRescale(self, self._call(self._manager.rescale, "rescale", operator, parallelism, strategy,
                                              planner, knobs))

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                **knobs: object) -> "RemoteRescale":
        """As ``Job.migrate``: a new bin -> instance table for a keyed operator."""
        return RemoteRescale(self, self._call(self._manager.migrate, "migrate", operator, list(assignment),
                                              strategy, knobs))

    def autoscale(self, enabled: bool = True, **options: object) -> dict[str, object]:
        """Switch the job's DS2 autoscaler on (options as ``Job.autoscale``) or off; a summary of the switch."""
        return self._call(self._manager.autoscale, "autoscale", enabled, options)

    def upgrade(self, operator: str, fn: object, *, on_timer: object = None, schema: pa.Schema | None = None,
                migrate_state: object = None, canary: int = 0, rate_bound: float = 0.5,
                timeout: float | None = 60.0) -> UpgradeRecord:
        """As ``Job.upgrade`` (the functions travel to the job's manager pickled)."""
        return self._call(self._manager.upgrade, "upgrade", operator, fn, on_timer, schema, migrate_state, canary,
                          rate_bound, timeout)

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        """The job's upgrade history (kept by its manager)."""
        return self._call(self._manager.upgrades, "upgrades")

    def add_branch(self, from_operator: str, build: Callable[..., object], timeout: float | None = 60.0) -> BranchCut:
        """As ``Job.add_branch`` (``build`` travels to the job's manager pickled; its record keeps the branch)."""
        return self._call(self._manager.add_branch, "add_branch", from_operator, build, timeout)

    def remove_branch(self, sink: str, timeout: float | None = 60.0) -> BranchCut:
        """As ``Job.remove_branch``."""
        return self._call(self._manager.remove_branch, "remove_branch", sink, timeout)

    def checkpoint(self, timeout: float | None = 120.0) -> int:
        """An aligned checkpoint now; returns its id once durable (``checkpoint_info`` for its path)."""
        return self.checkpoint_info(timeout).id

    def checkpoint_info(self, timeout: float | None = 120.0) -> CheckpointInfo:
        """An aligned checkpoint now: its id, path and duration."""
        return self._call(self._manager.checkpoint_info, "checkpoint", timeout)

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        """A checkpoint kept in ``dir`` (default: under the job's checkpoint dir) until deleted; its path."""
        return self._call(self._manager.savepoint, "savepoint", dir, timeout)

    def delete_savepoint(self, path: str) -> SavepointInfo:
        """Delete one of the job's savepoints (as ``JobHandle.delete_savepoint``); the job's events note it."""
        return self._call(self._manager.delete_savepoint, "delete_savepoint", path)

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """Stop gracefully: a final checkpoint (into ``savepoint`` if given), its output committed, the job
        finished. Returns that checkpoint."""
        return self._call(self._manager.stop, "stop", savepoint, timeout)

    def cancel(self) -> None:
        """Stop now; output after the last checkpoint is discarded. An ended job is left as it is."""
        self._call(self._manager.cancel, "cancel")

    def run_control(self, op: ControlOp, controller: str | None = None) -> OpHandle:
        """Start a control op on the job; returns its ``OpHandle``."""
        return self._call(self._manager.run_control, "run_control", op, controller)

    def forget(self) -> None:
        """Drop an ended job's record and results and remove its manager (a running job: ``ChirayError``)."""
        self._call(self._manager.forget, "forget")
        try:
            ray.kill(self._manager, no_restart=True)
        except Exception:
            pass

    # -- waiting -----------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job ends, as ``Job.wait``.

        Raises:
            ValueError: a negative timeout.
            TimeoutError: still running after ``timeout``.
            OperatorError / JobFailedError: the job failed (the error ``Job.wait`` raised in the manager).
            JobCancelledError: the job was cancelled.
        """
        check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 5.0 if deadline is None else min(max(deadline - time.monotonic(), 0.0), 5.0)
            state = self._call(self._manager.wait, "wait", left)
            if state is JobState.FAILED:
                failure = self._call(self._manager.failure, "wait")
                raise failure if failure is not None else JobFailedError(f"job {self.name!r} failed")
            if state is JobState.CANCELLED:
                raise JobCancelledError(f"job {self.name!r} was cancelled")
            if state is JobState.FINISHED:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.name!r} still running after {timeout} s")

    def result(self, sink: str | None = None) -> Any:
        """A finished job's sink result (``collect()``: a table; ``to_parquet``: the committed files)."""
        self.wait()
        return self._call(self._manager.result, "result", sink)

    def tail(self, sink: str | None = None, n: int = 10) -> pa.Table:
        """The newest ``n`` rows (up to 1,000) that reached ``sink`` of the running job (as ``Job.tail``)."""
        return self._call(self._manager.tail, "tail", sink, n)


class RemoteRescale:
    """A rescale the job manager runs: ``progress()``, ``done()``, ``result(timeout)``."""

    def __init__(self, job: AttachedJob, rescale_id: str):
        self.job = job
        self.id = rescale_id

    def progress(self) -> RescaleProgress:
        """Where the rescale is (its history entry's outcome once done)."""
        return self.job.rescale_progress(self.id)

    def done(self) -> bool:
        return bool(self.progress().done)

    def result(self, timeout: float | None = None) -> RescaleProgress:
        """Wait for the rescale; returns its final progress (raises ``TimeoutError`` / the rescale's error)."""
        check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 5.0 if deadline is None else min(max(deadline - time.monotonic(), 0.0), 5.0)
            try:
                return self.job.rescale_result(self.id, left)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
