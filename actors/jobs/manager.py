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
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any

import cloudpickle
import ray

from chiray.control.coordination import JobState
from chiray.operators.graph import OperatorKind
from chiray.operators.sides import SourceSide, SourceSideStatus, source_sides

from . import jobstore
from ..config import JobConfig
from ..errors import ChirayError, JobCancelledError, portable
from .handle import VERBS as JOB_VERBS, ended_error
from .job import Job, JobStatus
from ..runtime.controller import controller_host
from .jobfiles import RescaleOutcome, dir_bytes, interrupted, plain, recover_sinks
from .jobfiles import sink_names, with_parallelism
from .jobvalues import (CheckpointInfo, EventKind, JobEvent, JobInfo, RescaleProgress, RescaleRecord, RescaleState,
                        UpgradeRecord)
from .submit import submit
from .jobstore import JobRecord
from .joblogs import JobLogs, job_log_actors, job_logs
from .metrics import MetricsExporter
from ..runtime.restore import RestoreInfo
from .savepoints import SavepointInfo, delete_savepoint, find_savepoints, running_restores, savepoint_root, taken_in
from ..runtime.storage import CheckpointStorage

__all__ = ["JobManagerCore", "VERBS"]

log = logging.getLogger(__name__)

VERBS: tuple[str, ...] = (*JOB_VERBS, "savepoint_info", "rescale_progress", "rescale_result", "host_pids",
                          "controller_pid", "failure")
"""The manager methods a client may call: every ``JobHandle`` verb, and what ``RemoteRescale`` and tests ask."""

POLL_S = 0.5
STATE_SIZE_INTERVAL_S = 10.0


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
        self._lock = threading.RLock()
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._start_error: BaseException | None = None
        self._job: Job | None = None
        self._ran: Job | None = None  # the job's last run, also once stopped or cancelled (its actors' logs)
        self._rescales: dict[str, Any] = {}  # rescale id -> RescaleHandle (this incarnation's)
        self._exporter = MetricsExporter(name)
        self._seen_checkpoint = 0
        self._seen_autoscale = 0
        self._run_events = 0  # the events of the running job's run already in the record
        self._submitted: dict[str, int] | None = None  # see _submitted_parallelism
        self._sides: list[tuple[str, SourceSide]] = []  # the running job's sources' sides (Spark drivers)
        stored = jobstore.load(name) if reconstructed else None
        self._restarted = stored is not None
        if stored is not None:
            self.record = dataclasses.replace(stored, restarts=stored.restarts + 1)
        else:
            root = config.checkpoint_dir or tempfile.mkdtemp(prefix=f"chiray-{name}-")
            self.record = JobRecord(name, flow, config, root, restore_from).with_event(EventKind.SUBMITTED)
        self._save()

    # -- record ----------------------------------------------------------------------

    def _save(self) -> None:
        jobstore.save(self.record)

    def _update(self, *events: JobEvent, **changes: Any) -> None:
        """Change the record (and add ``events``) and store it."""
        with self._lock:
            record = dataclasses.replace(self.record, **changes) if changes else self.record
            self.record = dataclasses.replace(record, events=(*record.events, *events)) if events else record
            self._save()
        if "state" in changes:
            self._exporter.job_state(changes["state"])

    @property
    def storage(self) -> CheckpointStorage:
        return CheckpointStorage(self.record.checkpoint_dir)

    def _temporary_dir(self) -> str | None:
        """The checkpoint directory this manager made for the job (none was given): ``forget`` removes it."""
        return self.record.checkpoint_dir if self.record.config.checkpoint_dir is None else None

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
            self._update(JobEvent.of(EventKind.START_FAILED, error=str(exc)), state=JobState.FAILED, error=str(exc),
                         failure=portable(exc), ended_at=time.time())
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
        self._exporter.describe(flow.graph)
        restore_from = record.restore_from
        if self._restarted or cause is not None:
            storage = self.storage
            latest = storage.latest()
            restore = RestoreInfo(storage, latest) if latest is not None else None
            recover_sinks(flow.graph, storage, restore, record.config.run_id or "")
            if restore is not None:
                restore_from = record.checkpoint_dir
            where = (f"checkpoint {restore.checkpoint_id}" if restore is not None else
                     f"the restore point {restore_from}" if restore_from is not None else "the start")
            self._exporter.recovery()
            event = (JobEvent.of(EventKind.RECOVERY, restart=record.restarts, where=where) if cause is None else
                     JobEvent.of(EventKind.SOURCE_RECOVERY, cause=cause, where=where))
            self._update(event, state=JobState.RUNNING, rescales=tuple(interrupted(r) for r in record.rescales))
        config = dataclasses.replace(record.config, detached=False, name=None,
                                     checkpoint_dir=record.checkpoint_dir)
        try:
            self._job = self._ran = submit(flow, config=config, restore_from=restore_from)
        finally:  # the sides its sources' splits() started: this manager owns them (closed if the submit failed)
            self._sides = source_sides(flow.graph)
            if self._job is None:
                self._close_sides()
        self._seen_checkpoint = max(self.storage.checkpoint_ids(), default=0)
        self._seen_autoscale = 0
        self._run_events = 0  # the events of this run already in the record (see _keep_run_events)
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
        last_sizes = 0.0
        seen_recoveries = 0
        while not self._ended.is_set():
            job = self._job
            if job is None:
                return
            with self._lock:
                if self._ended.is_set():
                    return
                failed = self._failed_side()
                if failed is not None:
                    self._recover_side(job, failed)
                    continue
                self._keep_standbys()
                ended = self._poll_end(job)
            if ended:
                return
            if job is not self._job:  # it was started again (a source's side failed)
                continue
            events = self._keep_run_events(job)
            interval = self.record.config.metrics_interval_s
            if interval is not None:
                try:
                    self._exporter.export(job.statistics())
                    self._exporter.job_state(self.status().state)  # RECOVERING shows only here
                    seen_recoveries = self._note_recoveries(events, seen_recoveries)
                    self._note_checkpoints()
                    if time.monotonic() - last_sizes > STATE_SIZE_INTERVAL_S:
                        last_sizes = time.monotonic()
                        self._exporter.state_sizes(job.metrics(timeout=10).instances)
                except Exception as exc:  # a recovery or rescale is swapping actors: try again next time
                    log.debug("job %s: metrics export skipped: %r", self.name, exc)
            self._note_rescales()
            self._note_autoscale()
            self._ended.wait(interval or POLL_S)

    # -- sources' sides --------------------------------------------------------------------

    def _failed_side(self) -> str | None:
        """Why a side of the running job's sources failed (the first one found), or ``None``."""
        for _, side in self._sides:
            reason = side.failure()
            if reason is not None:
                return reason
        return None

    def _keep_standbys(self) -> None:
        """Have each side keep a warm standby (a side starts one once it serves the job)."""
        for name, side in self._sides:
            try:
                side.keep_standby()
            except Exception as exc:  # a restart then starts its side from nothing
                log.warning("job %s: starting a standby for the side of source %s failed: %r", self.name, name, exc)

    def _recover_side(self, job: Job, cause: str) -> None:
        """A source's side failed: stop the job's run and start it again from its last checkpoint (new sides
        resume there, on the failed sides' warm standbys where they kept one); the job fails if that start
        fails."""
        log.warning("job %s: %s; restarting it from its last checkpoint", self.name, cause)
        self._keep_run_events(job)
        self._job = None  # the verbs answer from the record meanwhile
        try:
            job.cancel()
        except Exception as exc:  # its actors may be gone already
            log.debug("job %s: cancelling the run failed: %r", self.name, exc)
        self._close_sides(hand_over=True)
        try:
            self._deploy(cause)
        except Exception as exc:
            self._end(JobState.FAILED, exc)

    def _close_sides(self, hand_over: bool = False) -> None:
        sides, self._sides = self._sides, []
        for name, side in sides:
            try:
                side.hand_over() if hand_over else side.close()
            except Exception as exc:
                log.warning("job %s: closing the side of source %s failed: %r", self.name, name, exc)

    def _side_statuses(self) -> tuple[SourceSideStatus, ...]:
        return tuple(side.status() for _, side in self._sides)

    def _poll_end(self, job: Job) -> bool:
        try:
            job.wait(timeout=0)
        except TimeoutError:
            return False
        except JobCancelledError:
            self._end(JobState.CANCELLED, None)
            return True
        except Exception as exc:
            failed = self._failed_side()  # the run failed because its source's side died: run it again
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
        results: dict[str, Any] = {}
        stats = None
        self._keep_run_events(job)
        if job is not None:
            try:
                stats = job.statistics()
                self._exporter.export(stats)
            except Exception:
                stats = None
            if state is JobState.FINISHED:
                for sink in sink_names(job.plan.graph):
                    try:
                        results[sink] = job.result(sink)
                    except Exception as exc:  # a stopped job: its committed output
                        log.debug("job %s: no result for %s: %r", self.name, sink, exc)
        self._note_rescales()
        self._close_sides()
        error = None if failure is None else f"{type(failure).__name__}: {failure}"
        self._update(JobEvent.of(EventKind.ENDED, state=state, error=error), state=state, error=error,
                     failure=None if failure is None else portable(failure), results=tuple(results.items()),
                     statistics=stats, ended_at=time.time())
        self._ended.set()

    def _keep_run_events(self, job: Job | None) -> tuple[str, ...]:
        """Store the events of the job's current run that the record lacks (its recoveries, slow steps,
        ...), so that the job's history keeps them after it ended and after this manager restarted;
        returns the run's events (none if its controller did not answer)."""
        try:
            events = job.status().events if job is not None else ()
        except Exception as exc:  # a recovery is replacing the controller: next time
            log.debug("job %s: no events from its run: %r", self.name, exc)
            return ()
        with self._lock:
            new = events[self._run_events:]
            if new:
                self._run_events = len(events)
                self._update(*(JobEvent.of(EventKind.RUN, run=self.record.restarts, text=e) for e in new))
        return events

    def _note_recoveries(self, events: tuple[str, ...], seen: int) -> int:
        recoveries = sum(1 for e in events if "recover" in e.lower())
        for _ in range(recoveries - seen):
            self._exporter.recovery()
        return max(recoveries, seen)

    def _note_checkpoints(self) -> None:
        storage = self.storage
        ids = storage.checkpoint_ids()
        newest = ids[-1] if ids else 0
        if newest > self._seen_checkpoint:
            try:
                manifest = storage.load(newest)
            except Exception:
                return  # not complete yet
            self._seen_checkpoint = newest
            size = dir_bytes(storage.fs, storage.chk_dir(newest))
            self._exporter.checkpoint(None, size, float(manifest.get("created", time.time())))

    def _note_rescales(self) -> None:
        with self._lock:
            for rid, handle in list(self._rescales.items()):
                progress = handle.progress()
                self._exporter.rescale(progress.operator, progress.bins_moved / progress.bins if progress.bins else 0.0)
                if handle.done():
                    del self._rescales[rid]
                    self._finish_rescale(rid, handle)

    def _note_autoscale(self) -> None:
        """The autoscaler's decisions become events and entries of the rescale history (with their reasons)."""
        scaler = self._job.autoscaler if self._job is not None else None
        if scaler is None:
            return
        new = scaler.events[self._seen_autoscale:]
        self._seen_autoscale += len(new)
        for event in new:
            d = event.decision
            ok = event.outcome.get("state") == RescaleState.DONE
            entry = RescaleRecord(
                f"auto-{uuid.uuid4().hex[:6]}", event.at, d.operator, d.current, d.target, event.strategy,
                RescaleOutcome.DONE if ok else RescaleOutcome.FAILED, error=event.outcome.get("error"),
                duration_s=event.outcome.get("elapsed_s"), bytes_moved=event.outcome.get("bytes_moved"),
                by="autoscale", reason=d.reason, target_rate=d.target_rate,
                true_rate_per_instance=d.true_rate_per_instance, predicted_duration_s=event.predicted_duration_s,
                predicted_max_latency_ms=event.predicted_max_latency_ms)
            parallelism = dict(self.record.parallelism)
            if ok:
                parallelism[d.operator] = d.target
            self._update(JobEvent.of(EventKind.AUTOSCALE, text=event.describe()),
                         rescales=(*self.record.rescales, entry), parallelism=tuple(sorted(parallelism.items())))

    def autoscale(self, enabled: bool, options: dict[str, Any]) -> dict[str, Any]:
        """Switch the job's autoscaler on (with ``options``) or off; kept across manager restarts."""
        job = self._running("autoscale")
        job.autoscale(enabled, **options)
        self._update(JobEvent.of(EventKind.AUTOSCALE_SWITCHED, enabled=enabled, options=dict(options)),
                     autoscale=tuple(sorted(options.items())) if enabled else None)
        return {"name": self.name, "autoscale": "on" if enabled else "off", "options": dict(options)}

    def _finish_rescale(self, rid: str, handle: Any) -> None:
        try:
            done = handle.result(0)
            outcome, error = RescaleOutcome.DONE, None
        except Exception as exc:
            done, outcome, error = handle.progress(), RescaleOutcome.FAILED, str(exc)
        entry = self._history(rid).replace(state=outcome, error=error, duration_s=done.elapsed_s,
                                           bytes_moved=done.bytes_moved, bins_moved=done.bins_moved,
                                           progress=plain(done))
        parallelism = dict(self.record.parallelism)
        if outcome is RescaleOutcome.DONE and entry.to is not None:
            parallelism[entry.operator] = entry.to
            self._exporter.rescale(entry.operator, 1.0, done.bytes_moved)
        rescales = tuple(entry if r.id == rid else r for r in self.record.rescales)
        self._update(JobEvent.of(EventKind.RESCALE_ENDED, operator=entry.operator, **{"from": entry.from_},
                                 to=entry.to, outcome=outcome, error=error),
                     rescales=rescales, parallelism=tuple(sorted(parallelism.items())))

    def _history(self, rid: str) -> RescaleRecord:
        for entry in self.record.rescales:
            if entry.id == rid:
                return entry
        raise ChirayError(f"job {self.name!r} has no rescale {rid!r}")

    # -- verbs -------------------------------------------------------------------------

    def _running(self, verb: str) -> Job:
        if self.record.terminal or self._job is None:
            raise ended_error(self.name, self.record.state, verb)
        return self._job

    def status(self) -> JobStatus:
        job = self._job
        live = job.status() if job is not None and not self.record.terminal else None
        run = tuple(JobEvent.of(EventKind.RUN, run=self.record.restarts, text=e)
                    for e in live.events[self._run_events:]) if live else ()
        history = (*self.record.events, *run)
        state = live.state if live is not None else self.record.state
        return JobStatus(self.name, state, live.finished_instances if live else (), tuple(str(e) for e in history),
                         self.record.failure or (ChirayError(self.record.error) if self.record.error else None),
                         history)

    def info(self) -> JobInfo:
        """A summary for listings: state, uptime, operators and parallelism, last checkpoint."""
        record = self.record
        job = self._job
        if job is not None:  # the deployed plan is the current one (a rescale step updates it)
            deployed = job.deployment.plan if job.deployment is not None else None
            plan = deployed if deployed is not None else job.plan
            operators = {n.name: n.parallelism for n in plan.graph.nodes.values()}
        else:  # stopped, cancelled or not deployed: as submitted, then as its completed rescales left it
            operators = dict(self._submitted_parallelism())
        operators.update(dict(record.parallelism))
        ids = self.storage.committed() if not record.terminal else self.storage.checkpoint_ids()
        last = CheckpointInfo(ids[-1], self.storage.chk_dir(ids[-1])) if ids else None
        return JobInfo(self.name, self.status().state, record.submitted_at, record.ended_at,
                       (record.ended_at or time.time()) - record.submitted_at, tuple(operators.items()),
                       record.restarts, record.error, record.checkpoint_dir, last, self._rate(),
                       sources=self._side_statuses())

    def _submitted_parallelism(self) -> dict[str, int]:
        """Each operator's parallelism in the submitted flow (unpickled once: it holds the user's code)."""
        if self._submitted is None:
            try:
                graph = cloudpickle.loads(self.record.flow).graph
                self._submitted = {n.name: n.parallelism for n in graph.nodes.values()}
            except Exception as exc:  # its code no longer imports here: the rescaled operators only
                log.warning("job %s: cannot read the submitted flow: %r", self.name, exc)
                self._submitted = {}
        return self._submitted

    def _rate(self) -> float | None:
        job = self._job
        if job is None or self.record.terminal:
            return None
        try:
            stats = job.statistics()
        except Exception:
            return None
        sources = {n.name for n in job.plan.graph.nodes.values() if n.kind is OperatorKind.SOURCE}
        out = sum(s.records_out for s in stats.instances if s.operator in sources)
        return out / max(time.time() - job.started_at, 1e-6)

    def host_pids(self) -> dict[int, int]:
        """Host id -> its process id, for operators and fault tests that kill a host as a crash would."""
        job = self._running("list the hosts of")
        hosts = job.topology.peers()
        return {host_id: ray.get(host.pid.remote(), timeout=30) for host_id, host in hosts.items()}

    def controller_pid(self) -> int | None:
        """The process id of the job controller where it runs in an actor of its own (None: it runs in a
        host's process, see ``JobConfig.controller_process``), for fault tests that kill it."""
        controller = self._running("find the controller of").topology.controller
        if controller is None or controller_host(controller) is not None:
            return None
        return ray.get(controller.pid.remote(), timeout=30)

    def statistics(self) -> Any:
        if self.record.terminal:
            if self.record.statistics is None:
                raise ChirayError(f"job {self.name!r} ended without statistics")
            return self.record.statistics
        return self._running("read statistics of").statistics()

    def metrics(self, timeout: float | None = 60.0) -> Any:
        return self._running("read metrics of").metrics(timeout)

    def run_control(self, op: Any, controller: str | None = None) -> Any:
        return self._running("run a control op on").run_control(op, controller)

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                knobs: dict[str, Any] | None = None) -> str:
        """Start a rescale; returns its id for progress and result."""
        return self._start_rescale(operator, parallelism, strategy, planner, None, knobs or {})

    def migrate(self, operator: str, assignment: list[int], strategy: str = "all_at_once",
                knobs: dict[str, Any] | None = None) -> str:
        """Start a migration (a new bin -> instance table); returns its id for progress and result."""
        return self._start_rescale(operator, None, strategy, "ssm", list(assignment), knobs or {})

    def _start_rescale(self, operator: str, parallelism: int | None, strategy: str, planner: str,
                       assignment: list[int] | None, knobs: dict[str, Any]) -> str:
        job = self._running("rescale")
        node = job.plan.graph.nodes.get(operator)
        before = dict(self.info().operators).get(operator, node.parallelism if node else None)
        if assignment is not None:
            handle = job.migrate(operator, assignment, strategy, **knobs)
        else:
            handle = job.rescale(operator, parallelism, strategy, planner, **knobs)  # type: ignore[arg-type]
        rid = uuid.uuid4().hex[:10]
        entry = RescaleRecord(rid, time.time(), operator, before, parallelism if parallelism is not None else before,
                              strategy, RescaleOutcome.RUNNING)
        with self._lock:
            self._rescales[rid] = handle
            self._update(JobEvent.of(EventKind.RESCALE_STARTED, operator=operator, **{"from": before},
                                     to=entry.to, strategy=strategy), rescales=(*self.record.rescales, entry))
        return rid

    def rescale_progress(self, rid: str) -> RescaleProgress:
        with self._lock:
            handle = self._rescales.get(rid)
        if handle is not None:
            return plain(handle.progress()).replace(id=rid, done=handle.done())
        entry = self._history(rid)
        base = entry.progress or RescaleProgress(entry.operator, entry.strategy, entry.state)
        return base.replace(id=rid, done=True, state=entry.state, from_=entry.from_, to=entry.to,
                            duration_s=entry.duration_s, error=entry.error, bytes_moved=entry.bytes_moved or 0,
                            bins_moved=entry.bins_moved or 0)

    def rescale_result(self, rid: str, timeout: float | None) -> RescaleProgress:
        with self._lock:
            handle = self._rescales.get(rid)
        if handle is not None:
            handle.result(timeout)  # raises TimeoutError / RescaleError
            self._note_rescales()
        progress = self.rescale_progress(rid)
        if progress.state is not RescaleOutcome.DONE:
            raise ChirayError(f"job {self.name!r}: rescale of {progress.operator!r} "
                              f"{progress.state.value}: {progress.error}")
        return progress

    def rescales(self) -> tuple[RescaleRecord, ...]:
        return tuple(r.without_progress() for r in self.record.rescales)

    def upgrade(self, operator: str, fn: Any, on_timer: Any = None, schema: Any = None, migrate_state: Any = None,
                canary: int = 0, rate_bound: float = 0.5, timeout: float | None = 60.0) -> UpgradeRecord:
        """``Job.upgrade``; the history entry joins the record (kept across manager restarts), whatever the outcome."""
        job = self._running("upgrade")
        before = len(job.upgrades())
        try:
            return job.upgrade(operator, fn, on_timer=on_timer, schema=schema, migrate_state=migrate_state,
                               canary=canary, rate_bound=rate_bound, timeout=timeout)
        finally:
            for entry in job.upgrades()[before:]:
                self._update(JobEvent.of(EventKind.UPGRADE, operator=entry.operator, old=entry.old_code,
                                         new=entry.new_code, outcome=entry.outcome, error=entry.error),
                             upgrades=(*self.record.upgrades, entry))

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        return tuple(self.record.upgrades)

    def checkpoint(self, timeout: float | None = 120.0) -> int:
        return self.checkpoint_info(timeout).id

    def checkpoint_info(self, timeout: float | None = 120.0) -> CheckpointInfo:
        """An aligned checkpoint now; returns its id, path and duration once durable."""
        taken = self._running("checkpoint").checkpoint_info(timeout)
        self._noted_checkpoint(taken)
        return taken

    def _noted_checkpoint(self, taken: CheckpointInfo) -> None:
        storage = self.storage
        path = storage.chk_dir(taken.id)
        self._exporter.checkpoint(taken.duration_s, dir_bytes(storage.fs, path), time.time())
        self._seen_checkpoint = max(self._seen_checkpoint, taken.id)
        self._update(JobEvent.of(EventKind.CHECKPOINT, id=taken.id, duration_s=taken.duration_s))

    def savepoint(self, dir: str | None = None, timeout: float | None = 120.0) -> str:
        return self.savepoint_info(dir, timeout).path

    def savepoint_info(self, dir: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """A checkpoint copied to ``dir`` (default ``<checkpoint_dir>/savepoints``), kept until deleted.

        Raises:
            ValueError: no ``dir`` for a job whose checkpoints go to a temporary directory (removed when the
                job is forgotten).
        """
        job = self._running("savepoint")
        if dir is None and self._temporary_dir() is not None:
            raise ValueError(f"job {self.name!r} keeps its checkpoints in a temporary directory, removed when it "
                             f"is forgotten: give savepoint a directory (or submit with checkpoint_dir=...)")
        taken = job.savepoint_info(dir, timeout)
        self._noted_checkpoint(taken)
        self._update(JobEvent.of(EventKind.SAVEPOINT, path=taken.path))
        return taken

    def savepoints(self) -> tuple[SavepointInfo, ...]:
        """Those under ``<checkpoint_dir>/savepoints`` and those the record's events name."""
        return find_savepoints(self.name, [savepoint_root(self.record.checkpoint_dir)], taken_in(self.record.events))

    def delete_savepoint(self, path: str) -> SavepointInfo:
        """Refused while a running detached job's record says it was restored from it; the record notes it."""
        deleted = delete_savepoint(self.name, path, self.savepoints(), running_restores())
        self._update(JobEvent.of(EventKind.SAVEPOINT_DELETED, path=deleted.path))
        return deleted

    def logs(self, lines: int = 100, since: Any = None) -> JobLogs:
        """This manager's lines, then those of the hosts and controller of the job's last run."""
        me = ray.get_runtime_context().get_actor_id()
        return job_logs({**({"manager": me} if me else {}), **(job_log_actors(self._ran) if self._ran else {})},
                        lines, since)

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> CheckpointInfo:
        """Graceful stop (``Job.stop``); the record notes the checkpoint, the results and the end."""
        with self._lock:
            job = self._running("stop")
            taken = job.stop(savepoint, timeout)
            self._noted_checkpoint(taken)
            self._keep_run_events(job)
            self._job = None
            self._close_sides()
            stats = job.statistics()
            results = {sink: job.result(sink) for sink in sink_names(job.plan.graph)}
            self._exporter.export(stats)
            self._note_rescales()
            self._update(JobEvent.of(EventKind.STOPPED, id=taken.id, savepoint=taken.path if savepoint else None),
                         state=JobState.FINISHED, statistics=stats, results=tuple(results.items()),
                         ended_at=time.time())
            self._ended.set()
            return taken

    def cancel(self) -> None:
        with self._lock:
            if self.record.terminal or self._job is None:
                return  # an ended job stays as it ended
            self._keep_run_events(self._job)
            self._job.cancel()
            self._job = None
            self._close_sides()
            self._update(JobEvent.of(EventKind.CANCELLED), state=JobState.CANCELLED, ended_at=time.time())
            self._ended.set()

    def wait(self, timeout: float | None = None) -> JobState:
        """Wait up to ``timeout`` s for the job to end; returns its state."""
        self._ended.wait(timeout)
        return self.record.state

    def failure(self) -> BaseException | None:
        """What made the job fail (its ``OperatorError`` where a user function raised)."""
        return self.record.failure

    def result(self, sink: str | None = None) -> Any:
        record = self.record
        if record.state is not JobState.FINISHED:
            raise ChirayError(f"job {self.name!r} is {record.state.value.lower()}: it has no result")
        results = dict(record.results)
        if sink is None:
            if len(results) != 1:
                raise ValueError(f"job {self.name!r} has sinks {sorted(results)}; name one")
            return next(iter(results.values()))
        if sink not in results:
            raise ValueError(f"job {self.name!r} has no sink {sink!r}; sinks: {sorted(results)}")
        return results[sink]

    def tail(self, sink: str | None = None, n: int = 10) -> Any:
        """The newest rows that reached ``sink`` (``Job.tail``)."""
        return self._running("tail").tail(sink, n)

    def forget(self) -> None:
        """Drop an ended job's record and the temporary checkpoint directory made for it (when no
        ``checkpoint_dir`` was given); the caller then removes the manager actor."""
        if not self.record.terminal:
            raise ChirayError(f"job {self.name!r} is {self.record.state.value.lower()}: stop or cancel it first")
        jobstore.delete(self.name)
        temporary = self._temporary_dir()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
