"""managerrescales.py: a job manager's rescales: the handles of those running and their history in the record.

A rescale (or migration) started through the manager gets an id and an
entry of the record's rescale history (``RescaleRecord``, ``RUNNING``);
the manager's watch thread exports its progress and, once it is done,
completes the entry and the record's parallelism. The autoscaler's
decisions become entries too, with their reasons. The handles belong to
this incarnation of the manager: after a restart, the history answers.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from ..errors import ChirayError
from .handle import RescaleControl
from .jobfiles import RescaleOutcome, plain
from .jobvalues import EventKind, JobEvent, RescaleProgress, RescaleRecord, RescaleState
from .managerrecord import RecordKeeper

if TYPE_CHECKING:
    from .autoscaler import AutoscaleEvent

__all__ = ["RescaleBook"]


class RescaleBook:
    """The rescales of one job: running handles by id, and their entries in the record.

    Who may touch it: the manager's verbs start rescales and read progress; its watch thread notes the
    ended ones (``note``) and the autoscaler's decisions (``note_autoscale``). ``running`` changes under
    the record's lock.

    Args:
        keeper: the job's record.
    """

    def __init__(self, keeper: RecordKeeper):
        self.keeper = keeper
        self.running: dict[str, RescaleControl] = {}  # rescale id -> its handle (this incarnation's)
        self.seen_autoscale = 0  # the running job's autoscaler's events already in the record

    @property
    def _name(self) -> str:
        return self.keeper.record.name

    def started(self, handle: RescaleControl, operator: str, before: int | None, to: int | None,
                strategy: str) -> str:
        """A rescale of ``operator`` from ``before`` to ``to`` instances started; its new id."""
        rid = uuid.uuid4().hex[:10]
        entry = RescaleRecord(rid, time.time(), operator, before, to, strategy, RescaleOutcome.RUNNING)
        keeper = self.keeper
        with keeper.lock:
            self.running[rid] = handle
            keeper.update(JobEvent.of(EventKind.RESCALE_STARTED, operator=operator, **{"from": before},
                                      to=entry.to, strategy=strategy), rescales=(*keeper.record.rescales, entry))
        return rid

    def note(self) -> None:
        """Export the running rescales' progress; complete the history entries of those that ended."""
        with self.keeper.lock:
            for rid, handle in list(self.running.items()):
                progress = handle.progress()
                self.keeper.exporter.rescale(progress.operator,
                                             progress.bins_moved / progress.bins if progress.bins else 0.0)
                if handle.done():
                    del self.running[rid]
                    self._finish(rid, handle)

    def _finish(self, rid: str, handle: RescaleControl) -> None:
        try:
            done = handle.result(0)
            outcome, error = RescaleOutcome.DONE, None
        except Exception as exc:
            done, outcome, error = handle.progress(), RescaleOutcome.FAILED, str(exc)
        entry = self.entry(rid).replace(state=outcome, error=error, duration_s=done.elapsed_s,
                                        bytes_moved=done.bytes_moved, bins_moved=done.bins_moved,
                                        progress=plain(done))
        record = self.keeper.record
        parallelism = dict(record.parallelism)
        if outcome is RescaleOutcome.DONE and entry.to is not None:
            parallelism[entry.operator] = entry.to
            self.keeper.exporter.rescale(entry.operator, 1.0, done.bytes_moved)
        rescales = tuple(entry if r.id == rid else r for r in record.rescales)
        self.keeper.update(JobEvent.of(EventKind.RESCALE_ENDED, operator=entry.operator, **{"from": entry.from_},
                                       to=entry.to, outcome=outcome, error=error),
                           rescales=rescales, parallelism=tuple(sorted(parallelism.items())))

    def entry(self, rid: str) -> RescaleRecord:
        """The history entry of rescale ``rid``."""
        for entry in self.keeper.record.rescales:
            if entry.id == rid:
                return entry
        raise ChirayError(f"job {self._name!r} has no rescale {rid!r}")

    def progress(self, rid: str) -> RescaleProgress:
        """Where rescale ``rid`` is: its handle's progress while this incarnation runs it, else its history's."""
        with self.keeper.lock:
            handle = self.running.get(rid)
        if handle is not None:
            return plain(handle.progress()).replace(id=rid, done=handle.done())
        entry = self.entry(rid)
        base = entry.progress or RescaleProgress(entry.operator, entry.strategy, entry.state)
        return base.replace(id=rid, done=True, state=entry.state, from_=entry.from_, to=entry.to,
                            duration_s=entry.duration_s, error=entry.error, bytes_moved=entry.bytes_moved or 0,
                            bins_moved=entry.bins_moved or 0)

    def result(self, rid: str, timeout: float | None) -> RescaleProgress:
        """Wait up to ``timeout`` s for rescale ``rid``; its final progress, or ``ChirayError`` unless it is done."""
        with self.keeper.lock:
            handle = self.running.get(rid)
        if handle is not None:
            handle.result(timeout)  # raises TimeoutError / RescaleError
            self.note()
        progress = self.progress(rid)
        if progress.state is not RescaleOutcome.DONE:
            raise ChirayError(f"job {self._name!r}: rescale of {progress.operator!r} "
                              f"{progress.state.value}: {progress.error}")
        return progress

    def note_autoscale(self, events: list[AutoscaleEvent]) -> None:
        """The autoscaler's decisions (its ``events``, the new ones) become events and entries of the rescale
        history (with their reasons)."""
        new = events[self.seen_autoscale:]
        self.seen_autoscale += len(new)
        for event in new:
            ok = event.outcome.get("state") == RescaleState.DONE
            parallelism = dict(self.keeper.record.parallelism)
            if ok:
                parallelism[event.decision.operator] = event.decision.target
            self.keeper.update(JobEvent.of(EventKind.AUTOSCALE, text=event.describe()),
                               rescales=(*self.keeper.record.rescales, _autoscaled(event, ok)),
                               parallelism=tuple(sorted(parallelism.items())))


def _autoscaled(event: AutoscaleEvent, ok: bool) -> RescaleRecord:
    """The history entry of one autoscaler decision (``ok``: its rescale is done)."""
    d, outcome = event.decision, event.outcome
    return RescaleRecord(
        f"auto-{uuid.uuid4().hex[:6]}", event.at, d.operator, d.current, d.target, event.strategy,
        RescaleOutcome.DONE if ok else RescaleOutcome.FAILED, error=outcome.get("error"),
        duration_s=outcome.get("elapsed_s"), bytes_moved=outcome.get("bytes_moved"),
        by="autoscale", reason=d.reason, target_rate=d.target_rate,
        true_rate_per_instance=d.true_rate_per_instance, predicted_duration_s=event.predicted_duration_s,
        predicted_max_latency_ms=event.predicted_max_latency_ms)

