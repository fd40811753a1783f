"""topology.py: changing a running job's instances and channels (rescale), one op at a time.

A rescale step is a control op (``control.ops.migrate.MigrateBins``) that the
runtime has been told, before injection, will change the topology: the
driver computes the new plan (``operators.graph.rescaled_plan``), starts any
new hosts, and has every host *prepare* the change under the op's id:

* new instances are built (on new or existing hosts) with all their channels;
* an instance that gains output channels keeps them aside until the op
  completes there; then the op is forwarded on the old *and* the new
  channels, so on every new channel the op is the first message;
* an instance that loses output channels (their receiver retires) forwards
  the op on them, then closes them with ``End``; the retiring instance
  finishes once all its inputs ended, like at the end of a stream;
* an instance that gains input channels receives deliveries on them at once,
  and counts them as inputs of the op that activates them and every later op
  (``ControlProcessor.join``), never of earlier ops, which their senders do
  not see.

Routers of changed edges are rebuilt after the forward (a hash router keeps
its table; the op's handler sets the new one). Only the owning host touches
an instance's pending changes.
"""

from __future__ import annotations

import dataclasses

from chiray.control.message import InstanceId
from chiray.operators.graph import PhysicalPlan

from .change import InstanceChange
from .channel import InputChannel, OutputChannel
from .instanceview import InstanceView


__all__ = ["ChangePrepared", "InstanceChange", "plan_instance_change"]


@dataclasses.dataclass(frozen=True, slots=True)
class ChangePrepared:
    """What a host did to prepare a topology change (``HostCore.prepare_change``).

    Attributes:
        changed: its instances that apply the change when the op passes (they wait for it to finish).
        held: its running sources, changed or not: they stay open until the op has passed them
            (they would otherwise drop it once their input ended, and the instances after them
            would wait for it for ever). A source that had already finished is not among them.
    """

    changed: tuple[InstanceId, ...]
    held: tuple[InstanceId, ...]


def plan_instance_change(inst: InstanceView, plan: PhysicalPlan, capacity: int,
                         capacity_bytes: int) -> InstanceChange | None:
    """The change ``plan`` brings to existing instance ``inst`` (None if its channels stay)."""
    name = inst.name
    if name not in set(plan.instances):
        return None  # retiring: it keeps its channels and ends once every input ended
    current = {ch.channel: ch for ch in inst.output_channels()}
    outputs: list[list[OutputChannel]] = []
    targets: list[list[InstanceId]] = []
    added: list[OutputChannel] = []
    mine = [c for c in plan.channels if c.src == name]
    for edge_index, _ in enumerate(plan.output_edges[name[0]]):
        specs = sorted((c for c in mine if c.edge_index == edge_index), key=lambda c: c.dst[1])
        chans = []
        for c in specs:
            ch = current.get(c.channel_id)
            if ch is None:
                ch = OutputChannel(c.channel_id, capacity, capacity_bytes)
                added.append(ch)
            chans.append(ch)
        outputs.append(chans)
        targets.append([c.dst for c in specs])
    kept = {c.channel_id for c in mine}
    removed = [ch for cid, ch in current.items() if cid not in kept]
    have_inputs = {ch.channel for ch in inst.inputs}
    inputs = [InputChannel(c.channel_id, c.input_index) for c in plan.channels
              if c.dst == name and c.channel_id not in have_inputs]
    if not added and not removed and not inputs:
        return None
    return InstanceChange(tuple(map(tuple, outputs)), tuple(map(tuple, targets)), tuple(added), tuple(removed),
                          tuple(inputs), plan)
