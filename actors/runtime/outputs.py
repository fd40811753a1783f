"""outputs.py: an operator instance's output side: its channels per edge, their routers and targets, the last watermark.

:class:`InstanceOutputs` sends what the instance produces: record batches
routed to the channels of each output edge (``emit``), watermarks and ``End``
on every channel, and completed control ops (``forward``), which go at once
where nothing waits for credit (returned as ``ControlSend`` values the host
gathers into runs) and behind the waiting data elsewhere. A topology change
(``apply_change``) forwards its op on the old and the new channels and closes
the removed ones. It is a sequence of its edges (each a list of channels by
target position). Only the owning instance (on its host's loop) touches it.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import pyarrow as pa

from chiray.control.message import CONTROLLER, ControlMessage, ControlReturn, InstanceId, instance_id
from chiray.control.processor import Completion
from chiray.operators.logic import InstanceInfo, SideOutput

from .change import InstanceChange
from .channel import OutputChannel
from .failure import OperatorFailure
from .messages import Data, End, Watermark
from .router import Router
from .statistics import InstanceCounters
from .stepresult import NO_SENDS, ControlSend, Sends

__all__ = ["InstanceOutputs"]


class InstanceOutputs(Sequence[list[OutputChannel]]):
    """The output edges of one instance: per edge its channels, router and receiving instances."""

    def __init__(self, info: InstanceInfo, edges: Sequence[Sequence[OutputChannel]], routers: Sequence[Router],
                 targets: Sequence[Sequence[InstanceId]], counters: InstanceCounters):
        self._info = info
        self.name: InstanceId = (info.operator, info.index)
        self.edges = [list(chs) for chs in edges]
        self.routers = list(routers)
        self.targets = [list(t) for t in targets] or [[] for _ in self.edges]
        self._counters = counters  # records_out and batches_out are counted here
        self.sent_mark: Watermark | None = None  # the last watermark sent on the outputs

    def __len__(self) -> int:
        return len(self.edges)

    def __iter__(self) -> Iterator[list[OutputChannel]]:
        return iter(self.edges)

    def __getitem__(self, edge: int) -> list[OutputChannel]:  # type: ignore[override]
        return self.edges[edge]

    def channels(self) -> list[OutputChannel]:
        return [ch for chs in self.edges for ch in chs]

    def downstream(self) -> list[InstanceId]:
        """The receiving instance of every channel."""
        return [t for ts in self.targets for t in ts]

    def blocked(self) -> bool:
        """Some channel holds messages waiting for credit."""
        for chs in self.edges:  # a plain loop: asked several times a step
            for ch in chs:
                if ch.pending:
                    return True
        return False

    def emit(self, batches: Sequence[pa.RecordBatch | SideOutput]) -> None:
        """Route each batch to the channels of the edges that carry it (a side output: its own edges).

        Raises:
            OperatorFailure: a router raised (a key column missing, say).
        """
        counters = self._counters
        for batch in batches:
            port = None
            if isinstance(batch, SideOutput):  # only the edges taken from that side output carry it
                port, batch = batch.port, batch.batch
            if batch.num_rows == 0:
                continue
            counters.records_out += batch.num_rows
            for edge, router in enumerate(self.routers):
                if router.port != port:
                    continue
                try:
                    routed = router.route(batch)
                except Exception as exc:
                    raise OperatorFailure(self._info, exc) from exc
                for target, part in routed:
                    self.edges[edge][target].enqueue(Data(part))
                    counters.batches_out += 1

    def send_mark(self, mark: Watermark) -> None:
        self.sent_mark = mark
        for ch in self.channels():
            ch.enqueue(mark)

    def close(self) -> None:
        """``End`` on every channel."""
        for ch in self.channels():
            ch.enqueue(End())

    def forward(self, c: Completion) -> Sends:
        """Send a completed op on: every output channel, its extra edges, or back to the controller.

        On a channel with nothing waiting for credit it goes at once, as a ``ControlSend`` that the host
        gathers into runs; behind waiting data it is queued (targets with the same payload share one
        immutable message).
        """
        message = c.message
        control: list[ControlSend] = []
        hops: dict[int, ControlMessage] = {}
        for chans, targets in zip(self.edges, self.targets):
            for ch, target in zip(chans, targets):
                payload = c.payload_for(target)
                if not ch.pending:
                    control.append(ControlSend(ch.channel, ch.sequence_nowait(), message, payload))
                    continue
                hop = hops.get(id(payload))
                if hop is None:
                    hop = hops[id(payload)] = message.hop(self.name, payload)
                ch.enqueue(hop)
        extra = tuple((target, message.hop(self.name, c.payload_for(target)))
                      for target in (instance_id(dst) for src, dst in message.extra_edges if tuple(src) == self.name))
        returns: tuple[ControlReturn, ...] = ()
        if not self.edges:
            payload = {self.name: c.payload_for(CONTROLLER)}
            returns = (ControlReturn(message.op_id, (self.name,), payload, message.origin, message.op),)
        if not control and not extra and not returns:
            return NO_SENDS
        return Sends(control=tuple(control), extra=extra, returns=returns)

    def apply_change(self, change: InstanceChange, c: Completion) -> Sends:
        """The op that activates ``change`` completed here: forward it on the old and the new output
        channels (on a new one it is the first message, after the watermark sent on the others), then
        close the channels the change removes and take the change's outputs, targets and routers."""
        dropped = change.dropped_edges(self.edges)
        self.edges, self.targets = change.during(self.edges, self.targets)
        if self.sent_mark is not None:
            for ch in change.added:
                ch.enqueue(self.sent_mark)
        sends = self.forward(c)
        for ch in change.removed:
            ch.enqueue(End())  # no longer this instance's, but the host still flushes it
        self.edges, self.targets = change.after()
        self.routers = change.routers(self.routers, self._info, dropped)
        return sends + Sends(closed=change.removed) if change.removed else sends
