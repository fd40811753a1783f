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

from .channel import InputChannel, OutputChannel
from .instanceview import InstanceView
from .router import HashRouter, make_router


__all__ = ["InstanceChange", "plan_instance_change"]


@dataclasses.dataclass
class InstanceChange:
    """What one existing instance changes when the op passes.

    Attributes:
        outputs: per output edge, the channels after the change (by target position).
        targets: per output edge, the receiving instances after the change.
        added: output channels new with this change.
        removed: output channels to close (their receivers retire).
        inputs: input channels new with this change (they join the op).
        plan: the new plan (for routers).
    """

    outputs: list[list[OutputChannel]]
    targets: list[list[InstanceId]]
    added: list[OutputChannel]
    removed: list[OutputChannel]
    inputs: list[InputChannel]
    plan: PhysicalPlan

    def open_outputs(self, inst: InstanceView) -> None:
        """Before the forward: the op goes on the old and the new channels."""
        for edge, chans in enumerate(self.outputs):
            old = inst.outputs[edge]
            have = {ch.channel for ch in old}
            olds_targets = inst.targets[edge]
            for ch, target in zip(chans, self.targets[edge]):
                if ch.channel not in have:
                    old.append(ch)
                    olds_targets.append(target)

    def close_outputs(self, inst: InstanceView) -> None:
        """After the forward: close the removed channels and rebuild the routers of changed edges."""
        from .messages import End

        for ch in self.removed:
            ch.enqueue(End())
            inst.closed_outputs.append(ch)  # no longer the instance's, but the host still flushes it
        inst.outputs = [list(chs) for chs in self.outputs]
        inst.targets = [list(ts) for ts in self.targets]
        node = self.plan.graph.nodes[inst.info.operator]
        for edge, (down, _, spec) in enumerate(self.plan.output_edges[node.name]):
            old = inst.routers[edge]
            n = len(self.outputs[edge])
            if isinstance(old, HashRouter):
                old.num_targets = n
                continue
            inst.routers[edge] = make_router(spec, n, self.plan.bin_tables.get(down), down, inst.info.index)
        inst.ctx.set_downstream([t for ts in inst.targets for t in ts])


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
    return InstanceChange(outputs, targets, added, removed, inputs, plan)
