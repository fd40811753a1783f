"""channeltable.py: a host's table of channels: which instance owns each end, and where each one goes.

Every channel of the job has an id that is never reused; the table maps it
to the receiving and sending instance's host (and the receiving instance),
and, for the channels whose ends live on this host, to the channel objects
and the instances that own them. A rescale adds channels (``add``) and
reroutes the table to the new plan (``route``); entries of channels that are
gone may stay, their ids are never seen again. Only the owning host touches it.
"""

from __future__ import annotations

from typing import Iterable

from chiray.control.message import InstanceId
from chiray.operators.graph import PhysicalPlan

from .channel import InputChannel, OutputChannel
from .instance import OperatorInstance

__all__ = ["ChannelTable"]


class ChannelTable:
    """The channels of one host's instances and the destination of every channel of the job."""

    def __init__(self, host_id: int) -> None:
        self.host_id = host_id
        # channel -> (the receiving instance here, its end of the channel)
        self.inputs: dict[int, tuple[OperatorInstance, InputChannel]] = {}
        self.outputs: dict[int, OutputChannel] = {}
        self.owner: dict[int, OperatorInstance] = {}  # output channel -> the sending instance here
        self.dst_host: dict[int, int] = {}
        self.dst: dict[int, InstanceId] = {}
        self.src_host: dict[int, int] = {}

    def route(self, plan: PhysicalPlan, placement: dict[InstanceId, int]) -> None:
        """Learn where every channel of ``plan`` goes and comes from under ``placement``."""
        for c in plan.channels:
            self.dst_host[c.channel_id] = placement[c.dst]
            self.dst[c.channel_id] = c.dst
            self.src_host[c.channel_id] = placement[c.src]

    def add(self, inst: OperatorInstance, inputs: Iterable[InputChannel] = (),
            outputs: Iterable[OutputChannel] = ()) -> None:
        """Channels ``inst`` (an instance here) receives on or sends on."""
        for ch in inputs:
            self.inputs[ch.channel] = (inst, ch)
        for och in outputs:
            self.outputs[och.channel] = och
            self.owner[och.channel] = inst

    def add_instance(self, inst: OperatorInstance) -> None:
        """All of ``inst``'s channels."""
        self.add(inst, inst.inputs, inst.output_channels())

    def receiver(self, channel: int, host_id: int) -> tuple[OperatorInstance, InputChannel]:
        """The instance here that receives on ``channel``, and its end of it."""
        entry = self.inputs.get(channel)
        if entry is None:
            raise RuntimeError(f"bug: host {host_id} received channel {channel} it does not own")
        return entry
