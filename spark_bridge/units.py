"""units.py: the hand-off buffer's decisions: which Spark units to compute, which attempt wins, credit.

A *unit* is one ``(epoch, partition)`` of a Spark DataFrame (a batch
DataFrame has the single epoch 0). Spark task attempts push a unit's Arrow
batches tagged ``(generation, attempt, seq)``; they stay staged, per attempt,
until the driver commits the attempt that Spark reported successful (a task's
Python code cannot know that: when its input fails upstream, Spark ends the
input as if it were complete and fails the task afterwards). The committed
attempt is the only one a source instance ever sees; the others (failed,
retried, speculative, from an older generation) are dropped.

Credit: the buffer lets Spark compute at most ``max_units`` units ahead of
the dataflow (units running in Spark plus committed but not yet taken). A
unit a source instance is waiting for is always launched, so the window can
never deadlock; the bound on buffered units is therefore
``max_units + number of source instances``.

Lifecycle of a unit::

    IDLE --launch--> RUNNING --commit--> COMMITTED --take--> DELIVERED
      ^                 |  (Spark job failed)                  |
      |                 +--> FAILED                            |
      +-------------------------- want (replay) ---------------+

Only the owning actor (``inbox.SparkInbox``) touches a :class:`UnitBuffer`;
it is plain Python so that its rules are unit-tested without Ray or Spark.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

__all__ = ["BufferStatistics", "SparkUnitFailed", "Unit", "UnitBuffer", "UnitStatus"]

Unit = tuple[int, int]  # (epoch, partition)


class SparkUnitFailed(RuntimeError):
    """Spark could not compute a unit (its job failed); the message carries Spark's error."""


class UnitStatus(enum.Enum):
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    COMMITTED = "COMMITTED"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


@dataclasses.dataclass(frozen=True, slots=True)
class BufferStatistics:
    """A snapshot of the hand-off buffer.

    Attributes:
        max_units: the credit window, in units.
        buffered_units: units running in Spark or committed and not yet taken.
        peak_buffered_units: the most ``buffered_units`` ever was.
        buffered_rows: rows held (staged attempts and committed units).
        peak_buffered_rows: the most ``buffered_rows`` ever was.
        committed_units: units committed so far (a replayed unit counts again).
        delivered_rows: rows handed to source instances.
        discarded_attempts: attempts whose data was dropped (failed, retried,
            speculative, stale).
        rejected_pushes: pushes refused because their unit was already committed.
        launches: Spark jobs asked for (each covers one or more units).
    """

    max_units: int
    buffered_units: int
    peak_buffered_units: int
    buffered_rows: int
    peak_buffered_rows: int
    committed_units: int
    delivered_rows: int
    discarded_attempts: int
    rejected_pushes: int
    launches: int


@dataclasses.dataclass(slots=True)
class _UnitState:
    status: UnitStatus = UnitStatus.IDLE
    generation: int = -1
    wanted: bool = False
    staged: dict[tuple[int, int], dict[int, tuple[bytes, int]]] = dataclasses.field(default_factory=dict)
    data: list[bytes] = dataclasses.field(default_factory=list)
    rows: int = 0
    error: str | None = None


class UnitBuffer:
    """Staging, commit and credit for the units of one bridged DataFrame.

    Args:
        units: every unit, in the order Spark should compute them.
        max_units: the credit window (units ahead of the dataflow), >= 1.
    """

    def __init__(self, units: Sequence[Unit], max_units: int) -> None:
        if max_units < 1:
            raise ValueError(f"from_spark: max_units must be >= 1, got {max_units}")
        self.max_units = max_units
        self._order = list(units)
        self._units = {u: _UnitState() for u in self._order}
        self._generation = 0
        self._peak_units = 0
        self._rows = 0
        self._peak_rows = 0
        self._committed = 0
        self._delivered_rows = 0
        self._discarded = 0
        self._rejected = 0

    def _state(self, unit: Unit) -> _UnitState:
        try:
            return self._units[tuple(unit)]  # type: ignore[index]
        except KeyError:
            raise KeyError(f"from_spark: unknown unit (epoch, partition) = {tuple(unit)}") from None

    def _buffered_units(self) -> int:
        return sum(s.status in (UnitStatus.RUNNING, UnitStatus.COMMITTED) for s in self._units.values())

    def _note_peak(self) -> None:
        self._peak_units = max(self._peak_units, self._buffered_units())
        self._peak_rows = max(self._peak_rows, self._rows)

    # -- the source side -----------------------------------------------------------

    def want(self, unit: Unit) -> None:
        """A source instance waits for ``unit``: launch it next (again if it was delivered: a replay)."""
        state = self._state(unit)
        state.wanted = True
        if state.status is UnitStatus.DELIVERED:
            state.status = UnitStatus.IDLE

    def take(self, unit: Unit) -> list[bytes] | None:
        """The committed data of ``unit`` (then dropped here), or ``None`` if not committed yet.

        Raises:
            SparkUnitFailed: Spark's job for the unit failed.
        """
        state = self._state(unit)
        if state.status is UnitStatus.FAILED:
            raise SparkUnitFailed(
                f"Spark failed to compute partition {unit[1]} (epoch {unit[0]}): {state.error}"
            )
        if state.status is not UnitStatus.COMMITTED:
            self.want(unit)
            return None
        data, state.data = state.data, []
        self._rows -= state.rows
        self._delivered_rows += state.rows
        state.status, state.wanted = UnitStatus.DELIVERED, False
        return data

    # -- the driver (job launcher) side ----------------------------------------------

    def launch(self) -> tuple[int, list[Unit]]:
        """Units to compute now, as ``(generation, units)``; marks them RUNNING.

        Wanted units first (always), then the next idle units while the credit
        window has room.
        """
        chosen = [
            u for u in self._order if self._units[u].wanted and self._units[u].status is UnitStatus.IDLE
        ]
        room = self.max_units - self._buffered_units() - len(chosen)
        for u in self._order:
            if room <= 0:
                break
            if self._units[u].status is UnitStatus.IDLE and u not in chosen:
                chosen.append(u)
                room -= 1
        if not chosen:
            return self._generation, []
        self._generation += 1
        for u in chosen:
            self._units[u].status, self._units[u].generation = UnitStatus.RUNNING, self._generation
        self._note_peak()
        return self._generation, chosen

    def job_done(
        self,
        generation: int,
        units: Sequence[Unit],
        error: str | None,
        succeeded: Sequence[tuple[Unit, int, int]] = (),
    ) -> None:
        """Spark's job for ``units`` (launched as ``generation``) ended.

        Args:
            generation: the launch's generation.
            units: the units it computed.
            error: Spark's error if the job failed, else ``None``.
            succeeded: ``(unit, attempt, num_batches)`` of the task attempts
                Spark reported successful: these are committed.
        """
        for unit, attempt, num_batches in succeeded:
            self.commit(tuple(unit), generation, attempt, num_batches)  # type: ignore[arg-type]
        for unit in units:
            state = self._state(unit)
            self._drop_staged(state, generation)
            if state.status is UnitStatus.RUNNING and state.generation == generation:
                if error is None:
                    error = "bug in spark_bridge: the Spark job ended without committing the unit"
                state.status, state.error = UnitStatus.FAILED, error

    # -- the Spark task side ---------------------------------------------------------

    def push(self, unit: Unit, generation: int, attempt: int, seq: int, data: bytes, rows: int) -> bool:
        """Stage one batch of an attempt; ``False``: the unit is already committed, stop pushing."""
        state = self._state(unit)
        if state.status is not UnitStatus.RUNNING:
            self._rejected += 1
            return False
        batches = state.staged.setdefault((generation, attempt), {})
        if seq in batches:
            raise ValueError(
                f"bug in spark_bridge: batch {seq} of unit {unit} attempt {attempt} pushed twice"
            )
        batches[seq] = (data, rows)
        self._rows += rows
        self._note_peak()
        return True

    def commit(self, unit: Unit, generation: int, attempt: int, num_batches: int) -> bool:
        """Spark says this attempt succeeded with ``num_batches`` pushed; ``True``: it is the unit's data."""
        state = self._state(unit)
        mine = state.staged.get((generation, attempt), {})
        if state.status is not UnitStatus.RUNNING:
            return False
        if sorted(mine) != list(range(num_batches)):
            raise ValueError(
                f"bug in spark_bridge: unit {unit} attempt {attempt} reported {num_batches} batches, "
                f"the buffer holds {sorted(mine)}"
            )
        state.data = [mine[i][0] for i in range(num_batches)]
        state.rows = sum(mine[i][1] for i in range(num_batches))
        del state.staged[(generation, attempt)]
        self._drop_staged(state, None)
        state.status = UnitStatus.COMMITTED
        self._committed += 1
        return True

    def _drop_staged(self, state: _UnitState, generation: int | None) -> None:
        """Drop the staged attempts of ``generation`` (``None``: of every generation)."""
        for key in [k for k in state.staged if generation is None or k[0] == generation]:
            self._rows -= sum(rows for _, rows in state.staged.pop(key).values())
            self._discarded += 1

    def staged_rows(self, unit: Unit) -> int:
        """Rows staged for ``unit`` by attempts not (yet) committed."""
        return sum(rows for batches in self._state(unit).staged.values() for _, rows in batches.values())

    def statistics(self) -> BufferStatistics:
        return BufferStatistics(
            max_units=self.max_units,
            buffered_units=self._buffered_units(),
            peak_buffered_units=self._peak_units,
            buffered_rows=self._rows,
            peak_buffered_rows=self._peak_rows,
            committed_units=self._committed,
            delivered_rows=self._delivered_rows,
            discarded_attempts=self._discarded,
            rejected_pushes=self._rejected,
            launches=self._generation,
        )
