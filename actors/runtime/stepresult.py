"""stepresult.py: what one step of an instance hands its host, as one frozen value.

An instance's step (``OperatorInstance.step``) processes one message and
returns a :class:`StepResult`: the credit to give back, the control messages
it sent at once, what goes along extra edges or back to a controller, the
acknowledgements of ops, the output channels a rescale closed, and whether it
finished. Data and watermarks stay in the instance's output channels, which
the host drains. Nothing is left in the instance for the host to fetch and
clear afterwards: each handler of the instance returns what it sent as a
:class:`Sends`, and the step adds them up into its result.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chiray.control.message import ControlMessage, ControlReturn, InstanceId

from .channel import OutputChannel
from .messages import Grant

__all__ = ["Ack", "ControlSend", "NO_SENDS", "NOTHING", "Sends", "StepResult"]


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """An instance acknowledges op ``op_id`` to the controller named ``origin``.

    ``payload`` is the acknowledgement; with ``background`` it is a function that the host runs off
    the processing path, acknowledging with its result.
    """

    origin: str
    op_id: str
    instance: InstanceId
    payload: Any  # anything picklable; with ``background``, the callable that makes it
    background: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ControlSend:
    """A control message sent at once on output channel ``channel`` as its message ``seq``."""

    channel: int
    seq: int
    message: ControlMessage
    payload: object


@dataclasses.dataclass(frozen=True, slots=True)
class StepResult:
    """What one step of an instance produced besides the messages queued on its output channels.

    Attributes:
        grants: credit for the messages it consumed.
        control: control messages sent at once (the host gathers them into runs).
        extra: messages along ops' extra edges, as (receiving instance, message).
        returns: returns to a controller (a sink completed an op).
        acks: acknowledgements of ops.
        closed: output channels a rescale took away (closed with ``End``; still to flush).
        finished: the instance finished in this step.
        took_control: the step took control messages only (no data, no operator code).
    """

    grants: tuple[Grant, ...] = ()
    control: tuple[ControlSend, ...] = ()
    extra: tuple[tuple[InstanceId, ControlMessage], ...] = ()
    returns: tuple[ControlReturn, ...] = ()
    acks: tuple[Ack, ...] = ()
    closed: tuple[OutputChannel, ...] = ()
    finished: bool = False
    took_control: bool = False


NOTHING = StepResult()
"""A step (or a peer's end) that produced nothing for the host."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sends:
    """What one handler of an instance sent besides data and watermarks (the ``StepResult`` fields
    but grants and ``took_control``); handlers return it and a step adds them up with ``+``."""

    control: tuple[ControlSend, ...] = ()
    extra: tuple[tuple[InstanceId, ControlMessage], ...] = ()
    returns: tuple[ControlReturn, ...] = ()
    acks: tuple[Ack, ...] = ()
    closed: tuple[OutputChannel, ...] = ()
    finished: bool = False

    def __add__(self, other: Sends) -> Sends:
        if other is NO_SENDS:  # the common case: a data step sends nothing of this kind
            return self
        if self is NO_SENDS:
            return other
        return Sends(self.control + other.control, self.extra + other.extra, self.returns + other.returns,
                     self.acks + other.acks, self.closed + other.closed, self.finished or other.finished)

    def result(self, grants: tuple[Grant, ...], took_control: bool) -> StepResult:
        """The step's result: these sends, ``grants`` and ``took_control``."""
        if self is NO_SENDS:
            if not grants and not took_control:
                return NOTHING
            return StepResult(grants, took_control=took_control)
        return StepResult(grants, self.control, self.extra, self.returns, self.acks, self.closed, self.finished,
                          took_control)


NO_SENDS = Sends()
"""A handler that sent nothing but data (or nothing at all)."""
