"""message.py: the control message: metadata, per-instance configuration and payload.

A :class:`ControlMessage` travels in-band, in the same channels and envelopes
as data (Chi section 6, Fig. 6). Its three parts:

* metadata: op id, kind, blocking flag, global injection sequence, origin
  controller;
* configuration: one entry per instance, serialised once by the controller
  into a :class:`Configs` blob that every hop forwards as the same bytes
  (nothing re-serialises it on the way); an instance unpickles only its entry;
* payload: what the upstream instance attached for this particular receiver
  (state, metrics); replaced at every hop.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Mapping

import cloudpickle

__all__ = ["InstanceId", "instance_id", "Configs", "ControlMessage", "ControlReturn", "CONTROLLER"]

InstanceId = tuple[str, int]
"""An instance's name: (operator, index)."""


def instance_id(value: Any) -> InstanceId:
    """An instance name from any (operator, index) pair (a list after a round trip, say)."""
    return (str(value[0]), int(value[1]))

CONTROLLER = "controller"
"""The sender name of a message injected at a source by the controller."""


class Configs:
    """Per-instance configuration, serialised once; each entry unpickled on demand.

    Pickling a ``Configs`` copies its bytes as they are, so a message forwarded
    hop by hop never re-serialises the configurations.
    """

    __slots__ = ("_blobs", "_default")

    def __init__(self, configs: Mapping[InstanceId, Any] | None = None, default: Any = None):
        self._blobs = {k: cloudpickle.dumps(v) for k, v in (configs or {}).items()}
        self._default = cloudpickle.dumps(default)

    def get(self, instance: InstanceId) -> Any:
        """The configuration injected for ``instance`` (the default if none was)."""
        return pickle.loads(self._blobs.get(instance, self._default))

    def __contains__(self, instance: object) -> bool:
        return instance in self._blobs

    def __len__(self) -> int:
        return len(self._blobs)

    def __getstate__(self) -> tuple:
        return (self._blobs, self._default)

    def __setstate__(self, state: tuple) -> None:
        self._blobs, self._default = state


@dataclasses.dataclass(frozen=True, slots=True)
class ControlMessage:
    """One control message as it crosses one channel.

    Attributes:
        op_id: unique id of the control operation.
        kind: the op's class name, for messages and statistics.
        blocking: blocking (aligned) or non-blocking.
        seq: the op's place in the job's global injection order.
        origin: the controller that started the op (sinks return to it).
        op: the op object (its handler code), pickled once with the message.
        configs: per-instance configuration.
        extra_edges: edges the op adds to the meta-topology G' (old -> new
            instance, say): (sender, receiver) pairs carried outside the data channels.
        sender: the instance that sent this copy (``CONTROLLER`` at a source).
        payload: what ``sender`` attached for the receiver, or ``None``.
    """

    op_id: str
    kind: str
    blocking: bool
    seq: int
    origin: str
    op: Any
    configs: Configs
    extra_edges: tuple[tuple[InstanceId, InstanceId], ...] = ()
    sender: InstanceId | str = CONTROLLER
    payload: Any = None

    def __reduce__(self) -> tuple:  # faster than a slots dataclass's default, field by field
        return (ControlMessage, (self.op_id, self.kind, self.blocking, self.seq, self.origin, self.op,
                                 self.configs, self.extra_edges, self.sender, self.payload))

    def hop(self, sender: InstanceId, payload: Any) -> "ControlMessage":
        """The copy ``sender`` forwards, carrying ``payload`` for one receiver (shares everything else)."""
        return ControlMessage(self.op_id, self.kind, self.blocking, self.seq, self.origin, self.op,
                              self.configs, self.extra_edges, sender, payload)


@dataclasses.dataclass(frozen=True, slots=True)
class ControlReturn:
    """What a sink (or an aggregation relay) returns to the controller for one op.

    Attributes:
        op_id: the op, or ``None`` for "these sinks finished: count them as
            returned for every op from now on".
        instances: the sink instances this return covers.
        payload: the (combined) payload they attached: sink instance -> payload.
        origin: the controller to deliver it to.
        op: the op object (its ``combine`` merges payloads at relays).
    """

    op_id: str | None
    instances: tuple[InstanceId, ...]
    payload: Any
    origin: str
    op: Any = None

    def __reduce__(self) -> tuple:
        return (ControlReturn, (self.op_id, self.instances, self.payload, self.origin, self.op))
