"""Branches added to and removed from a running job, in-process: an added branch's sink receives exactly the
records the running operator emits after the cut its op reports, a removed one's exactly those before it; the
other outputs of the running operator (also those after a removed edge) go on untouched; the plan keeps the
running channels; bad branches are refused."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray import collect
from chiray.actors.jobs.harness import LocalRun
from chiray.operators import Dataflow, from_items
from chiray.operators.branch import BranchError, branch_nodes, branch_of
from chiray.operators.graph import branched_plan, physical_plan

N = 2000


def doubled(batch):
    return pa.record_batch({"x": batch["x"], "y": pc.multiply(batch["x"], 2)})


def flow(parallelism=1):
    f = Dataflow("t")
    f.source(from_items([{"x": i} for i in range(N)], batch_size=10)).map(doubled, name="m",
                                                                         parallelism=parallelism) \
        .sink(collect(), name="out")
    return f


def test_a_branch_sees_exactly_the_records_after_its_cut():
    run = LocalRun(flow())
    run.run(until=lambda: run.instance(("m", 0)).records_out >= 300)
    cut = run.add_branch("m", lambda s: s.filter(lambda b: pc.greater_equal(b["x"], 0), name="f")
                         .sink(collect(), name="late"))
    out = run.run()
    k = cut.cut["m/0"]
    assert 300 <= k < N and cut.added == ("f", "late")
    main = out["out"].to_pylist()
    assert main == [{"x": i, "y": 2 * i} for i in range(N)]  # the running branch goes on untouched
    assert out["late"].to_pylist() == main[k:]  # one instance, in order: every record after the cut


def test_a_keyed_branch_at_parallelism_two_counts_what_follows_the_cut():
    run = LocalRun(flow(parallelism=2))
    run.run(until=lambda: run.instance(("m", 1)).records_out >= 200)
    cut = run.add_branch("m", lambda s: s.key_by("x").count(parallelism=2, name="c").sink(collect(), name="cs"))
    out = run.run()
    assert sum(cut.cut.values()) < N
    counted = sum(r["count"] for r in out["cs"].to_pylist())
    assert counted == N - sum(cut.cut.values())  # each instance of m sent the branch what it emitted after


def test_a_removed_branch_got_exactly_the_records_before_its_cut_and_the_edges_after_it_go_on():
    f = flow()
    m = f.graph.nodes["m"]
    from chiray.operators.dataflow import Stream

    Stream(f, m).filter(lambda b: pc.less(b["x"], N), name="mid").sink(collect(), name="middle")  # edge 1 of 2
    Stream(f, m).map(doubled, name="last").sink(collect(), name="after")  # edge 2: it moves up when 1 goes
    run = LocalRun(f)
    run.run(until=lambda: run.instance(("m", 0)).records_out >= 300)
    cut = run.remove_branch("middle")
    assert cut.added == ("middle", "mid") and "mid" not in run.plan.graph.nodes
    run.run(until=lambda: run.instance(("m", 0)).records_out >= 1_000)
    late = run.add_branch("m", lambda s: s.sink(collect(), name="late"))  # a branch after a removal: edge 2
    out = run.run()
    k, j = cut.cut["m/0"], late.cut["m/0"]
    main = [{"x": i, "y": 2 * i} for i in range(N)]
    assert 300 <= k < j < N
    assert out["out"].to_pylist() == main and out["after"].to_pylist() == main
    assert out["middle"].to_pylist() == main[:k]  # every record before the cut, none after
    assert out["late"].to_pylist() == main[j:]


def test_removing_a_branch_that_joins_two_running_operators_is_refused():
    from chiray.operators.branch import branch_root
    from chiray.operators.dataflow import Stream

    f = flow()
    source = next(n for n in f.graph.nodes.values() if n.kind.value == "source")
    Stream(f, f.graph.nodes["m"]).union(Stream(f, source), name="both").sink(collect(), name="u")
    removed = branch_of(f.graph, "u")
    assert removed == ["u", "both"]
    with pytest.raises(BranchError, match="several running operators"):
        branch_root(f.graph, removed)


def test_the_branched_plan_keeps_every_running_channel():
    plan = physical_plan(flow(parallelism=2).graph)
    f = Dataflow("t")
    nodes = branch_nodes(plan.graph, "m", lambda s: s.sink(collect(), name="b", parallelism=3), f.num_bins)
    new = branched_plan(plan, nodes)
    old = {c.channel_id: c for c in plan.channels}
    assert all(old[c.channel_id] == c for c in new.channels if c.channel_id in old)
    assert len(old) == len([c for c in new.channels if c.channel_id in old])
    added = [c for c in new.channels if c.channel_id not in old]
    assert {c.channel_id for c in added} == set(range(plan.next_channel_id, plan.next_channel_id + 6))
    assert {(c.src, c.dst[0], c.edge_index) for c in added} == {(("m", i), "b", 1) for i in range(2)}
    assert new.next_channel_id == plan.next_channel_id + 6


def test_bad_branches_are_refused_before_anything_changes():
    graph = physical_plan(flow().graph).graph
    with pytest.raises(BranchError, match="unknown operator"):
        branch_nodes(graph, "q", lambda s: s.sink(collect()), 64)
    with pytest.raises(BranchError, match="a sink has no output"):
        branch_nodes(graph, "out", lambda s: s.sink(collect()), 64)
    with pytest.raises(BranchError, match="adds no sink"):
        branch_nodes(graph, "m", lambda s: s.map(doubled), 64)
    with pytest.raises(BranchError, match="duplicate operator name|'out'"):
        branch_nodes(graph, "m", lambda s: s.sink(collect(), name="out"), 64)
    with pytest.raises(BranchError, match="only sink"):
        branch_of(graph, "out")
    assert len(graph.nodes) == 3  # the job's graph is untouched


def test_branch_of_is_the_sink_and_what_feeds_only_it():
    f = flow()
    m = f.graph.nodes["m"]
    from chiray.operators.dataflow import Stream

    Stream(f, m).map(doubled, name="a").map(doubled, name="b").sink(collect(), name="s2")
    assert branch_of(f.graph, "s2") == ["s2", "b", "a"]
    assert branch_of(f.graph, "out") == ["out"]


def test_a_job_on_ray_refuses_a_bad_branch_before_anything_changes():
    from chiray.actors.jobs.job import Job

    job = Job.__new__(Job)  # no Ray: only the checks before the runtime runs
    job.name, job.plan = "t", physical_plan(flow().graph)
    job._not_stopping = lambda verb: None  # the job runs
    with pytest.raises(BranchError, match="adds no sink"):
        job.add_branch("m", lambda s: s.map(doubled))
    with pytest.raises(BranchError, match="only sink"):
        job.remove_branch("out")
