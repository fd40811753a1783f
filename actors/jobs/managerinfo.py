"""managerinfo.py: what a job manager reports of its job from the record and the running job.

The summary for listings (``job_info``: operators and their parallelism now,
the last checkpoint, records/s), a finished job's sink results as the
record keeps them, and the process ids of the running job's actors (for
fault tests that kill them).
"""

from __future__ import annotations

import logging
import time

import cloudpickle
import ray

from chiray.control.coordination import JobState
from chiray.operators.graph import OperatorKind
from chiray.operators.sides import SourceSideStatus

from ..errors import ChirayError
from .job import Job
from .jobfiles import sink_names
from .jobstore import JobRecord
from .jobvalues import CheckpointInfo, JobInfo
from ..runtime.controller import controller_host
from ..runtime.storage import CheckpointStorage

__all__ = ["job_info", "submitted_parallelism", "sink_results", "finished_result", "host_pids", "controller_pid"]

log = logging.getLogger(__name__)


def submitted_parallelism(record: JobRecord) -> dict[str, int]:
    """Each operator's parallelism in the submitted flow (it holds the user's code: unpickle it once)."""
    try:
        graph = cloudpickle.loads(record.flow).graph
        return {n.name: n.parallelism for n in graph.nodes.values()}
    except Exception as exc:  # its code no longer imports here: the rescaled operators only
        log.warning("job %s: cannot read the submitted flow: %r", record.name, exc)
        return {}


def job_info(record: JobRecord, job: Job | None, state: JobState, submitted: dict[str, int],
             sources: tuple[SourceSideStatus, ...]) -> JobInfo:
    """A summary for listings: state, uptime, operators and parallelism, last checkpoint.

    Args:
        record: the job's record.
        job: its running run, if any.
        state: its state now.
        submitted: each operator's parallelism as submitted (``submitted_parallelism``).
        sources: the statuses of its sources' sides.
    """
    if job is not None:  # the deployed plan is the current one (a rescale step updates it)
        deployed = job.deployment.plan if job.deployment is not None else None
        plan = deployed if deployed is not None else job.plan
        operators = {n.name: n.parallelism for n in plan.graph.nodes.values()}
    else:  # stopped, cancelled or not deployed: as submitted, then as its completed rescales left it
        operators = dict(submitted)
    operators.update(dict(record.parallelism))
    storage = CheckpointStorage(record.checkpoint_dir)
    ids = storage.committed() if not record.terminal else storage.checkpoint_ids()
    last = CheckpointInfo(ids[-1], storage.chk_dir(ids[-1])) if ids else None
    return JobInfo(record.name, state, record.submitted_at, record.ended_at,
                   (record.ended_at or time.time()) - record.submitted_at, tuple(operators.items()),
                   record.restarts, record.error, record.checkpoint_dir, last,
                   _rate(job) if not record.terminal else None, sources=sources)


def _rate(job: Job | None) -> float | None:
    """The records/s the running job's sources emitted since it started."""
    if job is None:
        return None
    try:
        stats = job.statistics()
    except Exception:
        return None
    sources = {n.name for n in job.plan.graph.nodes.values() if n.kind is OperatorKind.SOURCE}
    out = sum(s.records_out for s in stats.instances if s.operator in sources)
    return out / max(time.time() - job.started_at, 1e-6)


def sink_results(job: Job) -> dict[str, object]:
    """Sink -> its result, for the sinks of a finished ``job`` that have one."""
    results: dict[str, object] = dict(job.removed_results)  # sinks whose branch was removed while it ran
    for sink in sink_names(job.plan.graph):
        try:
            results[sink] = job.result(sink)
        except Exception as exc:  # a stopped job: its committed output
            log.debug("job %s: no result for %s: %r", job.name, sink, exc)
    return results


def finished_result(record: JobRecord, sink: str | None) -> object:
    """The result of ``sink`` (``None``: the only sink) of a finished job, as its record keeps it.

    Raises:
        ChirayError: the job did not finish.
        ValueError: no such sink, or several and none named.
    """
    if record.state is not JobState.FINISHED:
        raise ChirayError(f"job {record.name!r} is {record.state.value.lower()}: it has no result")
    results = dict(record.results)
    if sink is None:
        if len(results) != 1:
            raise ValueError(f"job {record.name!r} has sinks {sorted(results)}; name one")
        return next(iter(results.values()))
    if sink not in results:
        raise ValueError(f"job {record.name!r} has no sink {sink!r}; sinks: {sorted(results)}")
    return results[sink]


def host_pids(job: Job) -> dict[int, int]:
    """Host id -> its process id, for operators and fault tests that kill a host as a crash would."""
    hosts = job.topology.peers()
    return {host_id: ray.get(host.pid.remote(), timeout=30) for host_id, host in hosts.items()}


def controller_pid(job: Job) -> int | None:
    """The process id of the job controller where it runs in an actor of its own (None: it runs in a
    host's process, see ``JobConfig.controller_process``), for fault tests that kill it."""
    controller = job.topology.controller
    if controller is None or controller_host(controller) is not None:
        return None
    return ray.get(controller.pid.remote(), timeout=30)
