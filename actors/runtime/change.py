"""change.py: ``InstanceChange``, what one existing instance changes when a rescale's op passes it.

Computed by ``topology.plan_instance_change`` when a host prepares the change,
held by the instance's control port under the op's id, and applied by its
outputs (``outputs.InstanceOutputs.apply_change``) when the op completes there.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from chiray.control.message import InstanceId
from chiray.operators.graph import PhysicalPlan
from chiray.operators.logic import InstanceInfo

from .channel import InputChannel, OutputChannel
from .router import HashRouter, Router, make_router

__all__ = ["InstanceChange"]


@dataclasses.dataclass(frozen=True)
class InstanceChange:
    """What one existing instance changes when the op passes: data that its outputs apply
    (``InstanceOutputs.apply_change``) when the op completes there.

    Attributes:
        outputs: per output edge, the channels after the change (by target position).
        targets: per output edge, the receiving instances after the change.
        added: output channels new with this change.
        removed: output channels to close (their receivers retire).
        inputs: input channels new with this change (they join the op).
        plan: the new plan (for routers).
    """

    outputs: tuple[tuple[OutputChannel, ...], ...]
    targets: tuple[tuple[InstanceId, ...], ...]
    added: tuple[OutputChannel, ...]
    removed: tuple[OutputChannel, ...]
    inputs: tuple[InputChannel, ...]
    plan: PhysicalPlan

    def during(self, outputs: list[list[OutputChannel]], targets: list[list[InstanceId]]
               ) -> tuple[list[list[OutputChannel]], list[list[InstanceId]]]:
        """The outputs and targets the op is forwarded on: the current ones and the new ones."""
        outs, tgts = [list(chs) for chs in outputs], [list(ts) for ts in targets]
        while len(outs) < len(self.outputs):  # an edge new with the change (a branch added downstream)
            outs.append([])
            tgts.append([])
        have = {ch.channel for chs in outs for ch in chs}  # by id: an edge may have moved up (a branch removed)
        for edge, chans in enumerate(self.outputs):
            for ch, target in zip(chans, self.targets[edge]):
                if ch.channel not in have:
                    outs[edge].append(ch)
                    tgts[edge].append(target)
        return outs, tgts

    def after(self) -> tuple[list[list[OutputChannel]], list[list[InstanceId]]]:
        """The outputs and targets once the op went on (the removed channels are closed)."""
        return [list(chs) for chs in self.outputs], [list(ts) for ts in self.targets]

    def dropped_edges(self, edges: list[list[OutputChannel]]) -> list[int]:
        """The positions of the current output ``edges`` that the change removes whole (a branch removed
        downstream): every one of their channels closes."""
        removed = {ch.channel for ch in self.removed}
        return [i for i, chans in enumerate(edges) if chans and all(ch.channel in removed for ch in chans)]

    def routers(self, current: list[Router], info: InstanceInfo, dropped: Sequence[int] = ()) -> list[Router]:
        """The routers after the change: those of the ``dropped`` edges go (the edges after them move up), a
        hash router keeps its table (the op's handler sets the new one) and learns its new number of
        targets; the others are rebuilt."""
        gone = set(dropped)
        out = [r for i, r in enumerate(current) if i not in gone]
        for edge, (down, _, spec) in enumerate(self.plan.output_edges[info.operator]):
            n = len(self.outputs[edge])
            if edge == len(out):  # an edge new with the change
                out.append(make_router(spec, n, self.plan.bin_tables.get(down), down, info.index))
            elif isinstance(out[edge], HashRouter):
                out[edge].num_targets = n
            else:
                out[edge] = make_router(spec, n, self.plan.bin_tables.get(down), down, info.index)
        return out
