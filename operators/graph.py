"""graph.py: the logical dataflow graph and its physical plan (instances and channels).

A :class:`LogicalGraph` holds :class:`OperatorNode`s connected by
:class:`InputEdge`s. :func:`physical_plan` expands it into operator instances
and the channels between them: one channel per (upstream instance,
downstream instance, input) pair that can carry records. Placement of
instances on host actors is the runtime's business, not this module's.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Iterable

import pyarrow as pa

from .logic import OperatorLogic, Sink, Source, SourceSplit

__all__ = [
    "Partition",
    "OperatorKind",
    "InputEdge",
    "OperatorNode",
    "LogicalGraph",
    "ChannelSpec",
    "PhysicalPlan",
    "physical_plan",
    "initial_bin_table",
    "rescaled_plan",
    "branched_plan",
    "pruned_plan",
]


class Partition(str, enum.Enum):
    """How records of an edge are distributed over the downstream instances."""

    FORWARD = "forward"  # instance i -> instance i (equal parallelism)
    REBALANCE = "rebalance"  # round robin over all downstream instances
    HASH = "hash"  # by the stable hash of a key column, through a bin table


class OperatorKind(str, enum.Enum):
    SOURCE = "source"
    TRANSFORM = "transform"
    KEYED = "keyed"
    SINK = "sink"


@dataclasses.dataclass(frozen=True, slots=True)
class InputEdge:
    """One logical input of an operator.

    Attributes:
        upstream: the upstream operator's name.
        partition: how records are distributed.
        key: the key column for ``HASH`` edges.
        num_bins: the number of bins of the hash edge (the downstream operator's).
        port: which output of the upstream it carries: ``None`` for the main
            output, else a named side output (e.g. a window's ``"late"`` records).
    """

    upstream: str
    partition: Partition
    key: str | None = None
    num_bins: int = 0
    port: str | None = None


@dataclasses.dataclass(slots=True)
class OperatorNode:
    """A logical operator.

    Attributes:
        name: unique within the dataflow.
        kind: source, transform, keyed or sink.
        parallelism: the number of instances.
        inputs: the logical inputs, in input-index order.
        make_logic: builds the per-instance logic (transforms and keyed operators; the
            runtime builds sources and sinks from ``source`` / ``sink``).
        source: the source (sources only).
        sink: the sink (sinks only).
        schema: the output schema if known at build time.
        key: the key column (keyed operators).
        num_bins: the number of key bins (keyed operators).
        origin: the user function and where it was defined, for messages.
        side_outputs: the operator's named side outputs and their schemas (if known).
        uid: the operator's stable identity for checkpoints (``Stream.uid``); its name if not set.
        event_time: it acts on watermarks (windows, window joins, timers): every source upstream of it
            must make watermarks.
        final_by_default: it emits only when its input ends because ``emit`` was left at its default
            (``"final"``): ``submit`` refuses it downstream of a source that never ends (``emission.py``).
        final_fix: how to make such an operator emit before its input ends, for that refusal's message
            (empty: pass ``emit="updates"``, as the aggregations take).
        code: the code an upgrade put in place of the submitted one (an ``upgrade.CodeChange``), or None.
    """

    name: str
    kind: OperatorKind
    parallelism: int
    inputs: list[InputEdge] = dataclasses.field(default_factory=list)
    make_logic: Callable[[], OperatorLogic] | None = None
    source: Source | None = None
    sink: Sink | None = None
    schema: pa.Schema | None = None
    key: str | None = None
    num_bins: int = 0
    origin: str = ""
    side_outputs: dict[str, pa.Schema | None] = dataclasses.field(default_factory=dict)
    uid: str | None = None
    event_time: bool = False
    final_by_default: bool = False
    final_fix: str = ""
    code: Any = None

    @property
    def state_id(self) -> str:
        """What a checkpoint files this operator's state under: its ``uid``, else its name."""
        return self.uid if self.uid is not None else self.name

    @property
    def stateful(self) -> bool:
        return self.kind is OperatorKind.KEYED

    def describe(self) -> str:
        return f"operator {self.name!r}" + (f" ({self.origin})" if self.origin else "")


@dataclasses.dataclass(slots=True)
class LogicalGraph:
    """Operators in the order they were added (a topological order)."""

    name: str
    nodes: dict[str, OperatorNode] = dataclasses.field(default_factory=dict)

    def add(self, node: OperatorNode) -> OperatorNode:
        if node.name in self.nodes:
            raise ValueError(
                f"dataflow {self.name!r}: duplicate operator name {node.name!r}; "
                "operator names must be unique (pass name=... to tell them apart)"
            )
        self.nodes[node.name] = node
        return node

    def consumers(self, name: str) -> list[str]:
        return [n.name for n in self.nodes.values() if any(e.upstream == name for e in n.inputs)]


@dataclasses.dataclass(frozen=True, slots=True)
class ChannelSpec:
    """A physical channel from one upstream instance to one downstream instance.

    Attributes:
        channel_id: unique in the job.
        src: (operator, index) of the sender.
        dst: (operator, index) of the receiver.
        input_index: which logical input of the receiver this channel feeds.
        edge_index: the position of the receiver's edge among the sender's output edges.
    """

    channel_id: int
    src: tuple[str, int]
    dst: tuple[str, int]
    input_index: int
    edge_index: int


@dataclasses.dataclass(frozen=True, slots=True)
class PhysicalPlan:
    """Instances and channels of a job.

    Attributes:
        graph: the logical graph.
        instances: every (operator, index), operators in topological order.
        channels: every channel.
        output_edges: per operator, its consumers' (operator, input index, edge) in order.
        bin_tables: per keyed operator, the initial bin -> instance table.
        source_splits: per source, its splits (computed once, on the driver).
        next_channel_id: the lowest channel id never used in the job (rescales add channels).
    """

    graph: LogicalGraph
    instances: list[tuple[str, int]]
    channels: list[ChannelSpec]
    output_edges: dict[str, list[tuple[str, int, InputEdge]]]
    bin_tables: dict[str, list[int]]
    source_splits: dict[str, list[SourceSplit]] = dataclasses.field(default_factory=dict)
    next_channel_id: int = 0

    def inputs_of(self, instance: tuple[str, int]) -> list[ChannelSpec]:
        return [c for c in self.channels if c.dst == instance]

    def outputs_of(self, instance: tuple[str, int]) -> list[ChannelSpec]:
        return [c for c in self.channels if c.src == instance]


def initial_bin_table(num_bins: int, parallelism: int) -> list[int]:
    """Contiguous ranges of bins per instance: bin b -> b * parallelism // num_bins."""
    return [b * parallelism // num_bins for b in range(num_bins)]


def _edge_pairs(edge: InputEdge, up_p: int, down_p: int) -> list[tuple[int, int]]:
    if edge.partition is Partition.FORWARD and up_p == down_p:
        return [(i, i) for i in range(up_p)]
    return [(i, j) for i in range(up_p) for j in range(down_p)]


def physical_plan(graph: LogicalGraph) -> PhysicalPlan:
    """Expand ``graph`` into instances and channels.

    A ``FORWARD`` edge between operators of different parallelism becomes a
    ``REBALANCE`` edge.
    """
    channels = physical_plan_channels(graph)
    instances = [(n.name, i) for n in graph.nodes.values() for i in range(n.parallelism)]
    output_edges: dict[str, list[tuple[str, int, InputEdge]]] = {n: [] for n in graph.nodes}
    for node in graph.nodes.values():
        for input_index, edge in enumerate(node.inputs):
            output_edges[edge.upstream].append((node.name, input_index, edge))
    bin_tables = {
        n.name: initial_bin_table(n.num_bins, n.parallelism)
        for n in graph.nodes.values()
        if n.kind is OperatorKind.KEYED
    }
    source_splits = {}
    for n in graph.nodes.values():
        if n.kind is OperatorKind.SOURCE:
            assert n.source is not None
            try:
                source_splits[n.name] = list(n.source.splits())
            except Exception as exc:
                raise type(exc)(f"{n.describe()}: listing the source's splits failed: {exc}") from exc
    return PhysicalPlan(graph, instances, channels, output_edges, bin_tables, source_splits, len(channels))


def describe_callable(fn: Any) -> str:
    """``qualname (file:line)`` of a user function, for error messages."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    code = getattr(fn, "__code__", None)
    if code is None:
        return str(name)
    return f"{name} at {code.co_filename}:{code.co_firstlineno}"


def rescaled_plan(plan: PhysicalPlan, operator: str, parallelism: int,
                  table: list[int] | None = None) -> PhysicalPlan:
    """``plan`` with ``operator`` at ``parallelism`` (and, if keyed, bin table ``table``).

    Channels that still connect the same instances on the same edge keep their
    ids; new channels get ids above every id ``plan`` ever used, so a channel
    id is never reused within a job. Edges that become ``FORWARD`` between
    different parallelisms turn into ``REBALANCE`` (and stay so).
    """
    graph = LogicalGraph(plan.graph.name)
    for node in plan.graph.nodes.values():
        graph.add(dataclasses.replace(node, inputs=list(node.inputs),
                                      parallelism=parallelism if node.name == operator else node.parallelism))
    bin_tables = dict(plan.bin_tables)
    if graph.nodes[operator].kind is OperatorKind.KEYED:
        if table is None or len(table) != graph.nodes[operator].num_bins:
            raise ValueError(f"rescaling keyed operator {operator!r} needs a table of "
                             f"{graph.nodes[operator].num_bins} bins")
        bin_tables[operator] = list(table)
    return _replanned(plan, graph, bin_tables)


def branched_plan(plan: PhysicalPlan, added: list[OperatorNode]) -> PhysicalPlan:
    """``plan`` with the operators ``added`` (a branch: new operators and sinks fed by running ones), each new
    keyed operator with its initial bin table; the running channels keep their ids and edge positions (the
    branch's edges come after an upstream's running ones)."""
    graph = LogicalGraph(plan.graph.name)
    for node in plan.graph.nodes.values():
        graph.add(dataclasses.replace(node, inputs=list(node.inputs)))
    for node in added:
        graph.add(dataclasses.replace(node, inputs=list(node.inputs)))
    bin_tables = dict(plan.bin_tables)
    for node in added:
        if node.kind is OperatorKind.KEYED:
            bin_tables[node.name] = initial_bin_table(node.num_bins, node.parallelism)
    return _replanned(plan, graph, bin_tables)


def pruned_plan(plan: PhysicalPlan, removed: Iterable[str]) -> PhysicalPlan:
    """``plan`` without the operators ``removed`` (a branch: a sink and the operators that feed only it); the
    channels that stay keep their ids, the edges after a removed one move up."""
    gone = set(removed)
    graph = LogicalGraph(plan.graph.name)
    for node in plan.graph.nodes.values():
        if node.name not in gone:
            graph.add(dataclasses.replace(node, inputs=list(node.inputs)))
    return _replanned(plan, graph, {op: t for op, t in plan.bin_tables.items() if op not in gone})


def _replanned(plan: PhysicalPlan, graph: LogicalGraph, bin_tables: dict[str, list[int]]) -> PhysicalPlan:
    """The plan of ``graph``, a changed ``plan.graph``: its channels keep their ids where they connect the same
    instances on the same edge, new ones get ids ``plan`` never used."""
    fresh = physical_plan_channels(graph)
    # (src, dst, input_index) names a channel: an edge's position among its upstream's may change (a branch
    # removed before it), its channels' ids do not
    old_ids = {(c.src, c.dst, c.input_index): c.channel_id for c in plan.channels}
    next_id = max((c.channel_id for c in plan.channels), default=-1) + 1
    next_id = max(next_id, plan.next_channel_id)
    channels = []
    for c in fresh:
        cid = old_ids.get((c.src, c.dst, c.input_index))
        if cid is None:
            cid, next_id = next_id, next_id + 1
        channels.append(dataclasses.replace(c, channel_id=cid))
    instances = [(n.name, i) for n in graph.nodes.values() for i in range(n.parallelism)]
    output_edges: dict[str, list[tuple[str, int, InputEdge]]] = {n: [] for n in graph.nodes}
    for node in graph.nodes.values():
        for input_index, edge in enumerate(node.inputs):
            output_edges[edge.upstream].append((node.name, input_index, edge))
    return PhysicalPlan(graph, instances, channels, output_edges, bin_tables, dict(plan.source_splits), next_id)


def physical_plan_channels(graph: LogicalGraph) -> list[ChannelSpec]:
    """The channels of ``graph``, numbered from 0 (``FORWARD`` edges between different
    parallelisms become ``REBALANCE`` in ``graph``)."""
    channels: list[ChannelSpec] = []
    edge_counts: dict[str, int] = {n: 0 for n in graph.nodes}
    for node in graph.nodes.values():
        for input_index, edge in enumerate(node.inputs):
            up = graph.nodes[edge.upstream]
            if edge.partition is Partition.FORWARD and up.parallelism != node.parallelism:
                edge = dataclasses.replace(edge, partition=Partition.REBALANCE)
                node.inputs[input_index] = edge
            edge_index = edge_counts[up.name]
            edge_counts[up.name] += 1
            for i, j in _edge_pairs(edge, up.parallelism, node.parallelism):
                channels.append(ChannelSpec(len(channels), (up.name, i), (node.name, j), input_index, edge_index))
    return channels
