"""submit.py: ``submit()`` validates a dataflow, deploys its controller and hosts on Ray, and returns its ``Job``.

A restore (``restore_from=``) is matched to the dataflow here (``restore_point``):
state goes to the operator of the same identity and kind, and state with no
operator to go to is refused unless dropped explicitly. ``detached=True`` hands
the dataflow to a job manager actor instead (``detached.py`` registers it).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import re
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, cast, overload

import pyarrow.fs as pafs
import ray
from ray.actor import ActorHandle

from chiray.control.oprun import job_view
from chiray.control.trees import Tree
from chiray.operators.dataflow import Dataflow
from chiray.operators.graph import LogicalGraph, OperatorKind, PhysicalPlan, physical_plan
from chiray.operators.logic import Sink, Source
from chiray.operators.pickling import check_picklable
from chiray.operators.staging import new_run_id

from ..config import JobConfig
from ..runtime.controller import HostedController, JobController
from .handle import JobHandle
from .job import Job
from .jobactors import HostActor
from ..runtime.build import control_trees
from .placement import place
from .shareddir import check_shared_dir
from .pool import warm_pool
from ..runtime.restore import RestoreInfo, match_operators, reset_code
from ..runtime.storage import CheckpointError, CheckpointStorage, child_uri, split_uri
from .supervisor import CONTROLLER_POOL_KEY, Deployment, bind_sinks, claim_outputs, release_outputs

if TYPE_CHECKING:
    from .client import AttachedJob

__all__ = ["submit", "restore_point", "register_detached"]

log = logging.getLogger(__name__)

def _private_graph(flow: Dataflow) -> LogicalGraph:
    """A copy of the flow's graph that the job may bind (sinks) without touching the user's Dataflow."""
    graph = copy.copy(flow.graph)
    graph.nodes = {k: dataclasses.replace(v, inputs=list(v.inputs)) for k, v in flow.graph.nodes.items()}
    return graph


def restore_point(restore_from: str, plan: PhysicalPlan, allow_non_restored_state: bool = False) -> RestoreInfo:
    """The checkpoint ``restore_from`` names (a ``chk-N`` directory, or a root: its newest), matched to ``plan``.

    State goes to the operator with the same identity (``Stream.uid``, else the name) and kind.

    Raises:
        CheckpointError: it is missing, incomplete or corrupt, or it does not fit the dataflow: bins
            differ, or some of its state has no operator to go to (unless ``allow_non_restored_state``).
    """
    path = str(restore_from).rstrip("/")
    storage, manifest = _checkpoint_at(path)
    nodes = plan.graph.nodes
    renames, orphans, empty = match_operators(manifest, nodes)
    saved = manifest.get("job", {}).get("operators", {})
    for name, old in renames.items():
        node = nodes[name]
        if node.kind is OperatorKind.KEYED and old is not None and saved[old]["num_bins"] != node.num_bins:
            raise CheckpointError(
                f"cannot restore operator {name!r} from {path!r}: it was saved with "
                f"{saved[old]['num_bins']} bins, the dataflow has {node.num_bins}")
    if orphans and not allow_non_restored_state:
        held = ", ".join(f"{old!r} ({what}, uid {saved.get(old, {}).get('uid', old)!r})"
                         for old, what in sorted(orphans.items()))
        raise CheckpointError(
            f"cannot restore from {path!r}: the checkpoint holds state of {held} that no operator of dataflow "
            f"{plan.graph.name!r} takes" + (f"; operators {sorted(empty)} would start with none" if empty else "")
            + ". Give a renamed operator its old identity (stream.uid('<old name>')), or pass "
            "allow_non_restored_state=True to drop that state")
    if orphans:
        log.warning("restore from %r drops the state of %s (allow_non_restored_state=True)", path, sorted(orphans))
    return RestoreInfo(storage, manifest, renames)


def _checkpoint_at(path: str) -> tuple[CheckpointStorage, dict]:
    """The storage and manifest of the checkpoint ``path`` names: a root's newest, a ``chk-N`` directory, or
    the newest of a savepoint directory's one job life.

    Raises:
        CheckpointError: there is none, or it is incomplete or corrupt.
    """
    parent, base = split_uri(path)  # a URI's query string stays at its end
    match = re.match(r"^chk-(\d+)$", base)
    try:  # a root that holds checkpoints, even one named like a checkpoint ("chk-0")
        storage = CheckpointStorage(path, create=False)
        latest = storage.latest()
    except CheckpointError:
        if not match:
            raise
        latest = None
    if latest is None and match:  # a checkpoint's own directory
        storage = CheckpointStorage(parent or ".", create=False)
        latest = storage.load(int(match.group(1)))
    elif latest is None:  # a savepoint directory: one job life's savepoints per subdirectory
        storage, latest = _only_savepoints(storage, path)
    return storage, latest


def _only_savepoints(parent: CheckpointStorage, path: str) -> tuple[CheckpointStorage, dict]:
    """The newest checkpoint of the one subdirectory of ``path`` that holds any (savepoints go to
    ``DIR/{job}-{run}/chk-N``); several: refused, naming them."""
    found = []
    for info in parent.fs.get_file_info(pafs.FileSelector(parent.root, allow_not_found=True)):
        if info.type == pafs.FileType.Directory:
            sub = CheckpointStorage(child_uri(path, info.base_name), create=False)
            latest = sub.latest()
            if latest is not None:
                found.append((info.base_name, sub, latest))
    if not found:
        raise CheckpointError(f"no complete checkpoint under {path!r}")
    if len(found) > 1:
        raise CheckpointError(f"{path!r} holds the savepoints of {len(found)} jobs ({sorted(f[0] for f in found)}): "
                              f"restore from one of them (a subdirectory, or one of its chk-N directories)")
    return found[0][1], found[0][2]


DetachedSubmit = Callable[[Dataflow, JobConfig, "str | None"], "AttachedJob"]
"""What runs a ``detached=True`` job: ``(flow, config, restore_from) -> AttachedJob``."""

_DETACHED: DetachedSubmit | None = None


def register_detached(fn: DetachedSubmit) -> None:
    """Set the function that runs a ``detached=True`` job (``actors/jobs/detached.py`` registers it)."""
    global _DETACHED
    _DETACHED = fn


@overload
def submit(flow: Dataflow, *, config: None = None, restore_from: str | None = None,
           allow_non_restored_state: bool = False, detached: Literal[False] = False, **options: Any) -> Job: ...


@overload
def submit(flow: Dataflow, *, config: JobConfig | None = None, restore_from: str | None = None,
           allow_non_restored_state: bool = False, detached: Literal[True], **options: Any) -> AttachedJob: ...


@overload
def submit(flow: Dataflow, *, config: JobConfig | None = None, restore_from: str | None = None,
           allow_non_restored_state: bool = False, detached: bool = False, **options: Any) -> JobHandle: ...


def submit(flow: Dataflow, *, config: JobConfig | None = None, restore_from: str | None = None,
           allow_non_restored_state: bool = False, **options: Any) -> JobHandle:
    """Validate ``flow``, deploy its controller and host actors, and start it.

    For type checkers: a ``Job`` without ``config`` and ``detached``, an ``AttachedJob`` with
    ``detached=True``, else a ``JobHandle``, the interface both implement.

    Args:
        flow: the dataflow.
        config: runtime options; or pass ``JobConfig`` fields as keywords (``checkpoint_dir=``,
            ``checkpoint_interval_s=``, ``num_hosts=``...), which replace those of ``config``.
        restore_from: start from a checkpoint (a ``.../chk-N`` directory or a
            checkpoint root, meaning its newest complete checkpoint), like a
            savepoint restore; keyed operators may have another parallelism. State
            goes to the operator of the same identity (``Stream.uid``, else its name).
        allow_non_restored_state: drop checkpoint state that no operator takes
            (refused otherwise).
        **options: ``JobConfig`` fields; ``detached=True`` runs the job under a job manager actor.

    Returns:
        The running job's handle; with ``detached=True``, an ``AttachedJob``
        on the job's manager actor, which outlives this process.

    Raises:
        ValueError, TypeError: the dataflow is invalid (naming the operator).
        CheckpointError: ``restore_from`` is missing, incomplete or does not fit.
    """
    if config is None:
        config = JobConfig(**options)
    elif options:
        config = dataclasses.replace(config, **options)
    flow.validate()  # here: its warnings name the caller's line
    flow, config = _prepared(flow, config)
    if config.detached:
        if _DETACHED is None:
            raise RuntimeError("bug: no job manager registered (import chiray.actors)")
        return _DETACHED(flow, config, restore_from)
    return _deploy(flow, config, restore_from, allow_non_restored_state)


def _prepared(flow: Dataflow, config: JobConfig) -> tuple[Dataflow, JobConfig]:
    """``flow`` (validated), checked to pickle and named as ``config`` names the job; ``config`` with a run id
    (a new one if it has none).

    Raises:
        TypeError: a user function of the dataflow does not pickle (naming the operator).
    """
    check_picklable(flow.graph)
    if config.name is not None and config.name != flow.name:
        flow = copy.copy(flow)
        flow.name = config.name
    return flow, dataclasses.replace(config, run_id=config.run_id or new_run_id())


def _deploy(flow: Dataflow, config: JobConfig, restore_from: str | None, allow_non_restored_state: bool) -> Job:
    """Deploy ``flow`` (prepared) on Ray, started here if need be: its controller and hosts; the running job."""
    if not ray.is_initialized():
        ray.init()
    check_shared_dir(config.checkpoint_dir)  # a local directory on several nodes: every node must read it
    plan = physical_plan(_private_graph(flow))
    restore = (restore_point(restore_from, plan, allow_non_restored_state)
               if restore_from is not None else None)
    reset_code(plan, restore)  # the code an upgrade put in place before the checkpoint: a scale-out builds it
    num_hosts, placement = place(plan, config.num_hosts, config.placement, config.colocate)
    root = tempfile.mkdtemp(prefix=f"chiray-{flow.name}-") if config.checkpoint_dir is None else config.checkpoint_dir
    own_dir = root if config.checkpoint_dir is None else None
    storage = CheckpointStorage(root)
    sinks = bind_sinks(plan.graph.nodes.values(), storage, config.run_id)
    with _undone_on_failure(own_dir, None):
        claim_outputs(flow.name, sinks)
    deployment = Deployment(flow.name, ray.put(plan), placement, num_hosts, config, storage, sinks,
                            fallback=restore)
    view = job_view(flow.name, plan)
    broadcast, _ = control_trees(plan, placement, config.control_fanout)
    sources = {n.name: n.source for n in plan.graph.nodes.values() if n.kind is OperatorKind.SOURCE}
    deployment.plan = plan
    make_controller = _ControllerStarter(flow.name, config, deployment, storage, broadcast, sources)
    with _undone_on_failure(own_dir, sinks):  # without controller_process, the job's launch starts it in its first host
        controller = make_controller() if config.controller_process else None
    job = Job(flow.name, plan, controller, [], view, own_dir=own_dir)
    with _undone_on_failure(own_dir, sinks):  # a job that never ran leaves no temporary checkpoint directory behind
        job.launch(deployment, restore, make_controller)
    return job


@contextlib.contextmanager
def _undone_on_failure(own_dir: str | None, sinks: dict[str, Sink] | None) -> Iterator[None]:
    """If the block raises: ``sinks`` drop their claims on their output, and ``own_dir`` (the temporary
    checkpoint directory made for the job) goes."""
    try:
        yield
    except BaseException:
        if sinks is not None:
            release_outputs(sinks)
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        raise


@dataclasses.dataclass(frozen=True)
class _ControllerStarter:
    """Starts the job's controller (``Job.launch`` and the supervisor call it), for the deployment as it is
    then: the plan and placement that rescales left."""

    name: str
    config: JobConfig
    deployment: Deployment
    storage: CheckpointStorage
    broadcast: Tree
    sources: dict[str, Source | None]

    def __call__(self, host: HostActor | None = None, host_id: int = 0) -> ActorHandle:
        """The job's controller: in the process of ``host`` (id ``host_id``), else in an actor of its own."""
        config = self.config
        first = max(self.storage.checkpoint_ids(), default=0) + 1
        plan = self.deployment.plan
        assert plan is not None  # the deployment knows its plan before any controller starts
        sinks = [i for i in plan.instances if plan.graph.nodes[i[0]].kind is OperatorKind.SINK]  # branches too
        args = (self.name, sinks, config, job_view(self.name, plan), self.broadcast, self.deployment.placement,
                self.storage, self.deployment.sinks, first, self.sources)
        if host is not None:
            ray.get(host.controller_call.remote("configure", args, {}, config.run_id))
            return cast(ActorHandle, HostedController(host, host_id, config.run_id))  # answers as an actor does
        warm = warm_pool().take(CONTROLLER_POOL_KEY, 1) if config.warm_hosts else []
        if warm:
            ray.get(warm[0].configure.remote(*args))  # configured before anyone calls it (from any thread)
            return warm[0]
        return JobController.remote(*args)  # type: ignore[attr-defined,return-value]
