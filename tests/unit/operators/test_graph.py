"""Tests for operators.graph: physical_plan's instances and channels, bin tables, source splits."""

from __future__ import annotations

import collections
from typing import Any

import pyarrow as pa
import pytest

from chiray.operators import Dataflow, collect, from_items
from chiray.operators.graph import OperatorKind, Partition, PhysicalPlan, initial_bin_table, physical_plan
from chiray.operators.logic import Source, SourceSplit, SplitReader
from chiray.operators.sources import ArrowSource

ROWS = [{"k": "a", "v": 1}, {"k": "b", "v": 2}]


def _identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def _pairs(plan: PhysicalPlan, src: str, dst: str) -> list[tuple[int, int]]:
    return sorted((c.src[1], c.dst[1]) for c in plan.channels if c.src[0] == src and c.dst[0] == dst)


def _all_to_all(up: int, down: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(up) for j in range(down)]


def _check_invariants(plan: PhysicalPlan) -> None:
    """What holds for every plan: ids 0..n-1, channels between existing instances, no duplicate triple."""
    assert [c.channel_id for c in plan.channels] == list(range(len(plan.channels)))
    instances = set(plan.instances)
    assert len(instances) == len(plan.instances)
    triples = [(c.src, c.dst, c.input_index) for c in plan.channels]
    assert len(set(triples)) == len(triples)
    for c in plan.channels:
        assert c.src in instances and c.dst in instances
        node = plan.graph.nodes[c.dst[0]]
        assert node.inputs[c.input_index].upstream == c.src[0]
        down, input_index, edge = plan.output_edges[c.src[0]][c.edge_index]
        assert (down, input_index) == (c.dst[0], c.input_index)
        assert edge == node.inputs[c.input_index]


# --------------------------------------------------------------------------- edges


@pytest.mark.parametrize("p", [1, 2, 3])
def test_forward_with_equal_parallelism_is_one_channel_per_instance(p):
    flow = Dataflow("f")
    src = flow.source(from_items(ROWS), parallelism=p, name="src")
    src.map(_identity, name="m").sink(collect(), name="out")
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    assert _pairs(plan, "src", "m") == [(i, i) for i in range(p)]
    assert _pairs(plan, "m", "out") == [(i, i) for i in range(p)]
    assert len(plan.channels) == 2 * p
    assert plan.graph.nodes["m"].inputs[0].partition is Partition.FORWARD
    assert plan.instances == [(n, i) for n in ("src", "m", "out") for i in range(p)]


@pytest.mark.parametrize("up,down", [(1, 2), (2, 1), (2, 3), (3, 2)])
def test_forward_with_different_parallelism_becomes_rebalance(up, down):
    flow = Dataflow("f")
    src = flow.source(from_items(ROWS), parallelism=up, name="src")
    src.map(_identity, name="m", parallelism=down).collect(name="out")
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    assert _pairs(plan, "src", "m") == _all_to_all(up, down)
    edge = plan.graph.nodes["m"].inputs[0]
    assert edge.partition is Partition.REBALANCE
    assert plan.output_edges["src"] == [("m", 0, edge)]
    # collect() has parallelism 1: from m it is a rebalance too, unless m has one instance
    assert _pairs(plan, "m", "out") == _all_to_all(down, 1)
    expected = Partition.FORWARD if down == 1 else Partition.REBALANCE
    assert plan.graph.nodes["out"].inputs[0].partition is expected


def test_physical_plan_is_idempotent():
    flow = Dataflow("f")
    src = flow.source(from_items(ROWS), parallelism=2, name="src")
    src.map(_identity, parallelism=3).key_by("k").count(parallelism=2).collect()
    first = physical_plan(flow.graph)
    second = physical_plan(flow.graph)
    assert first.channels == second.channels
    assert first.instances == second.instances
    assert first.output_edges == second.output_edges
    assert first.bin_tables == second.bin_tables


@pytest.mark.parametrize("up,down", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_hash_edges_are_all_to_all(up, down):
    flow = Dataflow("f", num_bins=16)
    src = flow.source(from_items(ROWS), parallelism=up, name="src")
    src.key_by("k").count(name="c", parallelism=down).sink(collect(), name="out")
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    assert _pairs(plan, "src", "c") == _all_to_all(up, down)
    edge = plan.graph.nodes["c"].inputs[0]
    assert (edge.partition, edge.key, edge.num_bins) == (Partition.HASH, "k", 16)
    assert _pairs(plan, "c", "out") == [(i, i) for i in range(down)]  # sink inherits c's parallelism
    assert plan.bin_tables == {"c": initial_bin_table(16, down)}


def test_fan_out_numbers_the_output_edges():
    flow = Dataflow("f")
    src = flow.source(from_items(ROWS), parallelism=2, name="src")
    src.map(_identity, name="a").collect(name="out-a")
    src.key_by("k").count(name="b", parallelism=3).collect(name="out-b")
    src.sink(collect(), name="out-c")
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    assert [(d, i) for d, i, _ in plan.output_edges["src"]] == [("a", 0), ("b", 0), ("out-c", 0)]
    by_edge = collections.defaultdict(list)
    for c in plan.outputs_of(("src", 1)):
        by_edge[c.edge_index].append((c.dst, c.input_index))
    assert by_edge == {
        0: [(("a", 1), 0)],
        1: [(("b", j), 0) for j in range(3)],
        2: [(("out-c", 1), 0)],
    }
    assert len(plan.outputs_of(("src", 0))) == 1 + 3 + 1


def test_union_numbers_the_inputs():
    flow = Dataflow("f")
    a = flow.source(from_items(ROWS), parallelism=2, name="a")
    b = flow.source(from_items(ROWS), parallelism=1, name="b")
    c = flow.source(from_items(ROWS), parallelism=2, name="c")
    a.union(b, c, name="u").collect(name="out")
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    node = plan.graph.nodes["u"]
    assert node.parallelism == 2  # the largest input's
    assert [e.upstream for e in node.inputs] == ["a", "b", "c"]
    assert [e.partition for e in node.inputs] == [Partition.FORWARD, Partition.REBALANCE, Partition.FORWARD]
    for j in range(2):
        got = sorted((c.src, c.input_index, c.edge_index) for c in plan.inputs_of(("u", j)))
        assert got == [(("a", j), 0, 0), (("b", 0), 1, 0), (("c", j), 2, 0)]


def test_union_of_a_stream_with_itself_gets_two_inputs_and_two_edges():
    flow = Dataflow("f")
    a = flow.source(from_items(ROWS), parallelism=2, name="a")
    a.union(a, name="u").collect(name="out")
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    assert [(d, i) for d, i, _ in plan.output_edges["a"]] == [("u", 0), ("u", 1)]
    assert sorted((c.src, c.dst, c.input_index, c.edge_index) for c in plan.outputs_of(("a", 0))) == [
        (("a", 0), ("u", 0), 0, 0), (("a", 0), ("u", 0), 1, 1)]


def test_inputs_of_and_outputs_of_partition_the_channels():
    flow = Dataflow("f")
    src = flow.source(from_items(ROWS), parallelism=2, name="src")
    src.map(_identity, parallelism=3).key_by("k").count(parallelism=2).union(src).collect()
    plan = physical_plan(flow.graph)
    _check_invariants(plan)
    ins = [c for inst in plan.instances for c in plan.inputs_of(inst)]
    outs = [c for inst in plan.instances for c in plan.outputs_of(inst)]
    assert sorted(c.channel_id for c in ins) == list(range(len(plan.channels)))
    assert sorted(c.channel_id for c in outs) == list(range(len(plan.channels)))
    sources = [i for i in plan.instances if plan.graph.nodes[i[0]].kind is OperatorKind.SOURCE]
    assert all(not plan.inputs_of(i) for i in sources)


def test_instances_follow_topological_order():
    flow = Dataflow("f")
    src = flow.source(from_items(ROWS), parallelism=2, name="src")
    src.map(_identity, name="m", parallelism=1).key_by("k").count(name="c", parallelism=3).collect(name="out")
    plan = physical_plan(flow.graph)
    assert plan.instances == [("src", 0), ("src", 1), ("m", 0), ("c", 0), ("c", 1), ("c", 2), ("out", 0)]
    position = {inst: n for n, inst in enumerate(plan.instances)}
    assert all(position[c.src] < position[c.dst] for c in plan.channels)


# --------------------------------------------------------------------------- bin tables


@pytest.mark.parametrize("num_bins,parallelism", [
    (b, p) for b in (1, 2, 4, 16, 256, 4096) for p in (1, 2, 3, 5, 7, 16) if p <= b])
def test_initial_bin_table_is_contiguous_and_balanced(num_bins, parallelism):
    table = initial_bin_table(num_bins, parallelism)
    assert len(table) == num_bins
    assert table == sorted(table)  # contiguous ranges, in instance order
    counts = collections.Counter(table)
    assert sorted(counts) == list(range(parallelism))  # every instance owns a range
    assert max(counts.values()) - min(counts.values()) <= 1
    assert table[0] == 0 and table[-1] == parallelism - 1


def test_initial_bin_table_with_more_instances_than_bins():
    table = initial_bin_table(2, 4)
    assert table == sorted(table) and len(table) == 2
    assert len(set(table)) == 2 and all(0 <= t < 4 for t in table)


def test_bin_tables_only_for_keyed_operators():
    flow = Dataflow("f", num_bins=8)
    src = flow.source(from_items(ROWS), parallelism=2, name="src")
    src.key_by("k").count(name="c", parallelism=3).collect(name="out")
    src.key_by("k", num_bins=32).process(lambda k, r, s: None, name="p", parallelism=2).collect(name="o2")
    plan = physical_plan(flow.graph)
    assert plan.bin_tables == {"c": initial_bin_table(8, 3), "p": initial_bin_table(32, 2)}


# --------------------------------------------------------------------------- source splits


class CountingSource(Source):
    """A source that counts ``splits()`` calls (they must happen once, on the driver)."""

    def __init__(self, num_splits: int, fail: bool = False) -> None:
        self.inner = from_items([{"x": i} for i in range(10)], num_splits=num_splits)
        self.calls = 0
        self.fail = fail

    def schema(self) -> pa.Schema | None:
        return self.inner.schema()

    def splits(self) -> list[SourceSplit]:
        self.calls += 1
        if self.fail:
            raise OSError("bucket not found")
        return self.inner.splits()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return self.inner.open_split(split, offset)

    def describe(self) -> str:
        return "counting"


@pytest.mark.parametrize("num_splits,parallelism", [(1, 1), (3, 2), (2, 3)])
def test_source_splits_are_listed_once(num_splits, parallelism):
    flow = Dataflow("f")
    source = CountingSource(num_splits)
    flow.source(source, parallelism=parallelism, name="src").map(_identity).collect()
    other = from_items(ROWS, num_splits=2)
    flow.source(other, name="src2").collect()
    plan = physical_plan(flow.graph)
    assert source.calls == 1
    assert [s.split_id for s in plan.source_splits["src"]] == [s.split_id for s in source.inner.splits()]
    assert len(plan.source_splits["src"]) == num_splits
    assert plan.source_splits["src2"] == other.splits()
    assert set(plan.source_splits) == {"src", "src2"}


def test_failing_split_listing_names_the_source_operator():
    flow = Dataflow("f")
    flow.source(CountingSource(2, fail=True), name="lake").collect()
    with pytest.raises(OSError) as info:
        physical_plan(flow.graph)
    message = str(info.value)
    assert "'lake'" in message and "counting" in message and "bucket not found" in message
    assert isinstance(info.value.__cause__, OSError)


def test_from_items_source_is_an_arrow_source_with_row_ranges():
    source = from_items([{"x": i} for i in range(10)], num_splits=3)
    assert isinstance(source, ArrowSource)
    assert [s.payload for s in source.splits()] == [(0, 3), (3, 6), (6, 10)]
