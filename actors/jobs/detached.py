"""detached.py: ``submit(..., detached=True)``: the job manager actor shell and the submit that starts it.

``JobManager`` is a thin ``@ray.remote`` shell (``lifetime="detached"``,
named by the job in the ``"chiray"`` namespace, ``max_restarts=-1``) around
``manager.JobManagerCore``: it deploys in a thread of its own and has one
remote method per verb of ``manager.VERBS`` (the ``JobHandle`` protocol's,
generated here, so a verb the core lacks fails at import and a misspelt
call is an ``AttributeError`` of the actor handle). ``submit_detached`` refuses sources that need the
driver, refuses a name that is taken, starts the manager and waits until the
job is deployed (raising what made the deployment fail).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import TYPE_CHECKING, Callable, Concatenate, ParamSpec, TypeVar

import cloudpickle
import ray
from ray.actor import ActorHandle

from chiray.operators.dataflow import Dataflow
from chiray.operators.graph import OperatorKind

from . import jobstore
from ..config import JobConfig
from .shareddir import check_shared_dir
from .submit import register_detached
from .jobstore import NAMESPACE
from .manager import VERBS, JobManagerCore

if TYPE_CHECKING:
    from .client import AttachedJob

__all__ = ["JobManager", "submit_detached", "refuse_driver_bound"]


class _JobManagerShell:
    """The actor shell: deploys in a thread of its own and answers each verb (added below) once deployed."""

    def __init__(self, name: str, flow: bytes, config: JobConfig, restore_from: str | None):
        logging.basicConfig(level=logging.WARNING)
        with warnings.catch_warnings():  # Ray 2.60 warns about its own use of a deprecated property
            warnings.simplefilter("ignore")
            reconstructed = ray.get_runtime_context().was_current_actor_reconstructed
        self._core = JobManagerCore(name, flow, config, restore_from, reconstructed)
        threading.Thread(target=self._core.start, name=f"chiray-manager-{name}", daemon=True).start()

    def ready(self, timeout: float | None = None) -> None:
        self._core.ready(timeout)



_P = ParamSpec("_P")
_R = TypeVar("_R")


def _verb(method: Callable[Concatenate[JobManagerCore, _P], _R]) -> Callable[Concatenate[_JobManagerShell, _P], _R]:
    """The shell's method for one of the core's: waits until the job is deployed, then calls it."""

    def verb(self: _JobManagerShell, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self._core.ready(None)
        return method(self._core, *args, **kwargs)

    verb.__name__ = verb.__qualname__ = method.__name__
    verb.__doc__ = method.__doc__
    return verb


for _name in VERBS:
    setattr(_JobManagerShell, _name, _verb(getattr(JobManagerCore, _name)))  # AttributeError: a verb it lacks

JobManager = ray.remote(max_restarts=-1, max_concurrency=64, num_cpus=0)(_JobManagerShell)  # type: ignore[call-overload]
"""The job manager actor class (``JobManager.options(...).remote(name, flow, config, restore_from)``)."""


def refuse_driver_bound(flow: Dataflow) -> None:
    """Raise ``ValueError`` if a source of ``flow`` needs the submitting process (a push-mode Spark source)."""
    for node in flow.graph.nodes.values():
        source = node.source if node.kind is OperatorKind.SOURCE else None
        reason = source.driver_bound() if source is not None else None
        if reason:
            raise ValueError(f"source {node.name!r} of job {flow.name!r} cannot run detached: {reason}")


def submit_detached(flow: Dataflow, config: JobConfig, restore_from: str | None) -> AttachedJob:
    """Start ``flow`` under a detached job manager; returns an ``AttachedJob``.

    Raises:
        ValueError: a source needs the driver, or a job of that name exists.
    """
    from .client import AttachedJob, find_manager

    refuse_driver_bound(flow)
    if not ray.is_initialized():
        ray.init()
    check_shared_dir(config.checkpoint_dir)
    name = flow.name
    existing = find_manager(name)
    if existing is not None:
        raise ValueError(_taken(name, existing))
    try:
        manager = JobManager.options(  # type: ignore[attr-defined]
            name=name, namespace=NAMESPACE, lifetime="detached").remote(
            name, cloudpickle.dumps(flow), config, restore_from)
    except ValueError:  # another submit took the name meanwhile
        raise ValueError(_taken(name, find_manager(name))) from None
    try:
        ray.get(manager.ready.remote(config.deploy_timeout_s + 60))
    except ray.exceptions.RayTaskError as exc:
        _discard(name, manager)
        raise (exc.cause or exc) from None
    except BaseException:
        _discard(name, manager)
        raise
    return AttachedJob(name, manager)


def _taken(name: str, manager: ActorHandle | None) -> str:
    state = "running"
    if manager is not None:
        try:
            state = ray.get(manager.info.remote(), timeout=10).as_dict()["state"].lower()
        except Exception:
            state = "restarting"
    if state in ("finished", "failed", "cancelled"):
        return (f"a {state} job named {name!r} is kept on this cluster until forgotten; run "
                f"`chiray forget {name}` or choose another name")
    return f"a job named {name!r} is already {state} on this cluster; choose another name"


def _discard(name: str, manager: ActorHandle) -> None:
    try:
        ray.kill(manager, no_restart=True)
    finally:
        jobstore.delete(name)


register_detached(submit_detached)
