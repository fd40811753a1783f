"""client.py: reaching a detached job from any process: ``attach(name)``, ``jobs()`` and ``AttachedJob``.

An ``AttachedJob`` has the verbs of the driver's ``Job`` and sends each to
the job's manager actor (``actors/manager.py``). Reading verbs (status,
statistics, wait, ...) retry while Ray restarts the manager; a changing
verb (checkpoint, rescale, stop, ...) that was in flight when the manager
died fails with a ``ManagerRestartedError``: the job rolled back to its last
checkpoint without it, so it is safe to run again.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray

from chiray.control.coordination import JobState

from . import jobstore
from .errors import ChirayError, JobCancelledError, JobFailedError
from .jobstore import NAMESPACE

__all__ = ["attach", "jobs", "AttachedJob", "RemoteRescale", "JobNotFoundError", "ManagerRestartedError",
           "connect", "find_manager"]

RESTART_WAIT_S = 60.0
"""How long a reading verb waits for a restarting manager."""

_READING = frozenset({"status", "info", "statistics", "rescale_progress", "rescales", "wait", "result"})


class JobNotFoundError(ChirayError, LookupError):
    """No job of that name on the cluster."""


class ManagerRestartedError(ChirayError):
    """The job manager died while it carried out a verb; the verb did not take effect."""


def connect(address: str | None = None) -> None:
    """Connect this process to the Ray cluster at ``address`` (default: ``RAY_ADDRESS``, else ``"auto"``)."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", namespace=NAMESPACE,
             logging_level=logging.ERROR, log_to_driver=False)


def find_manager(name: str) -> Any | None:
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
        known = [j["name"] for j in jobs(all=True)]
        raise JobNotFoundError(f"no job named {name!r} on this cluster; jobs: {known or 'none'}")
    return AttachedJob(name, manager)


def jobs(address: str | None = None, all: bool = False) -> list[dict[str, Any]]:
    """A summary of each detached job (``AttachedJob.info()``), running ones only unless ``all``."""
    connect(address)
    names = set(jobstore.names())
    names |= {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
    out = []
    for name in sorted(names):
        manager = find_manager(name)
        try:
            info = ray.get(manager.call.remote("info"), timeout=10) if manager is not None else None
        except ray.exceptions.RayError:
            info = None
        if info is None:
            record = jobstore.load(name)
            if record is None:
                continue
            info = {"name": name, "state": "RESTARTING" if manager is not None else record.state,
                    "operators": dict(record.parallelism), "uptime_s": time.time() - record.submitted_at,
                    "records_per_second": None, "restarts": record.restarts}
        if all or not JobState(info["state"]).terminal:
            out.append(info)
    return out


class AttachedJob:
    """A detached job's handle: the verbs of ``Job``, carried out by the job's manager."""

    def __init__(self, name: str, manager: Any):
        self.name = name
        self._manager = manager

    def __repr__(self) -> str:
        return f"AttachedJob({self.name!r})"

    def _call(self, verb: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            try:
                return ray.get(self._manager.call.remote(verb, *args, **kwargs), timeout=timeout)
            except ray.exceptions.RayTaskError as exc:
                raise (exc.cause if isinstance(exc.cause, BaseException) else exc) from None
            except ray.exceptions.RayActorError as exc:
                if find_manager(self.name) is None:
                    raise JobNotFoundError(f"job {self.name!r} is gone (forgotten or its cluster "
                                           f"restarted)") from None
                if verb not in _READING:
                    raise ManagerRestartedError(
                        f"job {self.name!r}: its manager died during {verb}; the job rolls back to its last "
                        f"checkpoint without it; run {verb} again") from exc
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # -- observing ---------------------------------------------------------------------

    def status(self) -> Any:
        """The job's ``JobStatus``: state, events (the manager's and the current run's)."""
        return self._call("status")

    def info(self) -> dict[str, Any]:
        """A summary: state, uptime, operators and their parallelism, last checkpoint, records/s."""
        return self._call("info")

    def statistics(self) -> Any:
        """Per-instance ``JobStatistics`` (the last snapshot once the job ended)."""
        return self._call("statistics")

    def metrics(self, timeout: float | None = 60.0) -> Any:
        """A ``Monitor`` op's result, run in-band now."""
        return self._call("metrics", timeout)

    def rescales(self) -> tuple[dict, ...]:
        """The rescale history: when, operator, from -> to, strategy, duration, bytes, outcome."""
        return self._call("rescales")

    def rescale_progress(self, rescale_id: str) -> dict[str, Any]:
        """The progress of rescale ``rescale_id`` (as ``RemoteRescale.progress``)."""
        return self._call("rescale_progress", rescale_id)

    def rescale_result(self, rescale_id: str, timeout: float | None) -> dict[str, Any]:
        """Wait up to ``timeout`` s for rescale ``rescale_id``; its final progress (else ``TimeoutError``)."""
        return self._call("rescale_result", rescale_id, timeout)

    # -- operating ---------------------------------------------------------------------

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: Any) -> "RemoteRescale":
        """As ``Job.rescale``; returns a handle with ``progress()``, ``done()`` and ``result(timeout)``."""
        return RemoteRescale(self, self._call("rescale", operator, parallelism, strategy, planner, None, knobs))

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                **knobs: Any) -> "RemoteRescale":
        """As ``Job.migrate``: a new bin -> instance table for a keyed operator."""
        return RemoteRescale(self, self._call("rescale", operator, None, strategy, "ssm", list(assignment), knobs))

    def autoscale(self, enabled: bool = True, **options: Any) -> dict[str, Any]:
        """Switch the job's DS2 autoscaler on (options as ``Job.autoscale``) or off."""
        return self._call("autoscale", enabled, options)

    def checkpoint(self, timeout: float | None = 120.0) -> int:
        """An aligned checkpoint now; returns its id once durable (``checkpoint_info`` for its path)."""
        return int(self.checkpoint_info(timeout)["id"])

    def checkpoint_info(self, timeout: float | None = 120.0) -> dict[str, Any]:
        """An aligned checkpoint now: ``{"id", "path", "duration_s"}``."""
        return self._call("checkpoint", timeout)

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        """A checkpoint kept in ``dir`` (default: under the job's checkpoint dir) until deleted; its path."""
        return str(self._call("savepoint", dir, timeout)["path"])

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> dict[str, Any]:
        """Stop gracefully: a final checkpoint (into ``savepoint`` if given), its output committed, the job
        finished. Returns ``{"id", "path", ...}`` of that checkpoint."""
        return self._call("stop", savepoint, timeout)

    def cancel(self) -> None:
        """Stop now; output after the last checkpoint is discarded (an ended job: ``ChirayError``)."""
        self._call("cancel")

    def run_control(self, op: Any, controller: str | None = None) -> Any:
        """Start a control op on the job; returns its ``OpHandle``."""
        return self._call("run_control", op, controller)

    def forget(self) -> None:
        """Drop a finished job's record and results and remove its manager."""
        self._call("forget")
        try:
            ray.kill(self._manager, no_restart=True)
        except Exception:
            pass

    # -- waiting -----------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Block until the job ends, as ``Job.wait`` (TimeoutError, JobFailedError, JobCancelledError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 5.0 if deadline is None else min(max(deadline - time.monotonic(), 0.0), 5.0)
            state = JobState(self._call("wait", left))
            if state is JobState.FAILED:
                raise JobFailedError(f"job {self.name!r} failed: {self.info().get('error')}")
            if state is JobState.CANCELLED:
                raise JobCancelledError(f"job {self.name!r} was cancelled")
            if state is JobState.FINISHED:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.name!r} still running after {timeout} s")

    def result(self, sink: str | None = None) -> Any:
        """A finished job's sink result (``collect()``: a table; ``to_parquet``: the committed files)."""
        self.wait()
        return self._call("result", sink)


class RemoteRescale:
    """A rescale the job manager runs: ``progress()``, ``done()``, ``result(timeout)``."""

    def __init__(self, job: AttachedJob, rescale_id: str):
        self.job = job
        self.id = rescale_id

    def progress(self) -> dict[str, Any]:
        """{"state", "steps_done", "steps", "bins_moved", "bins", "bytes_moved", "elapsed_s", "done", ...}."""
        return self.job.rescale_progress(self.id)

    def done(self) -> bool:
        return bool(self.progress()["done"])

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait for the rescale; returns its final progress (raises ``TimeoutError`` / the rescale's error)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 5.0 if deadline is None else min(max(deadline - time.monotonic(), 0.0), 5.0)
            try:
                return self.job.rescale_result(self.id, left)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

