"""Tests for actors.placement: the default rule, a fixed host count, pins and their errors (no Ray)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.jobs.placement import place
from chiray.operators import Dataflow, collect, from_items
from chiray.operators.graph import OperatorKind, PhysicalPlan, physical_plan

ROWS = [{"k": f"k{i % 5}", "v": i} for i in range(40)]


def _identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def _plan(src_p: int = 2, map_p: int = 2, keyed_p: tuple[int, ...] = (3,), sink_p: int = 1) -> PhysicalPlan:
    """src -> map -> (count-i per keyed parallelism, each to its own sink) and map -> sink."""
    flow = Dataflow("place")
    src = flow.source(from_items(ROWS, num_splits=2), parallelism=src_p, name="src")
    mapped = src.map(_identity, name="map", parallelism=map_p)
    mapped.sink(collect(), name="rows", parallelism=sink_p)
    for n, p in enumerate(keyed_p):
        counted = mapped.key_by("k").count(name=f"count{n}", parallelism=p)
        counted.sink(collect(), name=f"out{n}", parallelism=sink_p)
    return physical_plan(flow.graph)


def _keyed(plan: PhysicalPlan, op: str) -> bool:
    return plan.graph.nodes[op].kind is OperatorKind.KEYED


SHAPES = [
    (1, 1, (1,), 1),
    (2, 2, (3,), 1),
    (3, 1, (2, 3), 2),
    (1, 3, (1, 2), 3),
    (2, 2, (), 2),
]


@pytest.mark.parametrize("src_p,map_p,keyed_p,sink_p", SHAPES)
def test_default_rule_shares_hosts_one_per_instance_index(src_p, map_p, keyed_p, sink_p):
    plan = _plan(src_p, map_p, keyed_p, sink_p)
    n, placement = place(plan)
    assert n == max(src_p, map_p, sink_p, *keyed_p)
    assert set(placement) == set(plan.instances)
    for (op, i), host in placement.items():
        assert host == (i % n if _keyed(plan, op) else (n - 1 - i) % n), (op, i)
    assert set(placement.values()) <= set(range(n))


@pytest.mark.parametrize("src_p,map_p,keyed_p,sink_p", SHAPES)
def test_without_colocation_keyed_instances_get_hosts_of_their_own(src_p, map_p, keyed_p, sink_p):
    plan = _plan(src_p, map_p, keyed_p, sink_p)
    n, placement = place(plan, colocate=False)
    big_k = max(keyed_p, default=0)
    free = max(src_p, map_p, sink_p)
    assert n == big_k + free
    assert set(placement) == set(plan.instances)
    for (op, i), host in placement.items():
        assert host == (i if _keyed(plan, op) else big_k + i), (op, i)
        assert 0 <= host < n


def test_without_colocation_keyed_instances_are_apart_from_the_rest():
    plan = _plan(src_p=2, map_p=3, keyed_p=(2, 3), sink_p=1)
    n, placement = place(plan, colocate=False)
    keyed_hosts = {h for (op, _), h in placement.items() if _keyed(plan, op)}
    other_hosts = {h for (op, _), h in placement.items() if not _keyed(plan, op)}
    assert keyed_hosts == {0, 1, 2}
    assert other_hosts == {3, 4, 5}
    assert not keyed_hosts & other_hosts
    assert n <= 2 * max(node.parallelism for node in plan.graph.nodes.values())


@pytest.mark.parametrize("colocate", [True, False])
def test_default_rule_keeps_equal_parallelism_forward_chains_on_one_host(colocate):
    plan = _plan(src_p=3, map_p=3, keyed_p=(2,), sink_p=3)
    _, placement = place(plan, colocate=colocate)
    for c in plan.channels:
        src_node, dst_node = plan.graph.nodes[c.src[0]], plan.graph.nodes[c.dst[0]]
        stateless = not src_node.stateful and not dst_node.stateful
        if stateless and src_node.parallelism == dst_node.parallelism:
            assert placement[c.src] == placement[c.dst], c


@pytest.mark.parametrize("num_hosts", [1, 2, 3, 4, 7])
def test_with_num_hosts(num_hosts):
    plan = _plan(src_p=2, map_p=3, keyed_p=(3, 2), sink_p=1)
    n, placement = place(plan, num_hosts)
    assert n == num_hosts
    for (op, i), host in placement.items():
        expected = i % num_hosts if _keyed(plan, op) else (num_hosts - 1 - i) % num_hosts
        assert host == expected, (op, i)


def test_pins_override_the_default_rule():
    plan = _plan(src_p=2, map_p=2, keyed_p=(3,), sink_p=1)
    pins = {"count0": [4, 4, 0], "rows": [2]}
    n, placement = place(plan, pins=pins)
    assert n == 5  # the pins need five hosts; the others follow the rule for five
    assert [placement[("count0", i)] for i in range(3)] == [4, 4, 0]
    assert placement[("rows", 0)] == 2
    _, unpinned = place(plan, num_hosts=n)
    for inst, host in placement.items():
        if inst[0] not in pins:
            assert host == unpinned[inst], inst


def test_pins_beyond_the_default_count_add_hosts():
    plan = _plan(src_p=1, map_p=1, keyed_p=(1,), sink_p=1)
    n, placement = place(plan, pins={"out0": [9]})
    assert n == 10
    assert placement[("out0", 0)] == 9


@pytest.mark.parametrize("num_hosts", [3, 5])
def test_pins_with_num_hosts(num_hosts):
    plan = _plan(src_p=2, map_p=2, keyed_p=(2,), sink_p=1)
    n, placement = place(plan, num_hosts, {"src": [num_hosts - 1, 0]})
    assert n == num_hosts
    assert (placement[("src", 0)], placement[("src", 1)]) == (num_hosts - 1, 0)
    assert placement[("count0", 1)] == 1 % num_hosts
    assert placement[("map", 0)] == num_hosts - 1


def test_pin_unknown_operator():
    plan = _plan()
    with pytest.raises(ValueError) as info:
        place(plan, pins={"nosuch": [0]})
    message = str(info.value)
    assert "unknown operator 'nosuch'" in message
    assert "'count0'" in message and "'src'" in message  # lists the operators


@pytest.mark.parametrize("hosts", [[], [0, 1], [0, 1, 2, 3]])
def test_pin_wrong_length(hosts):
    plan = _plan(keyed_p=(3,))
    with pytest.raises(ValueError) as info:
        place(plan, pins={"count0": hosts})
    message = str(info.value)
    assert "'count0'" in message and "needs 3 host ids" in message and f"got {hosts}" in message


def test_pin_negative_host():
    plan = _plan(keyed_p=(2,))
    with pytest.raises(ValueError, match=r"'count0' needs 2 host ids >= 0, got \[0, -1\]"):
        place(plan, pins={"count0": [0, -1]})


@pytest.mark.parametrize("num_hosts,host", [(1, 1), (3, 3), (3, 10)])
def test_pin_host_out_of_range(num_hosts, host):
    plan = _plan(keyed_p=(1,))
    with pytest.raises(ValueError) as info:
        place(plan, num_hosts, {"out0": [host]})
    message = str(info.value)
    assert f"host {host}" in message and f"num_hosts is {num_hosts}" in message


@pytest.mark.parametrize("host", [1.5, "1"])
def test_pin_host_must_be_an_int(host):
    plan = _plan(keyed_p=(1,))
    with pytest.raises((TypeError, ValueError), match="'out0'"):
        place(plan, pins={"out0": [host]})


# --------------------------------------------------------------------------- through JobConfig


def _flow() -> Dataflow:
    flow = Dataflow("cfg")
    src = flow.source(from_items(ROWS, num_splits=2), parallelism=2, name="src")
    src.key_by("k").count(name="count", parallelism=2).collect(name="out")
    return flow


def test_job_config_placement_pins_the_local_run():
    run = LocalRun(_flow(), JobConfig(placement={"out": [0], "src": [1, 1]}))
    assert run.placement[("out", 0)] == 0
    assert run.placement[("src", 0)] == run.placement[("src", 1)] == 1
    assert len(run.hosts) == 2  # the largest parallelism: instances share hosts
    hosted = sorted((i.info.operator, i.info.index) for h in run.hosts for i in h.instances)
    assert hosted == sorted(run.plan.instances)
    for host in run.hosts:
        for inst in host.instances:
            assert run.placement[(inst.info.operator, inst.info.index)] == host.host_id
    result = run.run()["out"].to_pydict()
    expected = {f"k{j}": sum(1 for r in ROWS if r["k"] == f"k{j}") for j in range(5)}
    assert dict(zip(result["k"], result["count"])) == expected


def test_job_config_num_hosts_reaches_place():
    run = LocalRun(_flow(), JobConfig(num_hosts=1))
    assert len(run.hosts) == 1 and set(run.placement.values()) == {0}
    assert run.run()["out"].num_rows == 5


def test_job_config_bad_pin_fails_before_running():
    with pytest.raises(ValueError, match="unknown operator 'nope'"):
        LocalRun(_flow(), JobConfig(placement={"nope": [0]}))


@pytest.mark.parametrize("field", ["spare_hosts", "warm_hosts"])
def test_idle_host_counts_must_not_be_negative(field):
    with pytest.raises(ValueError, match=f"JobConfig: {field} must be >= 0, got -1"):
        JobConfig(**{field: -1})
