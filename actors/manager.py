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
import tempfile
import threading
import time
import uuid
from typing import Any

import cloudpickle
import ray
import pyarrow.fs as pafs

from chiray.control.coordination import JobState
from chiray.operators.graph import OperatorKind

from . import jobstore
from .config import JobConfig
from .errors import ChirayError, JobCancelledError
from .job import Job, JobStatus
from .jobfiles import RescaleOutcome, committed_results, dir_bytes, interrupted, plain, recover_sinks
from .jobfiles import sink_names, with_parallelism
from .submit import submit
from .jobstore import JobRecord
from .metrics import MetricsExporter
from .restore import RestoreInfo
from .rescale import RescaleState
from .storage import CheckpointStorage

__all__ = ["JobManagerCore", "VERBS"]

log = logging.getLogger(__name__)

VERBS = frozenset({
    "status", "info", "statistics", "host_pids", "metrics", "rescale", "rescale_progress", "rescale_result", "rescales",
    "checkpoint", "savepoint", "stop", "autoscale", "cancel", "run_control", "wait", "result", "forget",
})
"""The manager methods a client may call (``JobManager.call``)."""

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
        self._rescales: dict[str, Any] = {}  # rescale id -> RescaleHandle (this incarnation's)
        self._exporter = MetricsExporter(name)
        self._seen_checkpoint = 0
        self._seen_autoscale = 0
        stored = jobstore.load(name) if reconstructed else None
        self._restarted = stored is not None
        if stored is not None:
            self.record = dataclasses.replace(stored, restarts=stored.restarts + 1)
        else:
            root = config.checkpoint_dir or tempfile.mkdtemp(prefix=f"chiray-{name}-")
            self.record = JobRecord(name, flow, config, root, restore_from).with_event("submitted")
        self._save()

    # -- record ----------------------------------------------------------------------

    def _save(self) -> None:
        jobstore.save(self.record)

    def _update(self, event: str | None = None, **changes: Any) -> None:
        with self._lock:
            record = dataclasses.replace(self.record, **changes) if changes else self.record
            self.record = record.with_event(event) if event else record
            self._save()

    @property
    def storage(self) -> CheckpointStorage:
        return CheckpointStorage(self.record.checkpoint_dir)

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
            self._update(f"failed to start: {exc}", state="FAILED", error=str(exc), ended_at=time.time())
            self._ended.set()
        finally:
            self._ready.set()
        if self._job is not None:
            self._watch()

    def _deploy(self) -> None:
        record = self.record
        flow = with_parallelism(cloudpickle.loads(record.flow), dict(record.parallelism))
        restore_from = record.restore_from
        if self._restarted:
            storage = self.storage
            latest = storage.latest()
            restore = RestoreInfo(storage, latest) if latest is not None else None
            recover_sinks(flow, storage, restore)
            if restore is not None:
                restore_from = record.checkpoint_dir
            where = f"checkpoint {restore.checkpoint_id}" if restore is not None else "the start"
            self._exporter.recovery()
            self._update(f"recovery: the job manager restarted (restart {record.restarts}); "
                         f"the job rolled back to {where}", state="RUNNING",
                         rescales=tuple(interrupted(r) for r in record.rescales))
        config = dataclasses.replace(record.config, detached=False, name=None,
                                     checkpoint_dir=record.checkpoint_dir)
        self._job = submit(flow, config=config, restore_from=restore_from)
        self._seen_checkpoint = max(self.storage.checkpoint_ids(), default=0)
        self._seen_autoscale = 0
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
                ended = self._poll_end(job)
            if ended:
                return
            interval = self.record.config.metrics_interval_s
            if interval is not None:
                try:
                    self._exporter.export(job.statistics())
                    seen_recoveries = self._note_recoveries(job, seen_recoveries)
                    self._note_checkpoints()
                    if time.monotonic() - last_sizes > STATE_SIZE_INTERVAL_S:
                        last_sizes = time.monotonic()
                        self._exporter.state_sizes(job.metrics(timeout=10).instances)
                except Exception as exc:  # a recovery or rescale is swapping actors: try again next time
                    log.debug("job %s: metrics export skipped: %r", self.name, exc)
            self._note_rescales()
            self._note_autoscale()
            self._ended.wait(interval or POLL_S)

    def _poll_end(self, job: Job) -> bool:
        try:
            job.wait(timeout=0)
        except TimeoutError:
            return False
        except JobCancelledError:
            self._end("CANCELLED", None)
            return True
        except Exception as exc:
            self._end("FAILED", f"{type(exc).__name__}: {exc}")
            return True
        self._end("FINISHED", None)
        return True

    def _end(self, state: str, error: str | None, event: str | None = None) -> None:
        """Record the job's end (its results and last statistics if it finished) and wake waiters."""
        job = self._job
        results: dict[str, Any] = {}
        stats = None
        if job is not None:
            try:
                stats = job.statistics()
                self._exporter.export(stats)
            except Exception:
                stats = None
            if JobState(state) is JobState.FINISHED:
                for sink in sink_names(job.plan.graph):
                    try:
                        results[sink] = job.result(sink)
                    except Exception as exc:  # a stopped job: its committed output
                        log.debug("job %s: no result for %s: %r", self.name, sink, exc)
        self._note_rescales()
        self._update(event or f"job {state.lower()}", state=state, error=error, results=tuple(results.items()),
                     statistics=stats, ended_at=time.time())
        self._ended.set()

    def _note_recoveries(self, job: Job, seen: int) -> int:
        recoveries = sum(1 for e in job.status().events if "recover" in e.lower())
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
                bins = progress.get("bins") or 0
                self._exporter.rescale(progress["operator"], progress["bins_moved"] / bins if bins else 0.0)
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
            entry = {"id": f"auto-{uuid.uuid4().hex[:6]}", "started_at": event.at, "operator": d.operator,
                     "from": d.current, "to": d.target, "strategy": event.strategy,
                     "state": (RescaleOutcome.DONE if ok else RescaleOutcome.FAILED).value,
                     "error": event.outcome.get("error"), "duration_s": event.outcome.get("elapsed_s"),
                     "bytes_moved": event.outcome.get("bytes_moved"), "by": "autoscale", "reason": d.reason,
                     "target_rate": d.target_rate, "true_rate_per_instance": d.true_rate_per_instance,
                     "predicted_duration_s": event.predicted_duration_s,
                     "predicted_max_latency_ms": event.predicted_max_latency_ms}
            parallelism = dict(self.record.parallelism)
            if entry["state"] == RescaleOutcome.DONE:
                parallelism[d.operator] = d.target
            self._update(event.describe(), rescales=(*self.record.rescales, entry),
                         parallelism=tuple(sorted(parallelism.items())))

    def autoscale(self, enabled: bool, options: dict[str, Any]) -> dict[str, Any]:
        """Switch the job's autoscaler on (with ``options``) or off; kept across manager restarts."""
        job = self._running("autoscale")
        job.autoscale(enabled, **options)
        self._update(f"autoscale {'on ' + str(options) if enabled else 'off'}",
                     autoscale=tuple(sorted(options.items())) if enabled else None)
        return {"name": self.name, "autoscale": "on" if enabled else "off", "options": dict(options)}

    def _finish_rescale(self, rid: str, handle: Any) -> None:
        try:
            done = handle.result(0)
            outcome, error = RescaleOutcome.DONE, None
        except Exception as exc:
            done, outcome, error = handle.progress(), RescaleOutcome.FAILED, str(exc)
        entry = {**self._history(rid), "state": outcome.value, "error": error, "duration_s": done["elapsed_s"],
                 "bytes_moved": done["bytes_moved"], "bins_moved": done["bins_moved"], "progress": plain(done)}
        parallelism = dict(self.record.parallelism)
        if outcome is RescaleOutcome.DONE:
            parallelism[entry["operator"]] = entry["to"]
            self._exporter.rescale(entry["operator"], 1.0, done["bytes_moved"])
        rescales = tuple(entry if r["id"] == rid else r for r in self.record.rescales)
        self._update(f"rescale {entry['operator']} {entry['from']} -> {entry['to']} {outcome}"
                     f"{f': {error}' if error else ''}", rescales=rescales,
                     parallelism=tuple(sorted(parallelism.items())))

    def _history(self, rid: str) -> dict[str, Any]:
        for entry in self.record.rescales:
            if entry["id"] == rid:
                return dict(entry)
        raise ChirayError(f"job {self.name!r} has no rescale {rid!r}")

    # -- verbs -------------------------------------------------------------------------

    def _running(self, verb: str) -> Job:
        if self.record.terminal or self._job is None:
            raise ChirayError(f"job {self.name!r} is {self.record.state.lower()}: cannot {verb} it")
        return self._job

    def status(self) -> JobStatus:
        job = self._job
        live = job.status() if job is not None and not self.record.terminal else None
        events = self.record.events + (tuple(f"run {self.record.restarts}: {e}" for e in live.events) if live else ())
        state = JobState(live.state.value if live is not None else self.record.state)
        return JobStatus(self.name, state, live.finished_instances if live else (), events,
                         ChirayError(self.record.error) if self.record.error else None)

    def info(self) -> dict[str, Any]:
        """A summary for listings: state, uptime, operators and parallelism, last checkpoint."""
        record = self.record
        job = self._job
        operators: dict[str, int] = {}
        if job is not None:  # the deployed plan is the current one (a rescale step updates it)
            deployed = job.deployment.plan if job.deployment is not None else None
            plan = deployed if deployed is not None else job.plan
            operators = {n.name: n.parallelism for n in plan.graph.nodes.values()}
        operators.update(dict(record.parallelism))
        ids = self.storage.committed() if not record.terminal else self.storage.checkpoint_ids()
        last = ids[-1] if ids else None
        return {"name": self.name, "state": self.status().state.value, "submitted_at": record.submitted_at,
                "ended_at": record.ended_at, "uptime_s": (record.ended_at or time.time()) - record.submitted_at,
                "operators": operators, "restarts": record.restarts, "error": record.error,
                "checkpoint_dir": record.checkpoint_dir,
                "last_checkpoint": None if last is None else {"id": last, "path": self.storage.chk_dir(last)},
                "records_per_second": self._rate()}

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

    def rescale(self, operator: str, parallelism: int | None, strategy: str, planner: str,
                assignment: list[int] | None, knobs: dict[str, Any]) -> str:
        """Start a rescale (``assignment`` given: a migration); returns its id for progress and result."""
        job = self._running("rescale")
        node = job.plan.graph.nodes.get(operator)
        before = self.info()["operators"].get(operator, node.parallelism if node else None)
        if assignment is not None:
            handle = job.migrate(operator, assignment, strategy, **knobs)
        else:
            handle = job.rescale(operator, parallelism, strategy, planner, **knobs)  # type: ignore[arg-type]
        rid = uuid.uuid4().hex[:10]
        entry = {"id": rid, "started_at": time.time(), "operator": operator, "from": before,
                 "to": parallelism if parallelism is not None else before, "strategy": strategy,
                 "state": RescaleOutcome.RUNNING.value}
        with self._lock:
            self._rescales[rid] = handle
            self._update(f"rescale {operator} {before} -> {entry['to']} started ({strategy})",
                         rescales=(*self.record.rescales, entry))
        return rid

    def rescale_progress(self, rid: str) -> dict[str, Any]:
        with self._lock:
            handle = self._rescales.get(rid)
        if handle is not None:
            return {**plain(handle.progress()), "id": rid, "done": handle.done()}
        entry = self._history(rid)
        return {**entry.get("progress", {}), **entry, "done": True}

    def rescale_result(self, rid: str, timeout: float | None) -> dict[str, Any]:
        with self._lock:
            handle = self._rescales.get(rid)
        if handle is not None:
            handle.result(timeout)  # raises TimeoutError / RescaleError
            self._note_rescales()
        progress = self.rescale_progress(rid)
        if progress["state"] != RescaleOutcome.DONE:
            raise ChirayError(f"job {self.name!r}: rescale of {progress['operator']!r} "
                              f"{progress['state']}: {progress.get('error')}")
        return progress

    def rescales(self) -> tuple[dict, ...]:
        return tuple({k: v for k, v in r.items() if k != "progress"} for r in self.record.rescales)

    def checkpoint(self, timeout: float | None = 120.0) -> dict[str, Any]:
        """An aligned checkpoint now; returns its id, path and duration once durable."""
        job = self._running("checkpoint")
        started = time.monotonic()
        checkpoint_id = job.checkpoint(timeout)
        duration = time.monotonic() - started
        storage = self.storage
        path = storage.chk_dir(checkpoint_id)
        self._exporter.checkpoint(duration, dir_bytes(storage.fs, path), time.time())
        self._seen_checkpoint = max(self._seen_checkpoint, checkpoint_id)
        self._update(f"checkpoint {checkpoint_id} ({duration:.2f} s)")
        return {"id": checkpoint_id, "path": path, "duration_s": duration}

    def savepoint(self, directory: str | None = None, timeout: float | None = 120.0) -> dict[str, Any]:
        """A checkpoint copied to ``directory`` (default ``<checkpoint_dir>/savepoints``), kept until deleted."""
        taken = self.checkpoint(timeout)
        target_root = directory or f"{self.record.checkpoint_dir.rstrip('/')}/savepoints"
        target = CheckpointStorage(target_root)
        src = self.storage
        target.fs.create_dir(target.chk_dir(taken["id"]), recursive=True)
        pafs.copy_files(src.chk_dir(taken["id"]), target.chk_dir(taken["id"]), source_filesystem=src.fs,
                        destination_filesystem=target.fs)
        target.load(taken["id"])  # raises if the copy is incomplete
        path = target.chk_dir(taken["id"]) if "://" not in target_root else \
            f"{target_root.rstrip('/')}/chk-{taken['id']:06d}"
        self._update(f"savepoint {path}")
        return {**taken, "path": path, "root": target_root}

    def stop(self, savepoint: str | None = None, timeout: float | None = 120.0) -> dict[str, Any]:
        """Graceful stop: a final checkpoint (a savepoint if asked), its sink output committed, later
        output discarded, the hosts stopped; the job ends as finished."""
        with self._lock:
            job = self._running("stop")
            taken = self.savepoint(savepoint, timeout) if savepoint else self.checkpoint(timeout)
            stats = job.statistics()
            job.cancel()
            storage = self.storage
            recover_sinks(cloudpickle.loads(self.record.flow), storage,
                          RestoreInfo(storage, storage.load(taken["id"])))
            self._job = None
            results = committed_results(self.record.flow, storage)
            self._exporter.export(stats)
            self._note_rescales()
            self._update(f"stopped at checkpoint {taken['id']}" + (f" (savepoint {taken['path']})" if savepoint
                                                                   else ""),
                         state="FINISHED", statistics=stats, results=tuple(results.items()), ended_at=time.time())
            self._ended.set()
            return taken

    def cancel(self) -> None:
        with self._lock:
            job = self._running("cancel")
            job.cancel()
            self._job = None
            self._update("cancelled", state="CANCELLED", ended_at=time.time())
            self._ended.set()

    def wait(self, timeout: float | None) -> str:
        """Wait up to ``timeout`` s for the job to end; returns its state."""
        self._ended.wait(timeout)
        return self.record.state

    def result(self, sink: str | None = None) -> Any:
        record = self.record
        if JobState(record.state) is not JobState.FINISHED:
            raise ChirayError(f"job {self.name!r} is {record.state.lower()}: it has no result")
        results = dict(record.results)
        if sink is None:
            if len(results) != 1:
                raise ValueError(f"job {self.name!r} has sinks {sorted(results)}; name one")
            return next(iter(results.values()))
        if sink not in results:
            raise ValueError(f"job {self.name!r} has no sink {sink!r}; sinks: {sorted(results)}")
        return results[sink]

    def forget(self) -> None:
        """Drop a finished job's record; the caller then removes the manager actor."""
        if not self.record.terminal:
            raise ChirayError(f"job {self.name!r} is {self.record.state.lower()}: stop or cancel it first")
        jobstore.delete(self.name)
