"""outbox.py: what a host sends after a step, as values: the parcels per peer host, and the control runs.

The parcel kinds (envelopes, credit grants, control runs, relayed and collected
control, extra-edge sends, end notices) are declared once, in :class:`Outbox`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Mapping, Sequence, cast

from chiray.control.message import ControlMessage, InstanceId

from .messages import ControlRun, Envelope, Grant, Parcel
from .relay import RelayOutput
from .stepresult import Ack

__all__ = ["Outbox", "RunGatherer"]


@dataclasses.dataclass(slots=True)
class Outbox:
    """What a host must send to other hosts after some steps."""

    envelopes: dict[int, list[Envelope]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    runs: dict[int, RunGatherer] = dataclasses.field(default_factory=dict)
    grants: dict[int, list[Grant]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    extra: dict[int, list[tuple[InstanceId, ControlMessage]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    control: RelayOutput = dataclasses.field(default_factory=RelayOutput)
    acks: list[Ack] = dataclasses.field(default_factory=list)
    ended: dict[int, list[tuple[InstanceId, list[str]]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))

    def __bool__(self) -> bool:
        return (bool(self.envelopes) or bool(self.runs) or bool(self.grants) or bool(self.extra)
                or bool(self.control) or bool(self.acks) or bool(self.ended))

    def _tables(self) -> tuple[tuple[str, Mapping[int, Sequence[object]]], ...]:
        """(parcel field, host -> items) for everything that travels in parcels, but control runs."""
        control = self.control
        return (("envelopes", self.envelopes), ("grants", self.grants), ("extra", self.extra),
                ("ended", self.ended), ("relays", control.relays), ("injections", control.injections),
                ("collects", control.collects))

    def hosts(self) -> set[int]:
        """The hosts that get a parcel."""
        out = {host for host, gatherer in self.runs.items() if gatherer}
        for _, table in self._tables():
            out.update(host for host, items in table.items() if items)
        return out

    def parcels(self) -> dict[int, Parcel]:
        """What goes to each other host, one parcel a host (returns and acks go to controllers)."""
        out: dict[int, Parcel] = collections.defaultdict(Parcel)
        for field, table in self._tables():
            for host, items in table.items():
                if items:
                    getattr(out[host], field).extend(items)
        for host, gatherer in self.runs.items():
            out[host].runs.extend(gatherer.take())
        return out


class RunGatherer:
    """Control envelopes gathered into one ``ControlRun`` per (receiving instance, op, payload).

    A host forwarding one op from many of its instances to the same instance
    elsewhere so sends one message (one pickle, counted in one step there)
    instead of one per channel.
    """

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[tuple, ControlRun] = {}

    def __bool__(self) -> bool:
        return bool(self._runs)

    def add(self, target: InstanceId, message: ControlMessage, payload: object, channel: int, seq: int,
            sender: InstanceId) -> None:
        """``sender`` sends ``message`` (as it reached ``sender``) with ``payload`` on ``channel`` at ``seq``."""
        key = (target, message.op_id, id(payload))  # the payload lives as long as the run
        run = self._runs.get(key)
        if run is None:
            if message.sender != sender or message.payload is not payload:
                message = message.hop(sender, payload)
            run = self._runs[key] = ControlRun(target, message, [], [], [])
        run.channels.append(channel)
        run.seqs.append(seq)
        run.senders.append(sender)

    def add_envelope(self, target: InstanceId, env: Envelope) -> None:
        """A control message that waited for credit behind data (its hop names its sender)."""
        message = cast(ControlMessage, env.message)  # the flush hands over control envelopes only
        self.add(target, message, message.payload, env.channel, env.seq, message.sender)  # type: ignore[arg-type]

    def take(self) -> list[ControlRun]:
        runs = list(self._runs.values())
        self._runs.clear()
        return runs
