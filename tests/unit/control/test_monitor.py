"""``Monitor`` in ``LocalRun``: in-band metrics through broadcast / aggregation trees, against the counters.

Sixteen or more source instances on four hosts emit a fixed number of rows
each and then pause without ending (``SeqSource``'s gate), so the job goes
quiescent. A ``Monitor`` then must report, for every instance exactly once,
the same ``records_in`` as the instance's own counter, and totals equal to
what a plain loop over the emitted rows gives (rows, distinct keys, records
routed per bin).
"""

from __future__ import annotations

import collections
import types
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.control.oprun import OpState
from chiray.control.ops import Monitor, MonitorResult
from chiray.operators import Dataflow, collect
from chiray.operators.hashing import bins_of
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState

from .support import SEQ_SCHEMA, SeqSource, all_instances, ops_done, run_until

NUM_BINS = 16


def _count_rows(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
    state.value = (state.value or 0) + rows.num_rows
    return rows


def _flow(n_sources: int, rows: int, limit: int, keyed_p: int, sink_p: int) -> tuple[Dataflow, SeqSource]:
    src = SeqSource([rows] * n_sources, batch_size=2, seed=7, limit=limit, hold_end=True, name="src")
    flow = Dataflow("monitored", num_bins=NUM_BINS)
    (flow.source(src, parallelism=n_sources, name="src")
         .key_by("value").process(_count_rows, name="per-value", parallelism=keyed_p, schema=SEQ_SCHEMA)
         .sink(collect(), name="out", parallelism=sink_p))
    return flow, src


def _quiesce(run: LocalRun, max_rounds: int = 100_000) -> None:
    for _ in range(max_rounds):
        if not run.step_all():
            return
    raise AssertionError("the paused pipeline never went quiescent")


def _monitor(run: LocalRun) -> MonitorResult:
    op_run = run.run_control(Monitor())
    run_until(run, ops_done(op_run))
    assert op_run.state is OpState.COMPLETE, op_run.error
    return op_run.result


@pytest.mark.parametrize("fanout", [2, 3, None])
@pytest.mark.parametrize("n_sources,keyed_p,sink_p,seed", [(16, 4, 8, 0), (17, 3, 5, 1), (24, 4, 4, 2)])
def test_monitor_equals_instance_counters_when_quiescent(fanout, n_sources, keyed_p, sink_p, seed):
    rows, limit = 20, 7
    flow, src = _flow(n_sources, rows, limit, keyed_p, sink_p)
    run = LocalRun(flow, JobConfig(num_hosts=4, control_fanout=fanout, channel_capacity=2), seed=seed)
    assert len(run.hosts) == 4
    if fanout is not None:  # the trees really have relays
        assert run.broadcast.depth >= 2
    _quiesce(run)
    result = _monitor(run)

    # every instance reported exactly once (the keys are unique), none missing
    assert set(result.instances) == set(run.plan.instances)
    for inst in all_instances(run):
        metrics = result.instances[inst.name]
        stats = inst.statistics()
        assert metrics["records_in"] == inst.records_in == stats.records_in, inst.name
        assert metrics["records_out"] == inst.records_out, inst.name
        assert metrics["queued_batches"] == 0, "quiescent: nothing buffered"

    # oracle: a plain loop over the rows the gate let out
    emitted = [r for split in src.split_numbers for r in src.rows(split, min(limit, src.total(split)))]
    total = len(emitted)
    for op in ("src", "per-value", "out"):
        assert result.operators[op]["records_in"] == total, op
    distinct_values = {r["value"] for r in emitted}
    assert result.operators["per-value"]["keys"] == len(distinct_values)
    expected_load = np.bincount(bins_of(pa.array([r["value"] for r in emitted], pa.int64()), NUM_BINS),
                                minlength=NUM_BINS)
    np.testing.assert_array_equal(result.bin_loads["per-value"], expected_load)
    keys_per_bin: collections.Counter = collections.Counter()
    for (op, _), metrics in result.instances.items():
        if op == "per-value":
            keys_per_bin.update(metrics["keys_per_bin"])
    values_per_bin = collections.Counter(
        bins_of(pa.array(sorted(distinct_values), pa.int64()), NUM_BINS).tolist())
    assert +keys_per_bin == values_per_bin

    # resume: the job runs to its end and every row arrives once
    src.limit, src.hold_end = None, False
    out = run.run(max_rounds=200_000)["out"]
    assert out.num_rows == sum(src.rows_per_split)


def test_monitor_while_data_flows_reports_every_instance_once():
    flow, src = _flow(16, 40, 40, 2, 3)
    run = LocalRun(flow, JobConfig(num_hosts=4, control_fanout=2, channel_capacity=1), seed=5)
    for _ in range(30):
        run.step_all()
    before = {inst.name: inst.records_in for inst in all_instances(run)}
    result = _monitor(run)
    after = {inst.name: inst.records_in for inst in all_instances(run)}
    assert set(result.instances) == set(run.plan.instances)
    for name, metrics in result.instances.items():
        assert before[name] <= metrics["records_in"] <= after[name], name
    src.hold_end = False
    assert run.run(max_rounds=200_000)["out"].num_rows == sum(src.rows_per_split)


def test_a_rescales_metrics_request_sorts_its_operators_bins_in_the_background_and_waits_for_them():
    """A rescale's planner asks for metrics first (``Monitor(prepare_moves=operator)``): each instance
    of that operator sorts its bins' slots on the worker thread (its owner goes on), and acknowledges
    the op only once the sort is done, so the rescale's first step never waits for it. Other metrics
    requests (the autoscaler's, every few seconds) start nothing and wait for nothing."""
    state = ColumnarAggState(64)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    keys = pa.array([f"k{i}" for i in range(5000)])
    state.update(keys, {"n": np.ones(5000, dtype=np.int64)})
    stats = types.SimpleNamespace(records_in=0, records_out=0, batches_in=0, queued_batches=0, queued_bytes=0,
                                  backpressured_s=0.0, busy_s=0.0)
    acked: list = []
    attached: list = []

    def ctx_of(name: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(instance=(name, 0), statistics=lambda: stats, state=state, routers=[],
                                     downstream=[], attach=lambda target, payload: attached.append(payload),
                                     ack_in_background=acked.append)

    controller = types.SimpleNamespace(instances=[("src", 0), ("count", 0), ("count", 1), ("out", 0)])
    plain = Monitor()
    assert set(plain.expected_acks(controller)) == set()
    handler = Monitor.Instance(plain, None)
    handler.on_begin(ctx_of("count"))
    handler.on_complete(ctx_of("count"))
    assert attached[-1][("count", 0)]["keys"] == 5000
    assert state._slots_of._building is None and not acked, "plain metrics (an autoscaler's) prepare nothing"

    rescale = Monitor(prepare_moves="count")
    assert set(rescale.expected_acks(controller)) == {("count", 0), ("count", 1)}
    other = Monitor.Instance(rescale, None)
    other.on_begin(ctx_of("src"))
    other.on_complete(ctx_of("src"))
    assert not acked and state._slots_of._building is None, "only the rescaled operator's instances prepare"
    handler = Monitor.Instance(rescale, None)
    handler.on_begin(ctx_of("count"))
    handler.on_complete(ctx_of("count"))
    assert attached[-1][("count", 0)]["keys"] == 5000
    building = state._slots_of._building
    assert building is not None, "no background sort began"
    assert len(acked) == 1
    assert acked[0]() is None  # the acknowledgement waits for the sort...
    assert building.future.done()  # ...which is then done
    state.extract_bins([3, 40])  # the first extraction takes the run sorted in the background
    assert state._slots_of._building is None
    left = state.keys_at(state.slots()).to_pylist()
    assert sorted(left) == sorted(np.array(keys.to_pylist())[~np.isin(bins_of(keys, 64), [3, 40])].tolist())
