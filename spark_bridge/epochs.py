"""epochs.py: the streaming coordinator's decisions: commit whole epochs once, lanes in order, credit, replay.

An epoch is one Structured Streaming micro-batch (epoch = Spark's batch id).
Source instances read *lanes*: partition ``q`` of every epoch belongs to lane
``q % lanes``. Each lane's reader, inside the host process that runs it,
registers a :class:`~messages.Destination` here; Spark tasks push their
partition straight to that reader, staged per attempt. When Spark's batch
succeeded the driver commits the epoch with the attempts Spark returned;
this directory sends each lane a :class:`~messages.CommitEpoch` with its
share. An epoch is committed at most once: a batch that Spark re-runs after a
restart (its offsets were logged, its commit was not) is ignored. No row
data comes here.

Credit: at most ``max_epochs`` committed epochs wait for the lanes; the
driver does not start pushing the next micro-batch until there is room, so
Spark's next batch waits (back-pressure in units of micro-batches).

Replay: the data of a committed epoch is kept outside the hosts, by Spark
(the driver persists each micro-batch: see ``streaming.py``), until every
lane took it and the dataflow's checkpoints cover it (``acknowledge``), at
most ``retain_epochs`` taken epochs. A lane whose reader is new (a restored
source instance, a host that died) registers with the epoch it needs next;
its share of every kept epoch from there is pushed again from Spark's copy,
with the same partitions in the same lanes (a batch Spark re-ran could be
partitioned differently, so it must not be the source of a replay while
some lanes are past the epoch and others are not). A share whose pushes or
commit found the reader gone is pushed again the same way. A replay that
needs an epoch no longer kept fails the lane with a clear error.

Only the owning actor (``coordinator.StreamCoordinator``) touches an
:class:`EpochDirectory`.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from .messages import CommitEpoch, Destination, EndStream, Fail, Forward

__all__ = ["EpochDirectory", "EpochStatistics", "Share"]


class Share(enum.Enum):
    """Where a lane's share of one epoch is, for the lane's current reader."""

    NEEDED = "NEEDED"  # to push (again) from Spark's copy
    RUNNING = "RUNNING"  # a Spark job pushes it
    SENDING = "SENDING"  # its commit is on the way to the reader
    SENT = "SENT"  # the reader has it


@dataclasses.dataclass(frozen=True, slots=True)
class EpochStatistics:
    """A snapshot of the streaming hand-off.

    Attributes:
        committed_epochs: epochs committed (each at most once).
        ignored_commits: micro-batches Spark ran again for an epoch already committed.
        held_epochs: committed epochs not yet taken by every lane.
        peak_held_epochs: the most ``held_epochs`` ever was.
        delivered_rows: rows lanes read (a replayed epoch counts again).
        discarded_attempts: staged attempts readers dropped.
        retained_epochs: epochs every lane took, kept (by Spark) for a replay.
        replayed_epochs: epochs a lane read a second time (after a dataflow restore).
        delivered_bytes: Arrow IPC bytes lanes read (pushed to their hosts).
        repushes: Spark jobs that pushed kept epochs again (replays, lost shares).
        row_bytes_received: bytes of row data in the calls the coordinator received (0).
        rows_waiting: rows of committed epochs that a lane has not read yet.
        skipped_epochs: lane shares of epochs a lane's reader registered past (a query re-ran an epoch
            that the dataflow's checkpoint holds already).
    """

    committed_epochs: int
    ignored_commits: int
    held_epochs: int
    peak_held_epochs: int
    delivered_rows: int
    discarded_attempts: int
    retained_epochs: int = 0
    replayed_epochs: int = 0
    delivered_bytes: int = 0
    repushes: int = 0
    row_bytes_received: int = 0
    rows_waiting: int = 0
    skipped_epochs: int = 0


@dataclasses.dataclass(slots=True)
class _Lane:
    destination: Destination | None = None
    shares: dict[int, tuple[Share, int]] = dataclasses.field(default_factory=dict)  # epoch -> (share, generation)


class EpochDirectory:
    """Lane destinations, once-only epoch commit, credit and replay for one streaming query.

    Args:
        lanes: number of source splits (lanes), >= 1.
        max_epochs: committed epochs that may wait for the lanes, >= 1.
        retain_epochs: taken epochs kept for a replay until checkpoints cover them, >= 0.
    """

    def __init__(self, lanes: int, max_epochs: int, retain_epochs: int = 0) -> None:
        if lanes < 1 or max_epochs < 1 or retain_epochs < 0:
            raise ValueError(
                "from_spark_stream: lanes and max_epochs must be >= 1 and retain_epochs >= 0, got "
                f"{lanes}, {max_epochs}, {retain_epochs}"
            )
        self.lanes, self.max_epochs, self.retain_epochs = lanes, max_epochs, retain_epochs
        self._lanes = [_Lane() for _ in range(lanes)]
        self._partitions: dict[int, tuple[int, ...]] = {}  # kept epoch -> its partitions
        self._taken: dict[int, set[int]] = {}  # kept epoch -> lanes that took it
        self._done: list[int] = []  # every epoch ever committed, ascending
        self._generation = 0
        self._begun: tuple[int, int] | None = None  # (epoch, generation) the driver pushes now
        self._ended = False
        self._error: str | None = None
        self._lane_last: dict[int, int] = {}  # the last epoch each lane took
        self._lane_from: dict[int, int] = {}  # the epoch each lane's reader registered from
        self._rows_waiting: dict[tuple[int, int], int] = {}  # (epoch, lane) -> rows committed, not taken
        self._skipped = 0
        self._acked: dict[int, int] = {}  # lane -> the next epoch its checkpointed offset needs
        self._kept_from = 0  # epochs below this may have been dropped
        self._released: list[int] = []  # dropped epochs whose copy the driver may free
        self._replayed = self._peak = self._ignored = self._delivered = 0
        self._bytes = self._discarded = self._repushes = self._received = 0

    # -- the driver's micro-batches ---------------------------------------------------

    def _waiting(self) -> int:
        """Committed epochs some lane has not taken yet."""
        return sum(len(t) < self.lanes for t in self._taken.values())

    def has_room(self) -> bool:
        return self._waiting() < self.max_epochs

    def ready(self) -> bool:
        """Room for a micro-batch, and every lane has a reader to push to."""
        return self.has_room() and all(lane.destination is not None for lane in self._lanes)

    def is_committed(self, epoch: int) -> bool:
        i = bisect.bisect_left(self._done, epoch)
        return i < len(self._done) and self._done[i] == epoch

    def begin(self, epoch: int) -> int | None:
        """The driver is about to push micro-batch ``epoch``: its generation, or ``None`` (a re-run: ignore it)."""
        if self.is_committed(epoch) or all(epoch < self._lane_from.get(lane, 0) for lane in range(self.lanes)):
            self._ignored += 1  # committed already, or every lane's checkpoint holds it: a re-run
            return None
        self._generation += 1
        self._begun = (epoch, self._generation)
        return self._generation

    def commit(
        self,
        epoch: int,
        generation: int,
        partitions: Sequence[int],
        succeeded: Sequence[tuple[int, int, int, int]],
    ) -> list[Forward]:
        """Spark's batch ``epoch`` succeeded: commit it (once) and hand each lane its share.

        Args:
            epoch: the batch id.
            generation: what :meth:`begin` returned for it.
            partitions: every partition of the micro-batch.
            succeeded: ``(partition, attempt, num_batches, rows)`` of the
                attempts that pushed their whole partition; a lane missing one
                gets its share pushed again from Spark's copy.
        """
        if self.is_committed(epoch):
            self._ignored += 1
            return []
        if self._done and epoch < self._done[-1]:
            raise ValueError(f"bug in spark_bridge: epoch {epoch} committed after epoch {self._done[-1]}")
        self._done.append(epoch)
        self._partitions[epoch] = tuple(sorted(partitions))
        self._taken[epoch] = set()
        forwards = []
        for lane in range(self.lanes):
            if epoch < self._lane_from.get(lane, 0):  # its reader's checkpoint holds this epoch already
                self._skip(epoch, lane)
                continue
            rows = sum(r for p, _, _, r in succeeded if p % self.lanes == lane)
            self._rows_waiting[(epoch, lane)] = rows
            forwards += self._offer(epoch, lane, generation, succeeded)
        self._peak = max(self._peak, self._waiting())
        return forwards

    def _skip(self, epoch: int, lane: int) -> None:
        """Lane ``lane`` has ``epoch`` already (a re-run of it after the query restarted): taken, nothing sent."""
        self._lanes[lane].shares[epoch] = (Share.SENT, 0)
        self._taken[epoch].add(lane)
        self._skipped += 1

    def _mine(self, epoch: int, lane: int) -> list[int]:
        return [p for p in self._partitions[epoch] if p % self.lanes == lane]

    def _offer(
        self, epoch: int, lane: int, generation: int, succeeded: Sequence[tuple[int, int, int, int]]
    ) -> list[Forward]:
        """Send lane ``lane`` its share of ``epoch`` if ``succeeded`` pushed all of it, else mark it NEEDED."""
        state = self._lanes[lane]
        attempts = tuple((p, a, n) for p, a, n, _ in succeeded if p % self.lanes == lane)
        if state.destination is None or sorted(p for p, _, _ in attempts) != self._mine(epoch, lane):
            state.shares[epoch] = (Share.NEEDED, generation)
            return []
        state.shares[epoch] = (Share.SENDING, generation)
        token = state.destination.token
        message = CommitEpoch(token, epoch, self._previous(epoch), generation, attempts)
        return [Forward(state.destination, message, (epoch, lane))]

    def _previous(self, epoch: int) -> int:
        i = bisect.bisect_left(self._done, epoch)
        return self._done[i - 1] if i > 0 else -1

    # -- lanes -------------------------------------------------------------------------

    def register(self, lane: int, destination: Destination, from_epoch: int) -> list[Forward]:
        """Lane ``lane``'s reader runs at ``destination`` and needs epochs from ``from_epoch`` on."""
        state = self._lanes[lane]
        if state.destination is not None and state.destination.token == destination.token:
            return []
        state.destination, state.shares = destination, {}
        self._lane_from[lane] = from_epoch
        last = self._lane_last.get(lane, -1)
        if from_epoch <= last and from_epoch < self._kept_from:
            error = (
                f"from_spark_stream: lane {lane} must replay from epoch {from_epoch}, but epochs before "
                f"{self._kept_from} were released (retain_epochs={self.retain_epochs}); checkpoint more "
                "often than every retain_epochs micro-batches, or raise retain_epochs"
            )
            return [Forward(destination, Fail(destination.token, error), (None, lane))]
        forwards = []
        for epoch in sorted(e for e in self._partitions if e >= from_epoch):
            state.shares[epoch] = (Share.NEEDED, 0)
            if not self._mine(epoch, lane):  # nothing to push: the lane just moves past it
                forwards += self._offer(epoch, lane, 0, ())
        if self._ended:
            forwards.append(self._end_message(destination, lane))
        return forwards

    def taken(self, lane: int, epoch: int, rows: int, nbytes: int) -> None:
        """Lane ``lane`` read its share of ``epoch`` (``rows`` rows, ``nbytes`` bytes)."""
        last = self._lane_last.get(lane, -1)
        self._replayed += epoch <= last
        self._lane_last[lane] = max(last, epoch)
        self._rows_waiting.pop((epoch, lane), None)
        self._delivered += rows
        self._bytes += nbytes
        if epoch in self._taken:
            self._taken[epoch].add(lane)
        self._release()

    def answered(self, forward: Forward, answer: Any, error: str | None = None) -> list[Forward]:
        """A lane's answer to ``forward`` (``None``: its reader is gone; ``error``: it raised)."""
        message = forward.message
        if not isinstance(message, CommitEpoch):
            self._discarded += answer if isinstance(message, Fail) and isinstance(answer, int) else 0
            return []
        epoch, lane = forward.about
        state = self._lanes[lane]
        if state.destination is None or state.destination.token != message.token:
            return []  # the lane has a new reader: its registration decided what it needs
        if error is not None:
            return [Forward(state.destination, Fail(message.token, error), (epoch, lane))]
        if answer is None:
            state.destination = None  # the reader is gone; its successor registers
            state.shares[epoch] = (Share.NEEDED, 0)
            return []
        rows, discarded = answer
        self._discarded += discarded
        state.shares[epoch] = (Share.SENT, message.generation) if rows >= 0 else (Share.NEEDED, 0)
        return []

    # -- pushing shares again (the driver's replay launcher) ------------------------------

    def launch(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """Spark jobs to push needed shares again from the kept copy: ``(generation, units)``, one per epoch."""
        jobs = []
        for epoch in sorted(self._partitions):
            lanes = [  # a NEEDED share with no partitions has no reader yet: registering sends it
                i for i, s in enumerate(self._lanes)
                if s.destination is not None and s.shares.get(epoch, (None,))[0] is Share.NEEDED
                and self._mine(epoch, i)
            ]
            if not lanes:
                continue
            self._generation += 1
            for lane in lanes:
                self._lanes[lane].shares[epoch] = (Share.RUNNING, self._generation)
            units = [(epoch, p) for p in self._partitions[epoch] if p % self.lanes in lanes]
            jobs.append((self._generation, units))
            self._repushes += 1
        return jobs

    def job_done(
        self,
        generation: int,
        units: Sequence[tuple[int, int]],
        error: str | None,
        succeeded: Sequence[tuple[tuple[int, int], int, int, int]] = (),
    ) -> list[Forward]:
        """A push-again job ended: commit each lane's share it pushed whole (or fail the lanes with ``error``)."""
        if not units:
            return []
        epoch = units[0][0]
        pushed = [(u[1], attempt, n, rows) for u, attempt, n, rows in succeeded]
        forwards: list[Forward] = []
        for lane, state in enumerate(self._lanes):
            if state.shares.get(epoch) != (Share.RUNNING, generation):
                continue
            if error is not None and state.destination is not None:
                failure = f"from_spark_stream: pushing epoch {epoch} again failed: {error}"
                forwards.append(Forward(state.destination, Fail(state.destination.token, failure), (epoch, lane)))
                continue
            forwards += self._offer(epoch, lane, generation, pushed)
        return forwards

    def route(self, unit: tuple[int, int], generation: int) -> Destination | None:
        """Where a task of micro-batch or push-again ``generation`` sends ``unit`` (its lane's reader).

        ``None``: the push is stale, or the lane has no reader at the moment.
        """
        epoch, partition = unit
        state = self._lanes[partition % self.lanes]
        if self._begun == (epoch, generation) or state.shares.get(epoch) == (Share.RUNNING, generation):
            return state.destination
        return None

    # -- the end, checkpoints, release ----------------------------------------------------

    def end(self, error: str | None = None) -> list[Forward]:
        """The query stopped for good: lanes end after the last committed epoch (or fail with ``error``)."""
        self._ended, self._error = True, error
        return [
            self._end_message(s.destination, lane) for lane, s in enumerate(self._lanes) if s.destination is not None
        ]

    def _end_message(self, destination: Destination, lane: int) -> Forward:
        last = self._done[-1] if self._done else -1
        return Forward(destination, EndStream(destination.token, last, self._error), (None, lane))

    def acknowledge(self, offsets: dict[int, int]) -> None:
        """A dataflow checkpoint completed with these lane offsets (the next epoch each lane needs)."""
        for lane, epoch in offsets.items():
            self._acked[lane] = max(self._acked.get(lane, 0), epoch)
        self._release()

    def _release(self) -> None:
        """Drop the taken epochs that no replay can need, and the oldest beyond ``retain_epochs``.

        An epoch a lane still has a share of on the way is not dropped yet.
        """
        done = sorted(e for e, t in self._taken.items() if len(t) == self.lanes and not self._pending(e))
        for epoch in done:
            if all(self._acked.get(lane, 0) > epoch for lane in range(self.lanes)):
                self._drop(epoch)
        done = [e for e in done if e in self._taken]
        for epoch in done[: max(len(done) - self.retain_epochs, 0)]:
            self._drop(epoch)

    def _pending(self, epoch: int) -> bool:
        return any(s.shares.get(epoch, (Share.SENT,))[0] is not Share.SENT for s in self._lanes)

    def _drop(self, epoch: int) -> None:
        del self._partitions[epoch], self._taken[epoch]
        for state in self._lanes:
            state.shares.pop(epoch, None)
        self._released.append(epoch)
        self._kept_from = max(self._kept_from, epoch + 1)  # a replay from here is no longer possible

    def take_released(self) -> list[int]:
        """Epochs dropped since the last call: the driver may free Spark's copy of them."""
        out, self._released = self._released, []
        return out

    def note_received(self, nbytes: int) -> None:
        """Bytes of row data found in a call to the coordinator (there should be none)."""
        self._received += nbytes

    def statistics(self) -> EpochStatistics:
        retained = sum(len(t) == self.lanes for t in self._taken.values())
        return EpochStatistics(
            len(self._done), self._ignored, self._waiting(), self._peak, self._delivered, self._discarded,
            retained, self._replayed, self._bytes, self._repushes, self._received,
            sum(self._rows_waiting.values()), self._skipped,
        )

    def registered(self) -> dict[int, int] | None:
        """Each lane's epoch to start from, once every lane's reader registered (``None`` before)."""
        if len(self._lane_from) < self.lanes:
            return None
        return dict(self._lane_from)
