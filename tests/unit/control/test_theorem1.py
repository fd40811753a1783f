"""Chi Theorem 1 on random DAGs, blocking ops as consistent cuts, non-blocking ops never blocking.

Random dataflows (several sources with several splits, parallelism 1-3,
maps, filters, keyed operators, unions, fan-out to several sinks, channel
capacity 1-3, 1-5 hosts, flat and tree control) run in ``LocalRun`` with
shuffled and duplicated cross-host deliveries, while the sources keep
emitting small batches. Control ops (blocking and non-blocking, some with
extra meta-topology edges, several at once) are injected while data flows.
A recording op logs every instance-side handler call; the checks:

* every op terminates (its ``OpRun`` is ``COMPLETE``) and completes exactly
  once at every instance, with handlers in order begin, next per expected
  input, complete, dispose;
* for every edge u -> v of the instance graph and every extra edge of the
  op, u's ``on_complete`` precedes v's (Theorem 1, part 2);
* every instance completes the ops in their global injection order;
* a blocking op is a consistent cut: at its ``on_complete`` each operator has
  processed exactly the records that the sources emitted before the op (the
  sources' offsets at their own ``on_complete``) and that its inputs pass,
  computed by a plain Python loop over the sources' rows;
* a non-blocking op never blocks a channel, and data keeps flowing through
  it;
* afterwards the sources run to the end and every sink holds exactly the
  records the oracle says reach it (control ops change no data);
* with sources ending while ops travel, every op still terminates, an op
  that completed at u completes after it at every v downstream, and each
  instance completes a prefix of the global order.

Fixed shapes cover what random ones hit only by chance: a blocking op
aligned behind an op still waiting on an extra edge, data overtaking a
non-blocking op, and an extra edge from an instance that already finished.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.control.message import CONTROLLER, InstanceId
from chiray.control.oprun import OpState
from chiray.operators import Dataflow, Stream, collect
from chiray.operators.endpoints import assign_splits

from .support import (
    SEQ_SCHEMA, Event, Recording, SeqSource, all_instances, completions, emitted_before, instance_edges,
    ops_done, run_until, track,
)

Record = tuple[int, int]  # (split, seq)


# --------------------------------------------------------------------------- random dataflows


def _above(threshold: int):
    def keep(batch: pa.RecordBatch) -> pa.Array:
        return pc.greater(batch.column("value"), threshold)
    return keep


def _passthrough(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
    state.value = (state.value or 0) + rows.num_rows
    return rows


@dataclasses.dataclass
class Node:
    kind: str  # source, map, filter, keyed, union, sink
    inputs: list[str]
    threshold: int | None = None


@dataclasses.dataclass
class Dag:
    """A dataflow and what each of its operators does, for the oracle."""

    flow: Dataflow
    sources: dict[str, SeqSource] = dataclasses.field(default_factory=dict)
    nodes: dict[str, Node] = dataclasses.field(default_factory=dict)

    def value(self, record: Record) -> int:
        split, seq = record
        for src in self.sources.values():
            if split in src.split_numbers:
                return src.value(split, seq)
        raise KeyError(split)

    def outputs(self, cut: dict[int, int] | None = None) -> dict[str, collections.Counter]:
        """Per operator, the multiset of records it emits given the sources' ``cut`` (None: all rows)."""
        out: dict[str, collections.Counter] = {}
        for name, node in self.nodes.items():  # insertion order is topological
            if node.kind == "source":
                src = self.sources[name]
                records: collections.Counter = collections.Counter()
                for split in src.split_numbers:
                    n = src.total(split) if cut is None else cut.get(split, 0)
                    records.update((split, seq) for seq in range(n))
            else:
                records = sum((out[i] for i in node.inputs), collections.Counter())
                if node.kind == "filter":
                    records = collections.Counter(
                        {r: k for r, k in records.items() if self.value(r) > node.threshold})
            out[name] = records
        return out

    def inputs(self, name: str, outputs: dict[str, collections.Counter]) -> collections.Counter:
        """The multiset of records operator ``name`` takes in."""
        return sum((outputs[i] for i in self.nodes[name].inputs), collections.Counter())


def random_dag(rng: random.Random, hold_end: bool = True) -> Dag:
    flow = Dataflow(f"dag-{rng.randrange(10 ** 6)}", num_bins=rng.choice([4, 16]))
    dag = Dag(flow)
    streams: dict[str, Stream] = {}
    first_split = 0
    for i in range(rng.randint(1, 3)):
        name = f"s{i}"
        n_splits = rng.randint(1, 3)
        src = SeqSource([rng.randint(15, 45) for _ in range(n_splits)], batch_size=rng.randint(1, 4),
                        seed=rng.randrange(1000), hold_end=hold_end, name=name, first_split=first_split)
        first_split += n_splits
        # at most one instance per split: an instance without a split ends at once
        streams[name] = flow.source(src, parallelism=rng.randint(1, n_splits), name=name)
        dag.sources[name] = src
        dag.nodes[name] = Node("source", [])
    for j in range(rng.randint(2, 6)):
        kind = rng.choice(["map", "map", "filter", "keyed", "union"])
        if kind == "union" and len(streams) < 2:
            kind = "map"
        name, p = f"{kind}{j}", rng.randint(1, 3)
        if kind == "union":
            ins = rng.sample(sorted(streams), rng.randint(2, min(3, len(streams))))
            stream = streams[ins[0]].union(*(streams[i] for i in ins[1:]), name=name, parallelism=p)
            dag.nodes[name] = Node("union", ins)
        else:
            up = rng.choice(sorted(streams))
            if kind == "map":
                stream = streams[up].map(track, params={}, name=name, parallelism=p, schema=SEQ_SCHEMA)
                dag.nodes[name] = Node("map", [up])
            elif kind == "filter":
                threshold = rng.randint(10, 80)
                stream = streams[up].filter(_above(threshold), name=name, parallelism=p)
                dag.nodes[name] = Node("filter", [up], threshold)
            else:
                key = rng.choice(["seq", "value", "split"])
                stream = streams[up].key_by(key).process(_passthrough, name=name, parallelism=p,
                                                         schema=SEQ_SCHEMA)
                dag.nodes[name] = Node("keyed", [up])
        streams[name] = stream
    consumed = {i for node in dag.nodes.values() for i in node.inputs}
    for name in list(streams):
        if name not in consumed or rng.random() < 0.2:
            sink = f"out-{name}"
            streams[name].sink(collect(), name=sink, parallelism=rng.randint(1, 3))
            dag.nodes[sink] = Node("sink", [name])
    return dag


def random_config(rng: random.Random) -> JobConfig:
    return JobConfig(channel_capacity=rng.choice([1, 1, 2, 3]), num_hosts=rng.choice([None, 1, 2, 3, 5]),
                     control_fanout=rng.choice([None, 2, 3]))


# --------------------------------------------------------------------------- running ops


@dataclasses.dataclass
class Injected:
    tag: str
    op: Recording
    run: Any


def inject_while_flowing(run: LocalRun, rng: random.Random, log: list, n_ops: int,
                         blocking: Any = None, extra_edges: bool = True,
                         check_each_step: Any = None) -> list[Injected]:
    """Inject ``n_ops`` recording ops at random moments (sometimes several at once) while data flows."""
    instances = list(run.plan.instances)  # operators in topological order
    injected: list[Injected] = []
    for k in range(n_ops):
        for _ in range(rng.choice([0, 0, 1, 5, 20, 60, 150])):
            run.step_all()
            if check_each_step:
                check_each_step()
        is_blocking = rng.random() < 0.6 if blocking is None else blocking
        extra: list[tuple[InstanceId, InstanceId]] = []
        if extra_edges and rng.random() < 0.4:
            for _ in range(rng.randint(1, 2)):
                i, j = sorted(rng.sample(range(len(instances)), 2))
                if instances[i][0] != instances[j][0]:  # forward in topological order: G' stays acyclic
                    extra.append((instances[i], instances[j]))
            extra = sorted(set(extra))
        tag = f"op{k}"
        op = Recording(log, tag, blocking=is_blocking, extra=extra)
        injected.append(Injected(tag, op, run.run_control(op)))
    for _ in range(200_000):
        if ops_done(*(i.run for i in injected))():
            break
        run.step_all()
        if check_each_step:
            check_each_step()
    return injected


def _expected_inputs(run: LocalRun, inst: InstanceId, extra: list) -> int:
    instance = run.instance(inst)
    return len(instance.inputs) + int(instance.is_source) + sum(1 for _, v in extra if v == inst)


def check_theorem1(run: LocalRun, log: list[Event], injected: list[Injected]) -> None:
    edges = instance_edges(run)
    instances = set(run.plan.instances)
    sinks = {i for i in instances if not run.instance(i).outputs}
    for inj in injected:
        assert inj.run.state is OpState.COMPLETE, f"{inj.tag}: {inj.run.state} {inj.run.error!r}"
        assert inj.run.result == {s: (s, inj.tag) for s in sinks}, "each sink returns what it attached"
        done = completions(log, inj.tag)
        assert set(done) == instances, f"{inj.tag} did not complete at {sorted(instances - set(done))}"
        for u, v in edges | set(inj.op.extra):
            assert done[u] < done[v], f"{inj.tag}: {v} completed before its upstream {u} (edge {u} -> {v})"
        # handler order and arrivals at each instance
        per: dict[InstanceId, list[Event]] = collections.defaultdict(list)
        for e in log:
            if e.tag == inj.tag:
                per[e.instance].append(e)
        for inst, evs in per.items():
            k = _expected_inputs(run, inst, inj.op.extra)
            expected_events = ["begin"] + ["next"] * k + ["complete", "dispose"]
            assert [e.event for e in evs] == expected_events, (inj.tag, inst)
            for e in evs:
                if e.event == "next":
                    expected = None if e.sender == CONTROLLER else (e.sender, inj.tag)
                    assert e.payload == expected, f"{inst} got {e.payload!r} from {e.sender}"
    # every instance completes the ops in the one global order
    order = [inj.tag for inj in injected]
    per_instance: dict[InstanceId, list[str]] = collections.defaultdict(list)
    for e in log:
        if e.event == "complete":
            per_instance[e.instance].append(e.tag)
    for inst, tags in per_instance.items():
        assert tags == order, f"{inst} completed ops in order {tags}, injected as {order}"


def check_consistent_cut(run: LocalRun, dag: Dag, log: list[Event], tag: str) -> int:
    """At a blocking op's completion every operator processed exactly the records before the sources' cut.

    A source instance that finished before the op reached it emitted all its
    rows before the op. Operators with an instance that finished before the op
    reached it are skipped (that instance processed everything, the others
    stopped at the cut). Returns how many records the cut holds.
    """
    cut = emitted_before(log, tag)
    at_complete = {e.instance: e for e in log if e.tag == tag and e.event == "complete"}
    for name, src in dag.sources.items():
        p = run.plan.graph.nodes[name].parallelism
        for index in range(p):
            if (name, index) not in at_complete:
                assert run.instance((name, index)).finished, f"{tag} never completed at live {name}[{index}]"
                for split in assign_splits(run.plan.source_splits[name], p, index):
                    cut[split.payload] = src.total(split.payload)
    outputs = dag.outputs(cut)
    for name, node in dag.nodes.items():
        if node.kind == "source":
            continue
        p = run.plan.graph.nodes[name].parallelism
        events = [at_complete[(name, i)] for i in range(p) if (name, i) in at_complete]
        if len(events) < p:
            continue
        expected = dag.inputs(name, outputs)
        got = sum(e.records_in for e in events)
        assert got == sum(expected.values()), (
            f"{tag}: {name} had processed {got} records at the op, the sources emitted "
            f"{sum(expected.values())} for it before the op")
        if node.kind == "map":
            seen = frozenset().union(*(e.seen or frozenset() for e in events))
            assert seen == set(expected), (
                f"{tag}: {name} processed {sorted(seen - set(expected))[:5]} after the cut, "
                f"missed {sorted(set(expected) - seen)[:5]}")
    return sum(cut.values())


def finish_and_check_outputs(run: LocalRun, dag: Dag, max_rounds: int = 300_000) -> None:
    for src in dag.sources.values():
        src.hold_end = False
    check_outputs(dag, run.run(max_rounds=max_rounds))


def check_outputs(dag: Dag, results: dict[str, pa.Table]) -> None:
    """Every sink holds exactly the records the oracle says reach it."""
    outputs = dag.outputs()
    for name, node in dag.nodes.items():
        if node.kind == "sink":
            table = results[name]
            got = collections.Counter(zip(table.column("split").to_pylist(), table.column("seq").to_pylist()))
            assert got == outputs[node.inputs[0]], f"sink {name} holds the wrong records"


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("seed", range(40))
def test_theorem1_on_random_dags(seed):
    rng = random.Random(seed)
    dag = random_dag(rng)
    run = LocalRun(dag.flow, random_config(rng), seed=seed)
    log: list[Event] = []
    injected = inject_while_flowing(run, rng, log, n_ops=rng.randint(2, 5))
    check_theorem1(run, log, injected)
    for inj in injected:
        if inj.op.blocking:
            check_consistent_cut(run, dag, log, inj.tag)
    finish_and_check_outputs(run, dag)


@pytest.mark.parametrize("seed", range(12))
def test_non_blocking_ops_never_block_a_channel(seed):
    rng = random.Random(1000 + seed)
    dag = random_dag(rng)
    run = LocalRun(dag.flow, random_config(rng), seed=seed)
    log: list[Event] = []
    instances = all_instances(run)
    steps = [0]

    def never_blocked() -> None:
        steps[0] += 1
        for inst in instances:
            blocked = [ch.channel for ch in inst.inputs if ch.blocked]
            assert not blocked, f"{inst.name}: channels {blocked} blocked by a non-blocking op"

    injected = inject_while_flowing(run, rng, log, n_ops=rng.randint(2, 5), blocking=False,
                                    check_each_step=never_blocked)
    assert steps[0] > 0
    check_theorem1(run, log, injected)
    finish_and_check_outputs(run, dag)


def check_theorem1_with_ends(run: LocalRun, log: list[Event], injected: list[Injected]) -> None:
    """Theorem 1 when inputs end while ops travel: an instance that finished first never sees an op."""
    edges = instance_edges(run)
    order = [inj.tag for inj in injected]
    for inj in injected:
        assert inj.run.state is OpState.COMPLETE, f"{inj.tag}: {inj.run.state} {inj.run.error!r}"
        done = completions(log, inj.tag)
        for u, v in edges:
            if u in done:
                assert v in done, f"{inj.tag} completed at {u} but never at its downstream {v}"
                assert done[u] < done[v], f"{inj.tag}: {v} completed before its upstream {u}"
        sinks_done = {i for i in done if not run.instance(i).outputs}
        assert set(inj.op.returned) == sinks_done
        for inst in done:
            evs = [e.event for e in log if e.tag == inj.tag and e.instance == inst]
            k = _expected_inputs(run, inst, [])
            assert evs[0] == "begin" and evs[-2:] == ["complete", "dispose"], (inj.tag, inst, evs)
            assert 1 <= evs.count("next") <= k and evs.count("next") == len(evs) - 3
    per_instance: dict[InstanceId, list[str]] = collections.defaultdict(list)
    for e in log:
        if e.event == "complete":
            per_instance[e.instance].append(e.tag)
    for inst, tags in per_instance.items():
        assert tags == order[:len(tags)], f"{inst} completed {tags}: not a prefix of the global order {order}"


@pytest.mark.parametrize("seed", range(20))
def test_theorem1_while_inputs_end(seed):
    rng = random.Random(2000 + seed)
    dag = random_dag(rng, hold_end=False)
    run = LocalRun(dag.flow, random_config(rng), seed=seed)
    log: list[Event] = []
    injected = []
    for k in range(rng.randint(2, 5)):
        for _ in range(rng.choice([0, 3, 10, 25, 50, 90])):
            run.step_all()
        op = Recording(log, f"op{k}", blocking=rng.random() < 0.6)
        injected.append(Injected(op.tag, op, run.run_control(op)))
    results = run.run(max_rounds=300_000)
    check_theorem1_with_ends(run, log, injected)
    for inj in injected:
        if inj.op.blocking:
            check_consistent_cut(run, dag, log, inj.tag)
    check_outputs(dag, results)


# -------------------------------------------------------------------------- fixed shapes: fast and slow paths


def _two_paths(p_src: int, p_mid: int, chain: int, capacity: int, hosts: int | None) -> tuple[Dag, JobConfig]:
    """Source a reaches union u through a chain of maps; source b reaches u directly; then a keyed stage.

    The op reaches u early from b and late from the chain, so u (and the map
    "after" behind it) takes b's records from past the op between the two
    arrivals if and only if the op does not block.
    """
    flow = Dataflow("two-paths", num_bins=8)
    dag = Dag(flow)
    a = SeqSource([200] * p_src, batch_size=2, seed=1, hold_end=True, name="a")
    b = SeqSource([200] * p_src, batch_size=2, seed=2, hold_end=True, name="b", first_split=p_src)
    sa = flow.source(a, parallelism=p_src, name="a")
    sb = flow.source(b, parallelism=p_src, name="b")
    dag.sources.update(a=a, b=b)
    dag.nodes.update(a=Node("source", []), b=Node("source", []))
    prev, prev_name = sa, "a"
    for i in range(chain):
        prev = prev.map(track, params={}, name=f"m{i}", parallelism=p_mid, schema=SEQ_SCHEMA)
        dag.nodes[f"m{i}"] = Node("map", [prev_name])
        prev_name = f"m{i}"
    u = prev.union(sb, name="u", parallelism=p_mid)
    dag.nodes["u"] = Node("union", [prev_name, "b"])
    after = u.map(track, params={}, name="after", parallelism=p_mid, schema=SEQ_SCHEMA)
    dag.nodes["after"] = Node("map", ["u"])
    keyed = after.key_by("value").process(_passthrough, name="k", parallelism=2, schema=SEQ_SCHEMA)
    dag.nodes["k"] = Node("keyed", ["after"])
    keyed.sink(collect(), name="out", parallelism=2)
    dag.nodes["out"] = Node("sink", ["k"])
    return dag, JobConfig(channel_capacity=capacity, num_hosts=hosts)


SHAPES = [(1, 1, 4, 2, 1), (2, 2, 3, 2, None), (2, 3, 3, 3, 2), (3, 1, 5, 1, None)]


def _beyond_cut(log: list[Event], tag: str, name: str) -> set:
    """Records map ``name`` had processed at the op's completion that the sources emitted after it."""
    cut = emitted_before(log, tag)
    seen: set = set()
    for e in log:
        if e.tag == tag and e.event == "complete" and e.instance[0] == name:
            assert e.seen is not None, f"{name} does not track the records it processes"
            seen |= e.seen
    return {(split, seq) for split, seq in seen if seq >= cut.get(split, 0)}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_blocking_op_is_a_consistent_cut(shape, seed):
    dag, config = _two_paths(*shape)
    run = LocalRun(dag.flow, config, seed=seed)
    log: list[Event] = []
    rng = random.Random(seed)
    injected = []
    for k in range(3):
        for _ in range(rng.randint(5, 150)):
            run.step_all()
        op = Recording(log, f"op{k}", blocking=True)
        injected.append(Injected(op.tag, op, run.run_control(op)))
    run_until(run, ops_done(*(i.run for i in injected)))
    check_theorem1(run, log, injected)
    previous = 0
    for inj in injected:
        emitted = check_consistent_cut(run, dag, log, inj.tag)
        assert emitted >= previous, "an op cut the stream before an op injected earlier"
        previous = emitted
        assert _beyond_cut(log, inj.tag, "after") == set()
    assert previous > 0, "the ops ran before any data: nothing was tested"
    finish_and_check_outputs(run, dag)


@pytest.mark.parametrize("shape", SHAPES)
def test_non_blocking_op_lets_data_flow_past_it(shape):
    """Over a few seeds the union takes records emitted after the op (it never would if it blocked)."""
    beyond, during = 0, 0
    for seed in range(3):
        dag, config = _two_paths(*shape)
        run = LocalRun(dag.flow, config, seed=seed)
        log: list[Event] = []
        for _ in range(150):  # load the chain with data, so the op travels it slowly
            run.step_all()
        op = Recording(log, "nb", blocking=False)
        op_run = run.run_control(op)
        run_until(run, ops_done(op_run))
        check_theorem1(run, log, [Injected("nb", op, op_run)])
        beyond += len(_beyond_cut(log, "nb", "after"))
        begins = {e.instance: e.records_in for e in log if e.event == "begin"}
        during += sum(e.records_in - begins[e.instance] for e in log if e.event == "complete")
    assert during > 0, "no instance processed data between the op's first arrival and its completion"
    assert beyond > 0, "no record from past the op went through the union: did the op block?"


# --------------------------------------------------------------------------- extra edges


def _slow_and_fast_branch(hold_end: bool = True) -> Dag:
    """Source t feeds a chain of four maps (slow for control); source s feeds map v (fast).

    Three instances of t feed the first map, so the chain's channels fill up
    and a control message crawls along it behind the data; the fast branch
    gets a host of its own (``FAST_SLOW_CONFIG``).
    """
    flow = Dataflow("slow-fast")
    dag = Dag(flow)
    slow = SeqSource([400] * 3, batch_size=2, hold_end=hold_end, name="t")
    fast = SeqSource([400], batch_size=2, hold_end=hold_end, name="s", first_split=3)
    dag.sources.update(t=slow, s=fast)
    dag.nodes.update(t=Node("source", []), s=Node("source", []))
    prev, prev_name = flow.source(slow, name="t", parallelism=3), "t"
    for i in range(4):
        prev = prev.map(track, params={}, name=f"m{i}", parallelism=1, schema=SEQ_SCHEMA)
        dag.nodes[f"m{i}"] = Node("map", [prev_name])
        prev_name = f"m{i}"
    prev.sink(collect(), name="out-slow")
    dag.nodes["out-slow"] = Node("sink", ["m3"])
    flow.source(fast, name="s").map(track, params={}, name="v", schema=SEQ_SCHEMA).sink(
        collect(), name="out-fast")
    dag.nodes["v"] = Node("map", ["s"])
    dag.nodes["out-fast"] = Node("sink", ["v"])
    return dag


FAST_SLOW_CONFIG = JobConfig(channel_capacity=2, num_hosts=2,
                             placement={"t": [1, 1, 1], "s": [0], "v": [0], "out-fast": [0]})


@pytest.mark.parametrize("seed", range(3))
def test_blocking_op_behind_a_blocking_extra_edge_op_keeps_the_cut(seed):
    dag = _slow_and_fast_branch()
    run = LocalRun(dag.flow, FAST_SLOW_CONFIG, seed=seed)
    log: list[Event] = []
    for _ in range(150):
        run.step_all()
    first = Recording(log, "first", blocking=True, extra=[(("m3", 0), ("v", 0))])
    second = Recording(log, "second", blocking=True)
    runs = [Injected(op.tag, op, run.run_control(op)) for op in (first, second)]
    run_until(run, ops_done(*(i.run for i in runs)))
    check_theorem1(run, log, runs)
    for inj in runs:
        check_consistent_cut(run, dag, log, inj.tag)


@pytest.mark.parametrize("seed", range(3))
def test_blocking_op_held_behind_an_extra_edge_op_keeps_the_cut(seed):
    """Regression: at v the blocking op aligns while the earlier non-blocking op still waits on its
    extra edge; v's channels must stay blocked until the blocking op's on_complete has run there."""
    dag = _slow_and_fast_branch()
    run = LocalRun(dag.flow, FAST_SLOW_CONFIG, seed=seed)
    log: list[Event] = []
    for _ in range(150):
        run.step_all()
    first = Recording(log, "first", blocking=False, extra=[(("m3", 0), ("v", 0))])
    second = Recording(log, "second", blocking=True)
    runs = [Injected(op.tag, op, run.run_control(op)) for op in (first, second)]
    run_until(run, ops_done(*(i.run for i in runs)))
    check_theorem1(run, log, runs)
    check_consistent_cut(run, dag, log, "second")


def _short_and_long_branch() -> Dag:
    flow = Dataflow("short-long")
    dag = Dag(flow)
    short = SeqSource([3], batch_size=3, name="short")
    long = SeqSource([200], batch_size=2, name="long", first_split=1)
    dag.sources.update(short=short, long=long)
    dag.nodes.update(short=Node("source", []), long=Node("source", []))
    flow.source(short, name="short").map(track, params={}, name="ma", schema=SEQ_SCHEMA).sink(
        collect(), name="out-a")
    flow.source(long, name="long").map(track, params={}, name="mb", schema=SEQ_SCHEMA).sink(
        collect(), name="out-b")
    dag.nodes.update(ma=Node("map", ["short"]), mb=Node("map", ["long"]))
    dag.nodes.update({"out-a": Node("sink", ["ma"]), "out-b": Node("sink", ["mb"])})
    return dag


def test_extra_edge_from_a_finished_instance_does_not_hang_the_op():
    dag = _short_and_long_branch()
    run = LocalRun(dag.flow, JobConfig(channel_capacity=1))
    run_until(run, lambda: run.instance(("out-a", 0)).finished)
    assert not run.instance(("long", 0)).finished
    log: list[Event] = []
    op_run = run.run_control(Recording(log, "late", extra=[(("ma", 0), ("mb", 0))]))
    try:
        finish_and_check_outputs(run, dag, max_rounds=20_000)
    except RuntimeError as exc:
        pytest.fail(f"the job did not finish: {exc}; op {op_run.state}")
    assert op_run.state is OpState.COMPLETE
    assert "late" in {e.tag for e in log if e.instance == ("mb", 0) and e.event == "complete"}
