"""A prepared topology change holds the sources that carry its op: one that runs out of input meanwhile
finishes only once the op has passed it, so the op still reaches every instance that waits for it.

Before, a source that ended between a rescale step's prepare and its op's injection dropped the op, and
the instances that had prepared the change waited for it until the step timed out.
"""

from __future__ import annotations

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.control.rescaleplan import unreached
from chiray.operators import Dataflow, from_items
from chiray.operators.graph import rescaled_plan

BINS = 8
ROWS = [{"k": f"k{i % 7}", "v": i} for i in range(200)]


def _flow() -> Dataflow:
    flow = Dataflow("hold")
    (flow.source(from_items(ROWS, batch_size=20), name="src")
         .map(lambda b: b, name="pass")
         .key_by("k", num_bins=BINS).count(name="count", parallelism=1)
         .collect(name="out"))
    return flow


def test_a_prepared_change_holds_a_live_source_until_its_op_passes():
    local = LocalRun(_flow(), JobConfig(num_hosts=1))
    host = local.hosts[0]
    new = rescaled_plan(local.plan, "count", 2, [b % 2 for b in range(BINS)])
    prepared = host.prepare_change("step-1", new, {i: 0 for i in new.instances})
    assert prepared.held == (("src", 0),)
    assert prepared.changed == (("pass", 0), ("out", 0))  # the sender to and the receiver from count
    src = local.instance(("src", 0))
    local.run(until=lambda: src.exhausted)
    for _ in range(50):
        local.step_all()
    assert not src.finished, "a held source waits for the step's op"


def test_a_source_that_ended_before_the_prepare_is_reported_not_held():
    local = LocalRun(_flow(), JobConfig(num_hosts=1))
    host = local.hosts[0]
    while not local.instance(("src", 0)).finished:
        assert local.step_all(), "the source never finished"
    new = rescaled_plan(local.plan, "count", 2, [b % 2 for b in range(BINS)])
    prepared = host.prepare_change("step-1", new, {i: 0 for i in new.instances})
    assert prepared.held == (), "a finished source cannot carry the op: it is not held"


def test_instances_no_live_source_reaches_are_reported():
    flow = Dataflow("two-branches")
    a = flow.source(from_items(ROWS, batch_size=50), name="a").map(lambda b: b, name="ma")
    b = flow.source(from_items(ROWS, batch_size=50), name="b").map(lambda b: b, name="mb")
    a.union(b, name="u").key_by("k").count(name="count").collect(name="out")
    plan = LocalRun(flow).plan
    needed = [("ma", 0), ("mb", 0), ("count", 0)]
    assert unreached(plan, {("a", 0), ("b", 0)}, needed) == []
    assert unreached(plan, {("a", 0)}, needed) == [("mb", 0)]
    assert unreached(plan, set(), needed) == needed


def test_a_source_whose_channels_change_counts_as_held():
    local = LocalRun(_flow(), JobConfig(num_hosts=1))
    new = rescaled_plan(local.plan, "pass", 2)
    prepared = local.hosts[0].prepare_change("step-1", new, {i: 0 for i in new.instances})
    assert ("src", 0) in prepared.changed and prepared.held == (("src", 0),)
    assert unreached(new, prepared.held, prepared.changed) == []
