"""jobchanges.py: the changes made to a running job through one driver handle: its rescales and its upgrades.

``ChangeLog`` is the history behind ``Job.rescales()`` and ``Job.upgrades()``: each rescale or migration as it
was started (with its handle, whose progress gives the outcome once it ended) and each upgrade's
``UpgradeRecord``, refused and failed ones included.
"""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa

from chiray.operators.graph import PhysicalPlan

from .jobvalues import RescaleOutcome, RescaleRecord, UpgradeOutcome, UpgradeRecord
from .rescale import RescaleHandle
from .upgrader import CanaryRolledBackError, RunOp, StateMigration, UpgradeError, run_upgrade

__all__ = ["ChangeLog"]


def _history_id() -> str:
    return uuid.uuid4().hex[:10]


class ChangeLog:
    """The rescales and upgrades started through one handle, oldest first.

    The job's thread and the autoscaler's add entries; ``_lock`` guards both lists. ``forget_rescales()``
    drops the rescales (``Job.forget``); the upgrades stay.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rescales: list[tuple[RescaleRecord, RescaleHandle]] = []
        self._upgrades: list[UpgradeRecord] = []

    # -- rescales -------------------------------------------------------------------------------

    def note_rescale(self, handle: RescaleHandle, before: int | None, after: int | None,
                     strategy: str) -> RescaleHandle:
        """Keep the rescale ``handle`` runs (``before`` -> ``after`` instances); returns ``handle``."""
        entry = RescaleRecord(_history_id(), time.time(), handle.operator, before, after, strategy,
                              RescaleOutcome.RUNNING)
        with self._lock:
            self._rescales.append((entry, handle))
        return handle

    def running_rescales(self) -> list[RescaleHandle]:
        """The handles of the rescales that have not ended."""
        with self._lock:
            return [handle for _, handle in self._rescales if not handle.done()]

    def rescales(self) -> tuple[RescaleRecord, ...]:
        """Each rescale's entry; an ended one's with its outcome, duration and what it moved."""
        with self._lock:
            started = list(self._rescales)
        return tuple(_with_outcome(entry, handle) for entry, handle in started)

    def forget_rescales(self) -> None:
        with self._lock:
            self._rescales = []

    # -- upgrades -------------------------------------------------------------------------------

    def upgrade(self, run_op: RunOp, plan: PhysicalPlan, operator: str, fn: object, on_timer: object,
                schema: pa.Schema | None, migrate_state: StateMigration | None, canary: int, rate_bound: float,
                timeout: float | None) -> UpgradeRecord:
        """``upgrader.run_upgrade`` with these arguments; its entry is kept whatever the outcome (a refused or
        failed upgrade's says why).

        Raises:
            UpgradeError, CanaryRolledBackError, and what its ops raised: as ``run_upgrade``.
        """
        started = time.time()
        try:
            record = run_upgrade(run_op, plan, operator, fn, on_timer, schema, migrate_state, canary, rate_bound,
                                 timeout)
        except CanaryRolledBackError as exc:
            self._add_upgrade(exc.record)
            raise
        except Exception as exc:
            outcome = UpgradeOutcome.REFUSED if isinstance(exc, UpgradeError) else UpgradeOutcome.FAILED
            self._add_upgrade(UpgradeRecord(_history_id(), started, operator, "-", "-", outcome,
                                            time.time() - started, canary=canary, error=str(exc)))
            raise
        self._add_upgrade(record)
        return record

    def upgrades(self) -> tuple[UpgradeRecord, ...]:
        """Each upgrade's entry."""
        with self._lock:
            return tuple(self._upgrades)

    def _add_upgrade(self, record: UpgradeRecord) -> None:
        with self._lock:
            self._upgrades.append(record)


def _with_outcome(entry: RescaleRecord, handle: RescaleHandle) -> RescaleRecord:
    """``entry`` as it stands: as started while ``handle`` runs, else with how it ended."""
    if not handle.done():
        return entry
    progress = handle.progress()
    try:
        handle.result(0)
        outcome, error = RescaleOutcome.DONE, None
    except Exception as exc:
        outcome, error = RescaleOutcome.FAILED, str(exc)
    return entry.replace(state=outcome, error=error, duration_s=progress.elapsed_s,
                         bytes_moved=progress.bytes_moved, bins_moved=progress.bins_moved)
