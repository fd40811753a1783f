"""manager.py: the job manager's decisions, for one detached job that it owns on the cluster.

``submit(flow, name=..., detached=True)`` starts a ``JobManager`` actor (``lifetime="detached"``,
named by the job in the ``"chiray"`` namespace, ``max_restarts=-1``). The manager runs ``submit()``
itself, so the job controller, the hosts and the supervision thread belong to the manager's
process, not to the driver: the job outlives the driver.

The job's record (``jobstore.JobRecord``: the pickled flow, config,
checkpoint directory, events, rescale history, state and, once finished,
results) lives in Ray's internal KV store. When the manager dies its hosts
die with it (it owns them); Ray restarts it, and the new manager reloads the
record, finishes the sinks' commit of the last complete checkpoint, discards
later staged output and starts the job again from that checkpoint, at the
parallelism its completed rescales left. Nothing is lost or doubled: sinks
commit on checkpoint. Calls in flight at that moment fail (the client says
so); a rescale in flight is either complete before the checkpoint or not in
it.

``JobManagerCore`` makes the decisions (a plain class); ``detached.py`` holds the thin
``@ray.remote`` shell, ``JobManager``, and ``submit_detached`` (``submit(detached=True)``).
It keeps the record with ``managerrecord.RecordKeeper``, the rescales with
``managerrescales.RescaleBook`` and the sources' sides with
``managersides.SourceSides``.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Callable, TypedDict, cast

import cloudpickle
import ray

from chiray.control.coordination import JobState
from chiray.control.op import ControlOp
from chiray.operators.sides import source_sides

from . import jobstore
from ..config import JobConfig
from ..errors import ChirayError, JobCancelledError, portable
from .handle import VERBS as JOB_VERBS, ended_error
from .job import Job, JobStatus
from .jobfiles import sink_names, with_parallelism
from .jobvalues import CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleProgress, RescaleRecord, UpgradeRecord
from .submit import submit
from .jobstore import JobRecord
from .joblogs import JobLogs, job_log_actors, job_logs
from . import managerbranches
from .managerinfo import controller_pid, finished_result, host_pids, job_info, sink_results, submitted_parallelism
from .managerrecord import RecordKeeper
from .managerrescales import RescaleBook
from .managersides import SourceSides
from .metrics import MetricsExporter
from .ophandle import OpHandle
from .savepoints import SavepointInfo, delete_savepoint, find_savepoints, running_restores, savepoint_root, taken_in
from ..runtime.storage import CheckpointStorage

if TYPE_CHECKING:
    from .brancher import BranchCut
    import pyarrow as pa

__all__ = ["JobManagerCore", "VERBS", "AutoscaleSwitch"]

log = logging.getLogger(__name__)

VERBS: tuple[str, ...] = (*JOB_VERBS, "savepoint_info", "rescale_progress", "rescale_result", "host_pids",
                          "controller_pid", "failure")
"""The manager methods a client may call: every ``JobHandle`` verb, and what ``RemoteRescale`` and tests ask."""

POLL_S = 0.5


class AutoscaleSwitch(TypedDict):
    """What ``JobManagerCore.autoscale`` answers: the job, ``"on"`` or ``"off"``, and the options."""

    name: str
    autoscale: str
    options: dict[str, object]


class JobManagerCore:
    """Owns one job: deploys it, watches it, answers the verbs, keeps its record current.

    Args:
        name: the job's name.
        flow: the pickled dataflow.
        config: its ``JobConfig``.
        restore_from: a checkpoint to start from, or None.
        reconstructed: Ray restarted this manager: reload the record and roll back.
    """

    def __init__(self, name: str, flow: bytes, config: JobConfig, restore_from: str | None,
                 reconstructed: bool):
        self.name = name
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._start_error: BaseException | None = None
        self._job: Job | None = None
        self._ran: Job | None = None  # the job's last run, also once stopped or cancelled (its actors' logs)
        self._submitted: dict[str, int] | None = None  # each operator's parallelism as submitted (see info)
        self._sides = SourceSides(name)  # the running job's sources' sides (Spark drivers)
        stored = jobstore.load(name) if reconstructed else None
        self._restarted = stored is not None
        if stored is not None:
            record = dataclasses.replace(stored, restarts=stored.restarts + 1)
        else:
            root = config.checkpoint_dir or tempfile.mkdtemp(prefix=f"chiray-{name}-")
            record = JobRecord(name, flow, config, root, restore_from).with_event(EventKind.SUBMITTED)
        self._keeper = RecordKeeper(record, MetricsExporter(name))
        self._lock = self._keeper.lock
        self._rescales = RescaleBook(self._keeper)
        self._keeper.save()

    # -- record ----------------------------------------------------------------------

    @property
    def record(self) -> JobRecord:
        """The job's record as stored last."""
        return self._keeper.record

    @record.setter
    def record(self, record: JobRecord) -> None:
        self._keeper.record = record

    @property
    def storage(self) -> CheckpointStorage:
        return self._keeper.storage

    # -- deploying ---------------------------------------------------------------------

    def start(self) -> None:
        """Deploy the job (or bring it back after a restart), then watch it until it ends."""
        try:
            if self._restarted and self.record.terminal:
                self._ended.set()
            else:
                self._deploy()
        except BaseException as exc:  # reported to the submitting client by ready()
            self._start_error = exc
            self._keeper.update(JobEvent.of(EventKind.START_FAILED, error=str(exc)), state=JobState.FAILED,
                                error=str(exc), failure=portable(exc), ended_at=time.time())
            self._ended.set()
        finally:
            self._ready.set()
        if self._job is not None:
            self._watch()

    def _deploy(self, cause: str | None = None) -> None:
        """Deploy the job: as submitted, or (after this manager restarted, or because of ``cause``: a source's
        side failed) from its last checkpoint, its sinks recovered first."""
        record = self.record
        flow = with_parallelism(cloudpickle.loads(record.flow), dict(record.parallelism))
        self._keeper.exporter.describe(flow.graph)
        restore_from = record.restore_from
        if self._restarted or cause is not None:
            restore_from = self._keeper.roll_back(flow.graph, cause, restore_from)
        config = dataclasses.replace(record.config, detached=False, name=None,
                                     checkpoint_dir=record.checkpoint_dir)
        try:
            self._job = self._ran = cast(Job, submit(flow, config=config, restore_from=restore_from))  # not detached
        finally:  # the sides its sources' splits() started: this manager owns them (closed if the submit failed)
            self._sides = SourceSides(self.name, source_sides(flow.graph))
            if self._job is None:
                self._sides.close()
        self._keeper.new_run()
        self._rescales.seen_autoscale = 0
        if record.autoscale is not None:  # it was on before the manager restarted
            self._job.autoscale(True, **dict(record.autoscale))

    def ready(self, timeout: float | None) -> None:
        """Wait until the job is deployed; raise what made the deployment fail."""
        if not self._ready.wait(timeout):
            raise TimeoutError(f"job {self.name!r}: its manager did not deploy it within {timeout} s")
        if self._start_error is not None:
            raise self._start_error

    # -- watching ----------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._ended.is_set():
            job = self._job
            if job is None:
                return
            with self._lock:
                if self._ended.is_set():
                    return
                failed = self._sides.failure()
                if failed is not None:
                    self._recover_side(job, failed)
                    continue
                self._sides.keep_standbys()
                ended = self._poll_end(job)
            if ended:
                return
            if job is not self._job:  # it was started again (a source's side failed)
                continue
            events = self._keeper.keep_run_events(job)
            interval = self.record.config.metrics_interval_s
            if interval is not None:
                self._keeper.export_metrics(job, events, self.status)
            self._rescales.note()
            self._note_autoscale()
            self._ended.wait(interval or POLL_S)

    def _note_autoscale(self) -> None:
        scaler = self._job.autoscaler if self._job is not None else None
        if scaler is not None:
            self._rescales.note_autoscale(scaler.events)

    def _recover_side(self, job: Job, cause: str) -> None:
        """A source's side failed: stop the job's run and start it again from its last checkpoint (new sides
        resume there, on the failed sides' warm standbys where they kept one); the job fails if that start
        fails."""
        log.warning("job %s: %s; restarting it from its last checkpoint", self.name, cause)
        self._keeper.keep_run_events(job)
        self._job = None  # the verbs answer from the record meanwhile
        try:
            job.cancel()
        except Exception as exc:  # its actors may be gone already
            log.debug("job %s: cancelling the run failed: %r", self.name, exc)
        self._sides.close(hand_over=True)
        try:
            self._deploy(cause)
        except Exception as exc:
            self._end(JobState.FAILED, exc)

    def _poll_end(self, job: Job) -> bool:
        try:
            job.wait(timeout=0)
        except TimeoutError:
            return False
        except JobCancelledError:
            self._end(JobState.CANCELLED, None)
            return True
        except Exception as exc:
            failed = self._sides.failure()  # the run failed because its source's side died: run it again
            if failed is not None:
                self._recover_side(job, failed)
                return self._ended.is_set()
            self._end(JobState.FAILED, exc)
            return True
        self._end(JobState.FINISHED, None)
        return True

    def _end(self, state: JobState, failure: BaseException | None) -> None:
        """Record the job's end (its results and last statistics if it finished) and wake waiters."""
        job = self._job
        results: dict[str, object] = {}
        stats = None
        self._keeper.keep_run_events(job)
        if job is not None:
            try:
                stats = job.statistics()
                self._keeper.exporter.export(stats)
            except Exception:
                stats = None
            if state is JobState.FINISHED:
                results = sink_results(job)
        self._rescales.note()
        self._sides.close()
        error = None if failure is None else f"{type(failure).__name__}: {failure}"
        self._keeper.update(JobEvent.of(EventKind.ENDED, state=state, error=error), state=state, error=error,
                            failure=None if failure is None else portable(failure), results=tuple(results.items()),
                            statistics=stats, ended_at=time.time())
        self._ended.set()

    def autoscale(self, enabled: bool, options: dict[str, object]) -> AutoscaleSwitch:
        """Switch the job's autoscaler on (with ``options``) or off; kept across manager restarts."""
        job = self._running("autoscale")
        job.autoscale(enabled, **options)
        self._keeper.update(JobEvent.of(EventKind.AUTOSCALE_SWITCHED, enabled=enabled, options=dict(options)),
                            autoscale=tuple(sorted(options.items())) if enabled else None)
        return {"name": self.name, "autoscale": "on" if enabled else "off", "options": dict(options)}

    # -- verbs -------------------------------------------------------------------------

    def _running(self, verb: str) -> Job:
        if self.record.terminal or self._job is None:
            raise ended_error(self.name, self.record.state, verb)
        return self._job

    def status(self) -> JobStatus:
        job = self._job
        live = job.status() if job is not None and not self.record.terminal else None
        run = self._keeper.pending_run_events(live.events) if live else ()
        history = (*self.record.events, *run)
        state = live.state if live is not None else self.record.state
        return JobStatus(self.name, state, live.finished_instances if live else (), tuple(str(e) for e in history),
                         self.record.failure or (ChirayError(self.record.error) if self.record.error else None),
                         history)

    def info(self) -> JobInfo:
        """A summary for listings: state, uptime, operators and parallelism, last checkpoint."""
        job = self._job
        if job is None and self._submitted is None:  # unpickled once: it holds the user's code
            self._submitted = submitted_parallelism(self.record)
        return job_info(self.record, job, self.status().state, self._submitted or {}, self._sides.statuses())

    def host_pids(self) -> dict[int, int]:
        """Host id -> its process id, for operators and fault tests that kill a host as a crash would."""
        return host_pids(self._running("list the hosts of"))

    def controller_pid(self) -> int | None:
        """The process id of the job controller where it runs in an actor of its own (None: it runs in a
        host's process, see ``JobConfig.controller_process``), for fault tests that kill it."""
        return controller_pid(self._running("find the controller of"))

    def statistics(self) -> object:
        """The running job's ``JobStatistics``; an ended job's last (its record keeps them)."""
        if self.record.terminal:
            if self.record.statistics is None:
                raise ChirayError(f"job {self.name!r} ended without statistics")
            return self.record.statistics
        return self._running("read statistics of").statistics()

    def metrics(self, timeout: float | None = 60.0) -> object:
        return self._running("read metrics of").metrics(timeout)

    def run_control(self, op: ControlOp, controller: str | None = None) -> OpHandle:
        return self._running("run a control op on").run_control(op, controller)

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                knobs: dict[str, object] | None = None) -> str:
        """Start a rescale; returns its id for progress and result."""
        job = self._running("rescale")
        before = self._parallelism_before(job, operator)
        handle = job.rescale(operator, parallelism, strategy, planner, **(knobs or {}))
        return self._rescales.started(handle, operator, before, parallelism, strategy)

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                knobs: dict[str, object] | None = None) -> str:
        """Start a migration (a new bin -> instance table); returns its id for progress and result."""
        job = self._running("rescale")
        before = self._parallelism_before(job, operator)
        handle = job.migrate(operator, list(assignment), strategy, **(knobs or {}))
        return self._rescales.started(handle, operator, before, before, strategy)

    def _parallelism_before(self, job: Job, operator: str) -> int | None:
        node = job.plan.graph.nodes.get(operator)
        return dict(self.info().operators).get(operator, node.parallelism if node else None)

    def rescale_progress(self, rid: str) -> RescaleProgress:
        return self._rescales.progress(rid)

    def rescale_result(self, rid: str, timeout: float | None) -> RescaleProgress:
        return self._rescales.result(rid, timeout)

    def rescales(self) -> tuple[RescaleRecord, ...]:
        return tuple(r.without_progress() for r in self.record.rescales)

    def upgrade(self, operator: str, fn: Callable[..., object], on_timer: Callable[..., object] | None = None,
                schema: pa.Schema | None = None, migrate_state: Callable[..., object] | None = None,
                canary: int = 0, rate_bound: float = 0.5, timeout: float | None = 60.0) -> UpgradeRecord:
        """``Job.upgrade``; the history entry joins the record (kept across manager restarts), whatever the outcome."""
        job = self._running("upgrade")
        before = len(job.upgrades())
        try:
            return job.upgrade(operator, fn, on_timer=on_timer, schema=schema, migrate_state=migrate_state,
                               canary=canary, rate_bound=rate_bound, timeout=timeout)
        finally:
            for entry in job.upgrades()[before:]:
                self._keeper.update(JobEvent.of(EventKind.UPGRADE, operator=entry.operator, old=entry.old_code,
                                                new=entry.new_code, outcome=entry.outcome, error=entry.error),
                                    upgrades=(*self.record.upgrades, entry))

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        return tuple(self.record.upgrades)

    def add_branch(self, from_operator: str, build: Callable[..., object], timeout: float | None = 60.0) -> BranchCut:
        """``Job.add_branch``; the record's dataflow (what a restarted manager runs) gains the branch."""
        return managerbranches.add_branch(self._keeper, self._running("add a branch to"), from_operator, build,
                                          timeout)

    def remove_branch(self, sink: str, timeout: float | None = 60.0) -> BranchCut:
        """``Job.remove_branch``; the record's dataflow loses the branch."""
        return managerbranches.remove_branch(self._keeper, self._running("remove a branch of"), sink, timeout)

    def checkpoint(self, timeout: float | None = 120.0) -> int:
        return self.checkpoint_info(timeout).id

    def checkpoint_info(self, timeout: float | None = 120.0) -> CheckpointInfo:
        """An aligned checkpoint now; returns its id, path and duration once durable."""
        taken = self._running("checkpoint").checkpoint_info(timeout)
        self._keeper.noted_checkpoint(taken)
        return taken

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        return self.savepoint_info(dir, timeout).path

    def savepoint_info(self, dir: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """A checkpoint copied to ``dir`` (default ``<checkpoint_dir>/savepoints``), kept until deleted.

        Raises:
            ValueError: no ``dir`` for a job whose checkpoints go to a temporary directory (removed when the
                job is forgotten).
        """
        job = self._running("savepoint")
        if dir is None and self._keeper.temporary_dir() is not None:
            raise ValueError(f"job {self.name!r} keeps its checkpoints in a temporary directory, removed when it "
                             f"is forgotten: give savepoint a directory (or submit with checkpoint_dir=...)")
        taken = job.savepoint_info(dir, timeout)
        self._keeper.noted_checkpoint(taken)
        self._keeper.update(JobEvent.of(EventKind.SAVEPOINT, path=taken.path))
        return taken

    def savepoints(self) -> tuple[SavepointInfo, ...]:
        """Those under ``<checkpoint_dir>/savepoints`` and those the record's events name."""
        return find_savepoints(self.name, [savepoint_root(self.record.checkpoint_dir)], taken_in(self.record.events))

    def delete_savepoint(self, path: str) -> SavepointInfo:
        """Refused while a running detached job's record says it was restored from it; the record notes it."""
        deleted = delete_savepoint(self.name, path, self.savepoints(), running_restores())
        self._keeper.update(JobEvent.of(EventKind.SAVEPOINT_DELETED, path=deleted.path))
        return deleted

    def logs(self, lines: int = 100, since: JobLogs | tuple | None = None) -> JobLogs:
        """This manager's lines, then those of the hosts and controller of the job's last run."""
        me = ray.get_runtime_context().get_actor_id()
        return job_logs({**({"manager": me} if me else {}), **(job_log_actors(self._ran) if self._ran else {})},
                        lines, since)

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """Graceful stop (``Job.stop``); the record notes the checkpoint, the results and the end."""
        with self._lock:
            job = self._running("stop")
            taken = job.stop(savepoint, timeout)
            self._keeper.noted_checkpoint(taken)
            self._keeper.keep_run_events(job)
            self._job = None
            self._sides.close()
            stats = job.statistics()
            results = {sink: job.result(sink) for sink in sink_names(job.plan.graph)}
            self._keeper.exporter.export(stats)
            self._rescales.note()
            stopped = JobEvent.of(EventKind.STOPPED, id=taken.id, savepoint=taken.path if savepoint else None)
            self._keeper.update(stopped, state=JobState.FINISHED, statistics=stats, results=tuple(results.items()),
                                ended_at=time.time())
            self._ended.set()
            return taken

    def cancel(self) -> None:
        with self._lock:
            if self.record.terminal or self._job is None:
                return  # an ended job stays as it ended
            self._keeper.keep_run_events(self._job)
            self._job.cancel()
            self._job = None
            self._sides.close()
            self._keeper.update(JobEvent.of(EventKind.CANCELLED), state=JobState.CANCELLED, ended_at=time.time())
            self._ended.set()

    def wait(self, timeout: float | None = None) -> JobState:
        """Wait up to ``timeout`` s for the job to end; returns its state."""
        self._ended.wait(timeout)
        return self.record.state

    def failure(self) -> BaseException | None:
        """What made the job fail (its ``OperatorError`` where a user function raised)."""
        return self.record.failure

    def result(self, sink: str | None = None) -> object:
        return finished_result(self.record, sink)

    def tail(self, sink: str | None = None, n: int = 10) -> pa.Table:
        """The newest rows that reached ``sink`` (``Job.tail``)."""
        return self._running("tail").tail(sink, n)

    def forget(self) -> None:
        """Drop an ended job's record and the temporary checkpoint directory made for it (when no
        ``checkpoint_dir`` was given); the caller then removes the manager actor."""
        if not self.record.terminal:
            raise ChirayError(f"job {self.name!r} is {self.record.state.value.lower()}: stop or cancel it first")
        jobstore.delete(self.name)
        temporary = self._keeper.temporary_dir()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
