"""statistics.py: an operator instance's counters (``InstanceCounters``) and their frozen snapshot
(``InstanceStatistics``)."""

from __future__ import annotations

import dataclasses

from chiray.operators.endpoints import SourceLogic
from chiray.operators.logic import InstanceInfo, OperatorLogic

from .channel import ChannelStatistics, OutputChannel
from .inputs import InstanceInputs
from .watermarks import MIN_WATERMARK

__all__ = ["InstanceCounters", "InstanceStatistics", "instance_statistics"]


@dataclasses.dataclass(slots=True)
class InstanceCounters:
    """What an instance counted so far (only its host's loop writes them; a snapshot reads them).

    ``backpressured_s`` counts the spells its outputs held messages waiting for credit that have ended;
    ``blocked_since`` is when the current one began (None: its outputs are free).
    """

    records_in: int = 0
    records_out: int = 0
    batches_in: int = 0
    batches_out: int = 0
    busy_s: float = 0.0
    backpressured_s: float = 0.0
    blocked_since: float | None = None

    def took(self, rows: int) -> None:
        """It took (a source: read) a batch of ``rows`` records."""
        self.records_in += rows
        self.batches_in += 1

    def note_outputs(self, blocked: bool, now: float) -> bool:
        """Its outputs are ``blocked`` (or not) at ``now``; True when a blocked spell just ended."""
        if blocked and self.blocked_since is None:
            self.blocked_since = now
        elif not blocked and self.blocked_since is not None:
            self.backpressured_s += now - self.blocked_since
            self.blocked_since = None
            return True
        return False

    def backpressured_until(self, now: float) -> float:
        """Seconds its outputs held messages waiting for credit, up to ``now``."""
        since = self.blocked_since
        return self.backpressured_s + (now - since if since is not None else 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceStatistics:
    """A snapshot of one instance.

    Attributes:
        operator / index: the instance's name.
        host: the host actor's id.
        records_in / records_out / batches_in / batches_out: counts so far.
        queued_batches / queued_bytes: data buffered in its input channels.
        pending_out: messages waiting for credit on its output channels.
        backpressured_s: time it held output waiting for credit (and so could not run).
        busy_s: time spent processing messages (operator code, routing).
        finished: all inputs ended and final output queued.
        watermark: its event-time watermark (None before the first).
        late_records: records its operator dropped as too late (event-time windows).
        expired_keys: keys whose state its operator dropped by its state TTL (``ttl=``).
        backlog: sources: records offered to it but not read yet, where its readers can say.
        kept_apart_records: sinks: records that came after a pending checkpoint's barrier on some inputs
            while the barrier is still on its way on others, kept in memory or written ahead into the next
            epoch's output (``SinkWriter.write_ahead``), until the checkpoint's epoch is staged.
        outputs: per output channel, its ``ChannelStatistics``.
    """

    operator: str
    index: int
    host: int
    records_in: int
    records_out: int
    batches_in: int
    batches_out: int
    queued_batches: int
    queued_bytes: int
    pending_out: int
    backpressured_s: float
    busy_s: float
    finished: bool
    outputs: tuple[ChannelStatistics, ...] = ()
    control_completed: int = 0
    watermark: int | None = None
    late_records: int = 0
    backlog: int = 0
    expired_keys: int = 0
    kept_apart_records: int = 0


def instance_statistics(info: InstanceInfo, host: int, counters: InstanceCounters, inputs: InstanceInputs,
                        outputs: list[OutputChannel], control_completed: int, logic: OperatorLogic | SourceLogic,
                        finished: bool, now: float, kept_apart_records: int = 0) -> InstanceStatistics:
    """A snapshot at ``now`` of the instance ``info`` on ``host`` with these pieces."""
    queued = [ch.buffered() for ch in inputs]
    mark = inputs.watermarks.output.timestamp
    return InstanceStatistics(
        info.operator, info.index, host,
        counters.records_in, counters.records_out, counters.batches_in, counters.batches_out,
        sum(q[0] for q in queued), sum(q[1] for q in queued),
        sum(len(ch.pending) for ch in outputs),
        counters.backpressured_until(now),
        counters.busy_s,
        finished,
        tuple(ch.statistics() for ch in outputs),
        control_completed,
        None if mark == MIN_WATERMARK else mark,
        int(getattr(logic, "late_records", 0)),
        logic.backlog() if isinstance(logic, SourceLogic) and not finished else 0,
        int(getattr(logic, "expired_keys", 0)),
        kept_apart_records,
    )
