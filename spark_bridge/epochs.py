"""epochs.py: the streaming hand-off's decisions: stage per attempt, commit whole epochs once, credit.

An epoch is one Structured Streaming micro-batch (epoch = Spark's batch id).
Tasks push batches tagged ``(epoch, partition, generation, attempt, seq)``;
when Spark's batch succeeded the driver commits the epoch with the attempts
Spark returned. An epoch is committed at most once: a batch that Spark re-runs
after a restart (its offsets were logged, its commit was not) is ignored.

Source instances are *lanes*: partition ``q`` of every epoch belongs to lane
``q % lanes``. A lane takes epochs in order. Credit: at most ``max_epochs``
committed epochs wait for the lanes; the driver does not start pushing the
next micro-batch until there is room, so Spark's next batch waits
(back-pressure in units of micro-batches).

Replay: an epoch every lane took is kept until the dataflow's checkpoints
cover it (``acknowledge``: every lane's checkpointed offset is past it), so a
dataflow restored from its last checkpoint takes the same epochs again, with
the same partitions in the same lanes (a batch Spark re-ran could be
partitioned differently, so the replay must not come from Spark while some
lanes are past the epoch and others are not). At most ``retain_epochs`` taken
epochs are kept; a replay that needs an older one fails with a clear error.

Only the owning actor touches an :class:`EpochBuffer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

__all__ = ["END", "EpochBuffer", "EpochStatistics"]

END = -1  # take() answer: the stream ended and this lane has taken everything


@dataclasses.dataclass(frozen=True, slots=True)
class EpochStatistics:
    """A snapshot of the streaming hand-off.

    Attributes:
        committed_epochs: epochs committed (each at most once).
        ignored_commits: commits of an epoch already committed (re-run batches).
        held_epochs: committed epochs not yet taken by every lane.
        peak_held_epochs: the most ``held_epochs`` ever was.
        delivered_rows: rows handed to lanes (a replayed epoch counts again).
        discarded_attempts: staged attempts dropped.
        retained_epochs: epochs every lane took, kept for a replay.
        replayed_epochs: epochs handed to a lane a second time (after a dataflow restore).
    """

    committed_epochs: int
    ignored_commits: int
    held_epochs: int
    peak_held_epochs: int
    delivered_rows: int
    discarded_attempts: int
    retained_epochs: int = 0
    replayed_epochs: int = 0


class EpochBuffer:
    """Staging and once-only epoch commit for one streaming query.

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
        self._staged: dict[tuple[int, int, int, int], dict[int, tuple[bytes, int]]] = {}
        self._epochs: dict[int, list[list[tuple[bytes, int]]]] = {}  # epoch -> per lane
        self._taken: dict[int, set[int]] = {}
        self._done: set[int] = set()  # every epoch ever committed
        self._ended = False
        self._error: str | None = None
        self._lane_last: dict[int, int] = {}  # the last epoch each lane was given
        self._acked: dict[int, int] = {}  # lane -> the next epoch its checkpointed offset needs
        self._kept_from = 0  # epochs below this may have been dropped
        self._replayed = 0
        self._peak = 0
        self._ignored = 0
        self._delivered = 0
        self._discarded = 0

    def _waiting(self) -> int:
        """Committed epochs some lane has not taken yet."""
        return sum(len(self._taken[e]) < self.lanes for e in self._epochs)

    def has_room(self) -> bool:
        return self._waiting() < self.max_epochs

    def is_committed(self, epoch: int) -> bool:
        return epoch in self._done

    def push(
        self, epoch: int, partition: int, generation: int, attempt: int, seq: int, data: bytes, rows: int
    ) -> bool:
        """Stage one batch; ``False``: the epoch is already committed (a re-run): stop pushing."""
        if epoch in self._done:
            return False
        self._staged.setdefault((epoch, partition, generation, attempt), {})[seq] = (data, rows)
        return True

    def commit(self, epoch: int, generation: int, succeeded: Sequence[tuple[int, int, int]]) -> bool:
        """Spark's batch ``epoch`` succeeded with these ``(partition, attempt, num_batches)``; once only."""
        mine = {(p, a): n for p, a, n in succeeded}
        keys = [k for k in self._staged if k[0] == epoch]
        if epoch in self._done:
            self._ignored += 1
            for k in keys:
                del self._staged[k]
            return False
        lanes: list[list[tuple[bytes, int]]] = [[] for _ in range(self.lanes)]
        for partition, attempt in sorted(mine):
            batches = self._staged.get((epoch, partition, generation, attempt), {})
            if sorted(batches) != list(range(mine[(partition, attempt)])):
                raise ValueError(
                    f"bug in spark_bridge: epoch {epoch} partition {partition} attempt {attempt} "
                    f"reported {mine[(partition, attempt)]} batches, the buffer holds {sorted(batches)}"
                )
            lanes[partition % self.lanes].extend(batches[i] for i in range(len(batches)))
        for k in keys:
            self._discarded += (k[1], k[3]) not in mine or k[2] != generation
            del self._staged[k]
        self._done.add(epoch)
        self._epochs[epoch] = lanes
        self._taken[epoch] = set()
        self._peak = max(self._peak, self._waiting())
        return True

    def end(self, error: str | None = None) -> None:
        """The query stopped for good: lanes end after the last committed epoch (or fail with ``error``)."""
        self._ended = True
        self._error = error

    def take(self, lane: int, from_epoch: int) -> tuple[int, list[bytes]] | None:
        """This lane's data of the first committed epoch ``>= from_epoch`` (possibly no rows).

        Asking again for an epoch the lane already took is a replay (the
        dataflow was restored from a checkpoint): the kept epochs are handed
        out again, unchanged.

        Returns ``(epoch, data)``, ``(END, [])`` when the stream ended, or
        ``None`` (wait).

        Raises:
            LookupError: the replay needs an epoch that was no longer kept.
        """
        last = self._lane_last.get(lane, -1)
        if from_epoch <= last and from_epoch < self._kept_from:
            raise LookupError(
                f"from_spark_stream: lane {lane} must replay from epoch {from_epoch}, but epochs before "
                f"{self._kept_from} were released (retain_epochs={self.retain_epochs}); checkpoint more "
                "often than every retain_epochs micro-batches, or raise retain_epochs"
            )
        for epoch in sorted(e for e in self._epochs if e >= from_epoch):
            data = self._epochs[epoch][lane]
            self._taken[epoch].add(lane)
            self._replayed += epoch <= last
            self._lane_last[lane] = max(last, epoch)
            self._delivered += sum(rows for _, rows in data)
            self._release()
            return epoch, [d for d, _ in data]
        if self._ended:
            if self._error is not None:
                raise RuntimeError(f"from_spark_stream: {self._error}")
            return END, []
        return None

    def acknowledge(self, offsets: dict[int, int]) -> None:
        """A dataflow checkpoint completed with these lane offsets (the next epoch each lane needs)."""
        for lane, epoch in offsets.items():
            self._acked[lane] = max(self._acked.get(lane, 0), epoch)
        self._release()

    def _release(self) -> None:
        """Drop the taken epochs that no replay can need, and the oldest beyond ``retain_epochs``."""
        done = sorted(e for e in self._epochs if len(self._taken[e]) == self.lanes)
        for epoch in done:
            if all(self._acked.get(lane, 0) > epoch for lane in range(self.lanes)):
                self._drop(epoch)
        done = [e for e in done if e in self._epochs]
        for epoch in done[: max(len(done) - self.retain_epochs, 0)]:
            self._drop(epoch)

    def _drop(self, epoch: int) -> None:
        del self._epochs[epoch], self._taken[epoch]
        self._kept_from = max(self._kept_from, epoch + 1)  # a replay from here is no longer possible

    def statistics(self) -> EpochStatistics:
        retained = sum(len(self._taken[e]) == self.lanes for e in self._epochs)
        return EpochStatistics(
            len(self._done),
            self._ignored,
            self._waiting(),
            self._peak,
            self._delivered,
            self._discarded,
            retained,
            self._replayed,
        )
