"""build.py: an operator instance built from the physical plan, and the job's control trees.

Used by the hosts (deploy, recovery, rescale) and the in-process harness.
"""

from __future__ import annotations

from typing import Any

from chiray.control.trees import Tree, build_tree
from chiray.operators.endpoints import SinkLogic, SourceLogic, assign_splits
from chiray.operators.graph import OperatorKind, PhysicalPlan
from chiray.operators.logic import InstanceInfo

from .channel import InputChannel, OutputChannel
from ..config import JobConfig
from .instance import OperatorFailure, OperatorInstance
from .source import SourceInstance
from .restore import RestoreInfo, restore_keyed
from .router import make_router

__all__ = ["build_instance", "control_trees"]


def control_trees(plan: PhysicalPlan, placement: dict[tuple[str, int], int],
                  fanout: int | None) -> tuple[Tree, Tree]:
    """The broadcast tree over the sources and the aggregation tree over the sinks."""
    kinds = {n.name: n.kind for n in plan.graph.nodes.values()}
    by_host = lambda i: (placement[i], i)  # noqa: E731 - relays then serve leaves of one host
    sources = sorted((i for i in plan.instances if kinds[i[0]] is OperatorKind.SOURCE), key=by_host)
    sinks = sorted((i for i in plan.instances if kinds[i[0]] is OperatorKind.SINK), key=by_host)
    host_of = placement.__getitem__
    return build_tree(sources, fanout, host_of), build_tree(sinks, fanout, host_of)


def build_instance(plan: PhysicalPlan, name: tuple[str, int], config: JobConfig, host: int = 0,
                   restore: RestoreInfo | None = None) -> OperatorInstance:
    """Create one instance of ``plan`` with its channels and routers (restored from a checkpoint if given)."""
    node = plan.graph.nodes[name[0]]
    info = InstanceInfo(node.name, name[1], node.parallelism, node.num_bins)
    if node.kind is OperatorKind.SOURCE:
        assert node.source is not None
        splits = assign_splits(plan.source_splits[node.name], node.parallelism, name[1])
        offsets = restore.source_offsets(node.name) if restore is not None else None
        logic: Any = SourceLogic(node.source, splits, offsets)
    elif node.kind is OperatorKind.SINK:
        assert node.sink is not None
        logic = SinkLogic(node.sink)
    else:
        assert node.make_logic is not None
        code = restore.code_change(node.name, name[1]) if restore is not None else node.code
        try:
            logic = node.make_logic()
            if code is not None:
                logic.replace_code(code.fn, code.on_timer, code.schema)
        except Exception as exc:
            raise OperatorFailure(info, exc) from exc
    inputs = [InputChannel(c.channel_id, c.input_index) for c in plan.inputs_of(name)]
    outs = plan.outputs_of(name)
    outputs, routers, targets = [], [], []
    for edge_index, (down, _, edge) in enumerate(plan.output_edges[node.name]):
        chans = sorted((c for c in outs if c.edge_index == edge_index), key=lambda c: c.dst[1])
        outputs.append([OutputChannel(c.channel_id, config.channel_capacity, config.channel_capacity_bytes)
                        for c in chans])
        targets.append([c.dst for c in chans])
        routers.append(make_router(edge, len(chans), plan.bin_tables.get(down), down, name[1]))
    cls = SourceInstance if node.kind is OperatorKind.SOURCE else OperatorInstance
    instance = cls(info, logic, inputs, outputs, routers, host, targets, node.kind.value)
    if node.kind in (OperatorKind.TRANSFORM, OperatorKind.KEYED):
        instance.code = code
    if restore is not None and node.kind is OperatorKind.KEYED:
        stored = restore.load_bins(node.name, name[1], plan.bin_tables[node.name])
        restore_keyed(logic.state, instance.control.ctx.checkpoint_chains, restore, stored)
    return instance
