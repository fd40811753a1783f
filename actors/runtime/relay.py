"""relay.py: the relays of a job's broadcast and aggregation trees that live on one host.

A broadcast relay forwards an injected control message to its children:
relays or sources, on this host (handed over in memory) or on others (put in
the outbox). An aggregation relay collects the returns of the sinks below it,
merges their payloads with the op's ``combine`` and passes one return up when
every sink below it has returned the op or finished.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

from chiray.control.message import ControlMessage, ControlReturn, InstanceId
from chiray.control.trees import Relay, Tree

__all__ = ["RelayTable", "RelayOutput"]


@dataclasses.dataclass(slots=True)
class RelayOutput:
    """What relays produced for other hosts and for controllers."""

    relays: dict[int, list[tuple[ControlMessage, Relay]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    injections: dict[int, list[tuple[ControlMessage, list[InstanceId]]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    collects: dict[int, list[tuple[ControlReturn, Relay]]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(list))
    returns: list[ControlReturn] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.relays or self.injections or self.collects or self.returns)


class RelayTable:
    """Broadcast and aggregation relays hosted here.

    Args:
        host_id: this host.
        broadcast: the tree over the job's sources.
        aggregation: the tree over the job's sinks.
        host_of: instance -> host id.
        inject_local: hands a message to a source instance on this host.
    """

    def __init__(self, host_id: int, broadcast: Tree, aggregation: Tree,
                 host_of: Callable[[InstanceId], int], inject_local: Callable[[ControlMessage, InstanceId], None]):
        self.host_id = host_id
        self.broadcast = broadcast
        self.aggregation = aggregation
        self.host_of = host_of
        self.inject_local = inject_local
        self.out = RelayOutput()
        self._leaves = {r: set(aggregation.leaves_of(r)) for r, h in aggregation.host.items() if h == host_id}
        self._finished: dict[Relay, set[InstanceId]] = collections.defaultdict(set)
        self._partial: dict[Relay, dict[str, ControlReturn]] = collections.defaultdict(dict)
        self.relayed = 0

    def take_output(self) -> RelayOutput:
        out, self.out = self.out, RelayOutput()
        return out

    # -- broadcast ---------------------------------------------------------------

    def relay(self, message: ControlMessage, relay: Relay) -> None:
        """Forward ``message`` to the children of broadcast relay ``relay`` (hosted here)."""
        self.relayed += 1
        for child in self.broadcast.children[relay]:
            if isinstance(child, Relay):
                host = self.broadcast.host[child]
                if host == self.host_id:
                    self.relay(message, child)
                else:
                    self.out.relays[host].append((message, child))
            else:
                host = self.host_of(child)
                if host == self.host_id:
                    self.inject_local(message, child)
                else:
                    self.out.injections[host].append((message, [child]))

    # -- aggregation -------------------------------------------------------------

    def sink_returned(self, ret: ControlReturn) -> None:
        """A sink on this host returned an op (or finished, ``op_id`` None): pass it up."""
        self._up(ret, self.aggregation.parent.get(ret.instances[0]))

    def _up(self, ret: ControlReturn, parent: Relay | None) -> None:
        if parent is None:
            if ret.op_id is not None:
                self.out.returns.append(ret)
        elif self.aggregation.host[parent] == self.host_id:
            self.collect(ret, parent)
        else:
            self.out.collects[self.aggregation.host[parent]].append((ret, parent))

    def collect(self, ret: ControlReturn, relay: Relay) -> None:
        """A child of aggregation relay ``relay`` (hosted here) returned."""
        leaves = self._leaves[relay]
        if ret.op_id is None:
            self._finished[relay].update(ret.instances)
            for op_id in list(self._partial[relay]):
                self._maybe_forward(relay, op_id)
            if self._finished[relay] >= leaves:
                self._up(ControlReturn(None, tuple(leaves), None, ""), self.aggregation.parent.get(relay))
            return
        have = self._partial[relay].get(ret.op_id)
        if have is None:
            merged = ret
        else:
            payload = ret.op.combine(have.payload, ret.payload) if ret.op is not None else {
                **have.payload, **ret.payload}
            merged = dataclasses.replace(have, instances=have.instances + ret.instances, payload=payload)
        self._partial[relay][ret.op_id] = merged
        self._maybe_forward(relay, ret.op_id)

    def _maybe_forward(self, relay: Relay, op_id: str) -> None:
        ret = self._partial[relay][op_id]
        if set(ret.instances) | self._finished[relay] >= self._leaves[relay]:
            del self._partial[relay][op_id]
            self._up(ret, self.aggregation.parent.get(relay))
