"""units.py: the batch coordinator's decisions: where each unit goes, which to compute, which attempt wins.

A *unit* is one ``(epoch, partition)`` of a Spark DataFrame (a batch
DataFrame has the single epoch 0); source split ``p`` reads unit ``(0, p)``.
The reader of a unit, inside the host process that runs its source
instance, registers a :class:`~messages.Destination` here; Spark tasks ask
for it (``route``) and push their batches straight to it, where they are
staged per attempt (``staging.py``). When Spark reports the job of a unit
successful, the attempt it returned a result for is committed: this
directory decides it and sends the reader a :class:`~messages.Commit`. The
data never comes here.

Credit: Spark computes at most ``max_units`` units ahead of the dataflow
(units running in Spark plus committed and not yet read). A unit a source
instance is waiting for (``want``) is always launched, so the window never
deadlocks; the bound on units held in readers is ``max_units`` plus the
number of source instances. A source opens its next ``max_units`` splits'
readers early (``Source.read_ahead``), so the units credit allows are the
ones whose readers are open. A unit's first computation may start before its
reader registered (at submit, while the hosts start): its tasks read a few
batches ahead and then wait for the route. A unit computed again waits for a
registered reader instead: a restored instance may be far from it, and its
tasks would hold Spark's task slots meanwhile.

Replay: a unit is computed again by Spark, from the DataFrame's lineage,
when a new reader registers for it (a restored source instance whose
checkpointed offset says it was not taken, or a host that died holding it),
or when its pushes or its commit found the reader gone.

Lifecycle of a unit::

    IDLE --launch--> RUNNING --job done--> COMMITTED --taken--> DELIVERED
      ^  ^              |  |   (Spark job failed)                  |
      |  |              |  +--> FAILED                             |
      |  +-- reader gone / new reader registers --+                |
      +------------------ new reader registers (replay) -----------+

Only the owning actor (``coordinator.UnitCoordinator``) touches a
:class:`UnitDirectory`; it is plain Python so that its rules are
unit-tested without Ray or Spark.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Sequence
from typing import Any

from chiray.operators.errors import ChirayError

from .messages import Commit, Destination, Fail, Forward

__all__ = ["WAIT", "BufferStatistics", "SparkUnitFailed", "Unit", "UnitDirectory", "UnitStatus"]

Unit = tuple[int, int]  # (epoch, partition)

WAIT = "wait"
"""``route``'s answer while the unit's reader has not registered yet."""


class SparkUnitFailed(ChirayError, RuntimeError):
    """Spark could not compute a unit (its job failed); the message carries Spark's error."""


class UnitStatus(enum.Enum):
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    COMMITTED = "COMMITTED"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


@dataclasses.dataclass(frozen=True, slots=True)
class BufferStatistics:
    """A snapshot of a bridged DataFrame's hand-off.

    Attributes:
        max_units: the credit window, in units.
        buffered_units: units running in Spark or committed and not yet read.
        peak_buffered_units: the most ``buffered_units`` ever was.
        buffered_rows: rows of committed units not yet read (held by readers).
        peak_buffered_rows: the most ``buffered_rows`` ever was.
        committed_units: units committed so far (a replayed unit counts again).
        delivered_rows: rows source instances read.
        delivered_bytes: Arrow IPC bytes source instances read (pushed to their hosts).
        discarded_attempts: attempts whose staged data readers dropped
            (failed, retried, speculative).
        launches: Spark launches asked for (each covers one or more units).
        relaunches: units computed again (a replay, or their reader went away).
        row_bytes_received: bytes of row data in the calls the coordinator
            received: 0, as every batch goes straight to a reader's host.
    """

    max_units: int
    buffered_units: int
    peak_buffered_units: int
    buffered_rows: int
    peak_buffered_rows: int
    committed_units: int
    delivered_rows: int
    delivered_bytes: int
    discarded_attempts: int
    launches: int
    relaunches: int
    row_bytes_received: int


@dataclasses.dataclass(slots=True)
class _UnitState:
    status: UnitStatus = UnitStatus.IDLE
    generation: int = -1
    wanted: bool = False
    destination: Destination | None = None
    rows: int = 0
    launched: int = 0
    error: str | None = None


class UnitDirectory:
    """Destinations, launches, commits and credit for the units of one bridged DataFrame.

    Args:
        units: every unit, in the order Spark should compute them.
        max_units: the credit window (units ahead of the dataflow), >= 1.
    """

    def __init__(self, units: Sequence[Unit], max_units: int) -> None:
        if max_units < 1:
            raise ValueError(f"from_spark: max_units must be >= 1, got {max_units}")
        self.max_units = max_units
        self._order: list[Unit] = [(int(u[0]), int(u[1])) for u in units]
        self._units: dict[Unit, _UnitState] = {u: _UnitState() for u in self._order}
        self._generation = 0
        self._peak_units = self._rows = self._peak_rows = 0
        self._committed = self._delivered_rows = self._delivered_bytes = 0
        self._discarded = self._relaunches = self._received = 0

    def _state(self, unit: Unit) -> _UnitState:
        try:
            return self._units[(int(unit[0]), int(unit[1]))]
        except KeyError:
            raise KeyError(f"from_spark: unknown unit (epoch, partition) = {tuple(unit)}") from None

    def _buffered_units(self) -> int:
        return sum(s.status in (UnitStatus.RUNNING, UnitStatus.COMMITTED) for s in self._units.values())

    def _note_peak(self) -> None:
        self._peak_units = max(self._peak_units, self._buffered_units())
        self._peak_rows = max(self._peak_rows, self._rows)

    def _reset(self, state: _UnitState, destination: Destination | None) -> None:
        """Back to IDLE: what the unit had in Spark or at its reader is lost; compute it again."""
        if state.status is UnitStatus.COMMITTED:
            self._rows -= state.rows
        state.status, state.destination, state.rows = UnitStatus.IDLE, destination, 0

    # -- the reader side -----------------------------------------------------------

    def register(self, unit: Unit, destination: Destination) -> list[Forward]:
        """A reader of ``unit`` was opened at ``destination`` (again: idempotent for one token)."""
        state = self._state(unit)
        old = state.destination
        if old is None or old.token != destination.token:
            moved = old is not None  # else: launched before its reader registered; its tasks wait for this
            if moved and state.status in (UnitStatus.RUNNING, UnitStatus.COMMITTED, UnitStatus.DELIVERED):
                self._reset(state, destination)  # its data was (or went) elsewhere: a replay
            state.destination = destination
        if state.status is UnitStatus.FAILED:
            return [Forward(destination, Fail(destination.token, self._failure(unit, state)), tuple(unit))]
        return []

    def want(self, unit: Unit, destination: Destination) -> list[Forward]:
        """The reader at ``destination`` waits for ``unit`` now: launch it next, credit or not."""
        forwards = self.register(unit, destination)
        self._state(unit).wanted = True
        return forwards

    def taken(self, unit: Unit, token: str, rows: int, nbytes: int) -> None:
        """The reader ``token`` read the committed unit (``rows`` rows, ``nbytes`` bytes): credit is free."""
        state = self._state(unit)
        if state.status is not UnitStatus.COMMITTED or state.destination is None:
            return
        if state.destination.token != token:
            return  # a reader that was replaced meanwhile
        self._rows -= state.rows
        self._delivered_rows += rows
        self._delivered_bytes += nbytes
        state.status, state.wanted = UnitStatus.DELIVERED, False

    # -- the driver (job launcher) side ----------------------------------------------

    def launch(self) -> tuple[int, list[Unit]]:
        """Units to compute now, as ``(generation, units)``; marks them RUNNING.

        Wanted units first (always), then the next idle units while the credit
        window has room (a unit computed before needs its reader registered).
        """
        idle = [u for u in self._order if self._launchable(self._units[u])]
        chosen = [u for u in idle if self._units[u].wanted]
        room = self.max_units - self._buffered_units() - len(chosen)
        chosen += [u for u in idle if not self._units[u].wanted][: max(room, 0)]
        if not chosen:
            return self._generation, []
        self._generation += 1
        for u in chosen:
            state = self._units[u]
            self._relaunches += state.launched > 0
            state.launched += 1
            state.status, state.generation = UnitStatus.RUNNING, self._generation
        self._note_peak()
        return self._generation, chosen

    @staticmethod
    def _launchable(state: _UnitState) -> bool:
        return state.status is UnitStatus.IDLE and (state.destination is not None or not state.launched)

    def route(self, unit: Unit, generation: int) -> Destination | str | None:
        """Where a task of launch ``generation`` pushes ``unit``.

        ``None``: that launch is stale, stop; :data:`WAIT`: ask again, the
        unit's reader has not registered yet.
        """
        state = self._state(unit)
        if state.status is not UnitStatus.RUNNING or state.generation != generation:
            return None
        return state.destination if state.destination is not None else WAIT

    def job_done(
        self,
        generation: int,
        units: Sequence[Unit],
        error: str | None,
        succeeded: Sequence[tuple[Unit, int, int, int]] = (),
        lost: Collection[Unit] = (),
    ) -> list[Forward]:
        """Spark's job for ``units`` (launch ``generation``) ended; the commits and failures to send.

        Args:
            generation: the launch's generation.
            units: the units it computed.
            error: Spark's error if the job failed, else ``None``.
            succeeded: ``(unit, attempt, num_batches, rows)`` of the attempts
                Spark reported successful and complete: these are committed.
            lost: units whose pushes found their reader gone: computed again
                once a reader registers for them.
        """
        forwards = [f for unit, attempt, num_batches, rows in succeeded
                    for f in self._commit(unit, generation, attempt, num_batches, rows)]
        gone = {(int(u[0]), int(u[1])) for u in lost}
        for unit in units:
            state = self._state(unit)
            if state.status is not UnitStatus.RUNNING or state.generation != generation:
                continue
            if error is None and (unit[0], unit[1]) in gone:
                self._reset(state, None)  # the reader is gone; its successor registers
                continue
            forwards += self._fail(unit, state, error or "bug in spark_bridge: the Spark job ended without "
                                   "committing the unit")
        self._note_peak()
        return forwards

    def _commit(self, unit: Unit, generation: int, attempt: int, num_batches: int, rows: int) -> list[Forward]:
        """Spark says this attempt pushed the whole unit: it is the unit's data, if its launch is current."""
        state = self._state(unit)
        if state.status is not UnitStatus.RUNNING or state.generation != generation:
            return []
        assert state.destination is not None, "bug in spark_bridge: a unit ran without a reader"
        state.status, state.rows = UnitStatus.COMMITTED, rows
        self._rows += rows
        self._committed += 1
        commit = Commit(state.destination.token, generation, attempt, num_batches)
        return [Forward(state.destination, commit, (unit[0], unit[1]))]

    def _fail(self, unit: Unit, state: _UnitState, error: str) -> list[Forward]:
        if state.status is UnitStatus.COMMITTED:
            self._rows -= state.rows
        state.status, state.error = UnitStatus.FAILED, error
        if state.destination is None:
            return []
        fail = Fail(state.destination.token, self._failure(unit, state))
        return [Forward(state.destination, fail, tuple(unit))]

    @staticmethod
    def _failure(unit: Unit, state: _UnitState) -> str:
        return f"Spark failed to compute partition {unit[1]} (epoch {unit[0]}): {state.error}"

    def answered(self, forward: Forward, answer: Any, error: str | None = None) -> list[Forward]:
        """A reader's answer to ``forward`` (``None``: the reader is gone; ``error``: it raised)."""
        message = forward.message
        if isinstance(message, Fail):
            self._discarded += answer if isinstance(answer, int) else 0
            return []
        assert isinstance(message, Commit), f"bug in spark_bridge: no answer expected to {message!r}"
        unit = forward.about
        state = self._state(unit)
        current = (
            state.status is UnitStatus.COMMITTED
            and state.generation == message.generation
            and state.destination is not None
            and state.destination.token == message.token
        )  # else replaced meanwhile: its new reader has it computed again
        if error is not None and current:
            return self._fail(unit, state, error)
        if answer is None and current:
            self._reset(state, None)  # the reader went away before the commit reached it
        elif answer is not None:
            self._discarded += answer[1]
        return []

    def note_received(self, nbytes: int) -> None:
        """Bytes of row data found in a call to the coordinator (there should be none)."""
        self._received += nbytes

    def statistics(self) -> BufferStatistics:
        return BufferStatistics(
            max_units=self.max_units,
            buffered_units=self._buffered_units(),
            peak_buffered_units=self._peak_units,
            buffered_rows=self._rows,
            peak_buffered_rows=self._peak_rows,
            committed_units=self._committed,
            delivered_rows=self._delivered_rows,
            delivered_bytes=self._delivered_bytes,
            discarded_attempts=self._discarded,
            launches=self._generation,
            relaunches=self._relaunches,
            row_bytes_received=self._received,
        )
