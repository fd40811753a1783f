"""statistics.py: ``InstanceStatistics``, a frozen snapshot of one operator instance's counters."""

from __future__ import annotations

import dataclasses
from typing import Any

from chiray.operators.endpoints import SourceLogic

from .watermarks import MIN_WATERMARK

__all__ = ["InstanceStatistics", "instance_statistics"]


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
    outputs: tuple = ()
    control_completed: int = 0
    watermark: int | None = None
    late_records: int = 0
    backlog: int = 0
    expired_keys: int = 0


def instance_statistics(inst: Any, now: float) -> InstanceStatistics:
    """A snapshot of ``inst`` (an ``OperatorInstance``) at ``now``."""
    queued = [ch.buffered() for ch in inst.inputs]
    outputs = inst.output_channels()
    mark = inst.watermarks.output.timestamp
    return InstanceStatistics(
        inst.info.operator, inst.info.index, inst.host,
        inst.records_in, inst.records_out, inst.batches_in, inst.batches_out,
        sum(q[0] for q in queued), sum(q[1] for q in queued),
        sum(len(ch.pending) for ch in outputs),
        inst.backpressured_until(now),
        inst.busy_s,
        inst.finished,
        tuple(ch.statistics() for ch in outputs),
        inst.control.completed,
        None if mark == MIN_WATERMARK else mark,
        int(getattr(inst.logic, "late_records", 0)),
        inst.logic.backlog() if isinstance(inst.logic, SourceLogic) and not inst.finished else 0,
        int(getattr(inst.logic, "expired_keys", 0)),
    )
