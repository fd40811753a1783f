"""managerrecord.py: a job manager's bookkeeping of its job's record (``jobstore.JobRecord``) and the metrics
that follow it.

The manager changes the record only through ``RecordKeeper.update``, which
stores it at once (a restarted manager reloads what was stored last), and
folds in what the running job tells: the events of its run, the checkpoints
that completed, the recoveries it went through.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from chiray.control.coordination import JobState

from . import jobstore
from .jobfiles import dir_bytes, interrupted, recover_sinks
from .jobstore import JobRecord, RecordChanges
from .jobvalues import CheckpointInfo, EventKind, JobEvent
from .metrics import MetricsExporter
from ..runtime.restore import RestoreInfo
from ..runtime.storage import CheckpointStorage

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from chiray.operators.graph import LogicalGraph

    from .job import Job, JobStatus

__all__ = ["RecordKeeper"]

log = logging.getLogger(__name__)

STATE_SIZE_INTERVAL_S = 10.0
"""How often the metrics read the keyed state sizes (a ``Monitor`` op on every instance)."""


class RecordKeeper:
    """The record of one detached job, kept current and stored by its manager.

    Who may touch it: the manager's threads, each change under ``lock`` (reentrant; the manager holds it
    around several calls to make them one step). ``record`` is replaced, never changed in place.

    Attributes:
        record: the job's record as stored last.
        lock: held for every change of the record.
        exporter: the job's metrics, which follow the record's state, checkpoints and recoveries.
        run_events: how many of the running job's run's events the record holds.
        seen_checkpoint: the newest checkpoint the metrics counted.
    """

    def __init__(self, record: JobRecord, exporter: MetricsExporter):
        self.record = record
        self.lock = threading.RLock()
        self.exporter = exporter
        self.run_events = 0
        self.seen_checkpoint = 0
        self._recoveries = 0  # the recoveries among the run's events that the metrics counted
        self._sizes_at = 0.0  # monotonic time the state sizes were exported last

    def save(self) -> None:
        jobstore.save(self.record)

    def update(self, *events: JobEvent, **changes: Unpack[RecordChanges]) -> None:
        """Change the record (and add ``events``) and store it."""
        with self.lock:
            record = dataclasses.replace(self.record, **changes) if changes else self.record
            self.record = dataclasses.replace(record, events=(*record.events, *events)) if events else record
            self.save()
        if "state" in changes:
            self.exporter.job_state(changes["state"])

    @property
    def storage(self) -> CheckpointStorage:
        return CheckpointStorage(self.record.checkpoint_dir)

    def temporary_dir(self) -> str | None:
        """The checkpoint directory the manager made for the job (none was given): ``forget`` removes it."""
        return self.record.checkpoint_dir if self.record.config.checkpoint_dir is None else None

    def new_run(self) -> None:
        """A run of the job started: none of its events are in the record yet; the checkpoints before it count."""
        self.seen_checkpoint = max(self.storage.checkpoint_ids(), default=0)
        self.run_events = 0

    def keep_run_events(self, job: Job | None) -> tuple[str, ...]:
        """Store the events of the job's current run that the record lacks (its recoveries, slow steps,
        ...), so that the job's history keeps them after it ended and after the manager restarted;
        returns the run's events (none if its controller did not answer)."""
        try:
            events = job.status().events if job is not None else ()
        except Exception as exc:  # a recovery is replacing the controller: next time
            log.debug("job %s: no events from its run: %r", self.record.name, exc)
            return ()
        with self.lock:
            new = events[self.run_events:]
            if new:
                self.run_events = len(events)
                self.update(*(JobEvent.of(EventKind.RUN, run=self.record.restarts, text=e) for e in new))
        return events

    def pending_run_events(self, events: tuple[str, ...]) -> tuple[JobEvent, ...]:
        """The run's ``events`` that the record does not hold yet, as ``RUN`` events."""
        return tuple(JobEvent.of(EventKind.RUN, run=self.record.restarts, text=e) for e in events[self.run_events:])

    def roll_back(self, graph: LogicalGraph, cause: str | None, restore_from: str | None) -> str | None:
        """Before the job runs again (``cause``: why; ``None``: its manager restarted): the sinks of ``graph``
        commit the last checkpoint and discard later output, and the record says where the job starts.

        Returns:
            What to restore from: the job's own checkpoints, else ``restore_from``.
        """
        record = self.record
        storage = self.storage
        latest = storage.latest()
        restore = RestoreInfo(storage, latest) if latest is not None else None
        recover_sinks(graph, storage, restore, record.config.run_id or "")
        if restore is not None:
            restore_from = record.checkpoint_dir
        where = (f"checkpoint {restore.checkpoint_id}" if restore is not None else
                 f"the restore point {restore_from}" if restore_from is not None else "the start")
        self.exporter.recovery()
        event = (JobEvent.of(EventKind.RECOVERY, restart=record.restarts, where=where) if cause is None else
                 JobEvent.of(EventKind.SOURCE_RECOVERY, cause=cause, where=where))
        self.update(event, state=JobState.RUNNING, rescales=tuple(interrupted(r) for r in record.rescales))
        return restore_from

    def export_metrics(self, job: Job, events: tuple[str, ...], status: Callable[[], JobStatus]) -> None:
        """One round of the running job's metrics (``events``: its run's; ``status``: the job's status now)."""
        try:
            self.exporter.export(job.statistics())
            self.exporter.job_state(status().state)  # RECOVERING shows only here
            self._note_recoveries(events)
            self.note_checkpoints()
            if time.monotonic() - self._sizes_at > STATE_SIZE_INTERVAL_S:
                self._sizes_at = time.monotonic()
                self.exporter.state_sizes(job.metrics(timeout=10).instances)
        except Exception as exc:  # a recovery or rescale is swapping actors: try again next time
            log.debug("job %s: metrics export skipped: %r", self.record.name, exc)

    def _note_recoveries(self, events: tuple[str, ...]) -> None:
        """Count the recoveries among the run's ``events`` that were not counted yet."""
        recoveries = sum(1 for e in events if "recover" in e.lower())
        for _ in range(recoveries - self._recoveries):
            self.exporter.recovery()
        self._recoveries = max(recoveries, self._recoveries)

    def note_checkpoints(self) -> None:
        """Count the newest checkpoint on storage, once it is complete."""
        storage = self.storage
        ids = storage.checkpoint_ids()
        newest = ids[-1] if ids else 0
        if newest > self.seen_checkpoint:
            try:
                manifest = storage.load(newest)
            except Exception:
                return  # not complete yet
            self.seen_checkpoint = newest
            size = dir_bytes(storage.fs, storage.chk_dir(newest))
            self.exporter.checkpoint(None, size, float(manifest.get("created", time.time())))

    def noted_checkpoint(self, taken: CheckpointInfo) -> None:
        """A checkpoint the manager asked for completed: counted, and an event of the record."""
        storage = self.storage
        path = storage.chk_dir(taken.id)
        self.exporter.checkpoint(taken.duration_s, dir_bytes(storage.fs, path), time.time())
        self.seen_checkpoint = max(self.seen_checkpoint, taken.id)
        self.update(JobEvent.of(EventKind.CHECKPOINT, id=taken.id, duration_s=taken.duration_s))
