"""messages.py: the typed, frozen messages that travel on channels, and their envelope.

Only the dispatcher (``instance.py``) branches on a message's type. Control
messages (``control.message``) travel in the same envelopes, never consume
credit and are never dropped.
"""

from __future__ import annotations

import dataclasses
from typing import TypeAlias

import pyarrow as pa

from chiray.control.message import ControlMessage, InstanceId
from chiray.operators.batch import compacted

__all__ = ["ControlRun", "Data", "End", "Envelope", "Grant", "Parcel", "Watermark"]


@dataclasses.dataclass(frozen=True, slots=True)
class Data:
    """A batch of records."""

    batch: pa.RecordBatch

    def __reduce__(self) -> tuple:  # only what crosses processes is pickled: a slice goes as its rows alone
        return (Data, (compacted(self.batch),))


@dataclasses.dataclass(frozen=True, slots=True)
class Watermark:
    """Event time on a channel has reached ``timestamp``: no record with a smaller or equal time follows.

    Watermarks travel in order with the data, need no credit and never go
    backwards on one channel. ``idle`` marks the sender idle: until it sends a
    watermark that is not idle, the receiver leaves it out of the minimum over
    its inputs.
    """

    timestamp: int
    idle: bool = False

    def __reduce__(self) -> tuple:
        return (Watermark, (self.timestamp, self.idle))


@dataclasses.dataclass(frozen=True, slots=True)
class End:
    """End of input on a channel: nothing follows it."""


Message: TypeAlias = "Data | Watermark | End | ControlMessage"
"""What travels on a channel, in an ``Envelope``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    """A message on its way through one channel.

    Attributes:
        channel: the channel's id.
        seq: the message's sequence number on that channel (0, 1, 2, ...).
        message: a ``Data``, ``Watermark``, ``End`` or control message.
        charge: bytes of credit the sender spent on it (0 for non-data).
    """

    channel: int
    seq: int
    message: Message
    charge: int = 0

    def __reduce__(self) -> tuple:  # faster than a slots dataclass's default, field by field
        return (Envelope, (self.channel, self.seq, self.message, self.charge))


@dataclasses.dataclass(frozen=True, slots=True)
class ControlRun:
    """One control message crossing many channels into one instance, as one object.

    The same as an ``Envelope`` per channel: ``message`` (as its first sender
    sent it) travels on channel ``channels[i]`` at sequence ``seqs[i]``, sent by
    ``senders[i]``; the copies differ only in their sender. An op forwarded by
    hundreds of sources to one instance so costs one message, not hundreds,
    and the receiver counts the copies in one step.

    Attributes:
        target: the receiving instance.
        message: the control message (a ``ControlMessage``).
        channels / seqs / senders: one entry per channel, in the same order.
    """

    target: InstanceId
    message: ControlMessage
    channels: list[int]
    seqs: list[int]
    senders: list[InstanceId]

    def __reduce__(self) -> tuple:
        return (ControlRun, (self.target, self.message, self.channels, self.seqs, self.senders))


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """Credit returned by a receiver to the sender of ``channel``."""

    channel: int
    batches: int
    nbytes: int

    def __reduce__(self) -> tuple:
        return (Grant, (self.channel, self.batches, self.nbytes))


@dataclasses.dataclass(frozen=True, slots=True)
class Parcel:
    """Everything one host sends another in one call (Ray's per-call cost dwarfs a message's).

    Attributes:
        envelopes: channel envelopes (``Envelope``), any order.
        runs: control messages on many channels into one instance each (``ControlRun``).
        grants: credit returned to senders on the receiving host (``Grant``).
        extra: (receiver, control message) along ops' extra edges.
        ended: (instance, ops it sent on extra edges) for instances that finished.
        relays: (control message, broadcast relay hosted there).
        injections: (control message, source instances there).
        collects: (sink return, aggregation relay hosted there).
    """

    envelopes: list = dataclasses.field(default_factory=list)
    runs: list = dataclasses.field(default_factory=list)
    grants: list = dataclasses.field(default_factory=list)
    extra: list = dataclasses.field(default_factory=list)
    ended: list = dataclasses.field(default_factory=list)
    relays: list = dataclasses.field(default_factory=list)
    injections: list = dataclasses.field(default_factory=list)
    collects: list = dataclasses.field(default_factory=list)

    def __reduce__(self) -> tuple:
        return (Parcel, (self.envelopes, self.runs, self.grants, self.extra, self.ended, self.relays,
                         self.injections, self.collects))

    def __bool__(self) -> bool:
        return bool(self.envelopes or self.runs or self.grants or self.extra or self.ended or self.relays or self.injections
                    or self.collects)

    @property
    def carries_control(self) -> bool:
        """It holds control traffic (runs, extra-edge sends, relayed, injected or collected control)."""
        return bool(self.runs or self.extra or self.relays or self.injections or self.collects)

    def add(self, other: Parcel) -> None:
        """Append ``other``'s contents (a parcel still waiting to go takes what follows it)."""
        self.envelopes.extend(other.envelopes)
        self.runs.extend(other.runs)
        self.grants.extend(other.grants)
        self.extra.extend(other.extra)
        self.ended.extend(other.ended)
        self.relays.extend(other.relays)
        self.injections.extend(other.injections)
        self.collects.extend(other.collects)
