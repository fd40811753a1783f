"""The control plane on real Ray actors: ordering across controllers, trees, cuts, stalls, failures."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from chiray.control import ops
from chiray.control.op import ControlOp, InstanceHandler
from chiray.control.oprun import OpFailedError
from chiray.operators import Dataflow, Sink, SinkWriter, Source, SourceSplit, SplitReader, generate
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("ray_session")

# Per host process: the ops each instance completed, in order (handlers run in the hosts).
_ORDER: dict[tuple, list[str]] = collections.defaultdict(list)


class Tag(ControlOp):
    """Non-blocking or blocking op that only records its name at every instance."""

    def __init__(self, name: str, blocking: bool):
        super().__init__()
        self.name = name
        self.blocking = blocking

    class Instance(InstanceHandler):
        def on_complete(self, ctx):
            _ORDER[ctx.instance].append(self.op.name)


class Gather(ControlOp):
    """Gathers ``record(ctx)`` of every instance (the Monitor pattern: pass it all on to one downstream)."""

    @staticmethod
    def record(ctx):
        raise NotImplementedError

    class Instance(InstanceHandler):
        def on_begin(self, ctx):
            self.seen: dict = {}

        def on_next(self, ctx, payload, sender):
            self.seen.update(payload or {})

        def on_complete(self, ctx):
            self.seen[ctx.instance] = self.op.record(ctx)
            ctx.attach(ctx.downstream[0] if ctx.downstream else "controller", self.seen)

    def on_complete(self, ctx):
        merged: dict = {}
        for payload in self.returned.values():
            merged.update(payload or {})
        return merged


class CollectOrder(Gather):
    """Non-blocking: every instance's recorded order of ops."""

    blocking = False

    @staticmethod
    def record(ctx):
        return list(_ORDER[ctx.instance])


class Who(Gather):
    """Non-blocking: the instances it completed at."""

    blocking = False

    @staticmethod
    def record(ctx):
        return True


def _endless(flow: Dataflow, parallelism: int = 2, rate: float = 50_000, name: str = "src"):
    return flow.source(generate(None, rate=rate, batch_size=500, num_keys=100, num_splits=parallelism),
                       parallelism=parallelism, name=name)


def test_two_controllers_injecting_concurrently_give_every_instance_one_order():
    flow = Dataflow("two-controllers")
    src = _endless(flow)
    keyed = src.key_by("key").count(parallelism=3, emit="updates", name="count")
    keyed.collect(name="out")
    src.map(lambda b: b, parallelism=2, name="side").collect(name="side-out")
    job = flow.submit()
    try:
        job.add_controller("second")
        handles: list = []

        def fire(controller, prefix):
            for i in range(15):
                handles.append(job.run_control(Tag(f"{prefix}{i}", blocking=i % 3 == 0), controller=controller))

        threads = [threading.Thread(target=fire, args=(c, p)) for c, p in ((None, "a"), ("second", "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for h in handles:
            h.result(timeout=60)
        orders = job.run_control(CollectOrder()).result(timeout=60)
        assert set(orders) == set(job.plan.instances)
        first = next(iter(orders.values()))
        assert sorted(first) == sorted([f"a{i}" for i in range(15)] + [f"b{i}" for i in range(15)])
        for instance, order in orders.items():
            assert order == first, f"{instance} saw the ops in another order"
    finally:
        job.cancel()


def test_ops_started_back_to_back_share_calls_and_keep_their_order():
    flow = Dataflow("batched-ops")
    _endless(flow).key_by("key").count(parallelism=2, emit="updates", name="count").collect(name="out")
    job = flow.submit()
    try:
        names = [f"seq{i}" for i in range(40)]
        handles = [job.run_control(Tag(name, blocking=i % 4 == 0)) for i, name in enumerate(names)]
        for h in handles:
            h.result(timeout=60)
        calls = job._ops.calls()  # Ray calls made by the job's op senders
        assert calls < len(names), f"{calls} calls to the controller for {len(names)} ops started back to back"
        orders = job.run_control(CollectOrder()).result(timeout=60)
        for instance, order in orders.items():
            assert [n for n in order if n.startswith("seq")] == names, f"{instance} saw another order"
    finally:
        job.cancel()


class Unsendable(ControlOp):
    """An op holding a lock: it cannot be pickled to the controller."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


def test_an_op_that_cannot_be_sent_fails_its_handle_and_later_ops_still_run():
    flow = Dataflow("unsendable-op")
    _endless(flow, parallelism=1).collect(name="out")
    job = flow.submit()
    try:
        bad = job.run_control(Unsendable())
        with pytest.raises(OpFailedError, match="could not be sent.*lock"):
            bad.result(timeout=30)
        after = job.run_control(Tag("after-unsendable", blocking=False)).result(timeout=60)
        assert set(after) == {("out", 0)}  # the sink's return
    finally:
        job.cancel()


class PausedSource(Source):
    """Emits ``batches`` batches of ``rows`` rows per split, then idles without ending."""

    def __init__(self, splits: int, batches: int, rows: int):
        self.n, self.batches, self.rows = splits, batches, rows

    def schema(self):
        return pa.schema([("key", pa.int64()), ("v", pa.int64())])

    def splits(self):
        return [SourceSplit(str(i), i) for i in range(self.n)]

    def open_split(self, split, offset=None):
        return _PausedReader(split.payload, self.batches, self.rows, offset or 0)


class _PausedReader(SplitReader):
    def __init__(self, split: int, batches: int, rows: int, done: int):
        self.split, self.batches, self.rows, self.done = split, batches, rows, done

    def read(self):
        self.done += 1
        keys = pa.array([(self.split * 7 + i) % 97 for i in range(self.rows)], pa.int64())
        return pa.record_batch({"key": keys, "v": pa.array([1] * self.rows, pa.int64())})

    def ready_at(self):
        return None if self.done < self.batches else time.monotonic() + 3600.0

    def offset(self):
        return self.done


SOURCES = 64  # with a fan-out of 4, the tree over the 69 instances is three relays deep


def test_monitor_through_trees_equals_the_sum_over_instances():
    flow = Dataflow("trees")
    src = flow.source(PausedSource(SOURCES, batches=3, rows=10), parallelism=SOURCES, name="src")
    src.key_by("key").count(parallelism=4, emit="updates", name="count").collect(name="out")
    pins = {"src": [i % 4 for i in range(SOURCES)], "count": [0, 1, 2, 3], "out": [0]}
    job = flow.submit(num_hosts=4, control_fanout=4, placement=pins)
    try:
        expected = SOURCES * 3 * 10

        def quiescent():
            stats = job.statistics()
            return stats.records_in("count") == expected and stats.buffered_batches == 0

        wait_for(quiescent, 60, "the pipeline to go quiet", interval=0.1, detail=job.statistics)
        result = job.metrics(timeout=60)
        stats = job.statistics()
        assert len(result.instances) == len(job.plan.instances)
        for op in ("src", "count", "out"):
            direct = sum(s.records_in for s in stats.of(op))
            assert result.operators[op]["records_in"] == direct
            assert sum(result.instances[(op, i)]["records_in"] for i in range(len(stats.of(op)))) == direct
        assert result.operators["src"]["records_out"] == expected
        assert int(result.bin_loads["count"].sum()) == expected
        keys = {(split * 7 + i) % 97 for split in range(SOURCES) for i in range(10)}  # _PausedReader's
        assert result.operators["count"]["keys"] == len(keys)
    finally:
        job.cancel()


class CutProbe(Gather):
    """Blocking: every instance reports the records it had taken in / sent out when it completes."""

    blocking = True

    @staticmethod
    def record(ctx):
        stats = ctx.statistics()
        return (stats.records_in, stats.records_out)


@pytest.mark.parametrize("p", [1, 3])
def test_blocking_op_sees_a_consistent_cut(p):
    flow = Dataflow("cut")
    (_endless(flow, parallelism=2, rate=100_000)
        .map(lambda b: b, parallelism=p, name="relay")
        .key_by("key").count(parallelism=2, emit="updates", name="count")
        .collect(name="out"))
    job = flow.submit(channel_capacity=2)
    try:
        for _ in range(5):
            cut = job.run_control(CutProbe()).result(timeout=60)
            emitted = sum(cut[("src", i)][1] for i in range(2))
            relayed_in = sum(cut[("relay", i)][0] for i in range(p))
            relayed_out = sum(cut[("relay", i)][1] for i in range(p))
            counted = sum(cut[("count", i)][0] for i in range(2))
            assert emitted == relayed_in == relayed_out == counted > 0
    finally:
        job.cancel()


class GapWriter(SinkWriter):
    def __init__(self):
        self.last: float | None = None
        self.max_gap = 0.0
        self.rows = 0

    def write(self, batch):
        now = time.monotonic()
        if self.last is not None:
            self.max_gap = max(self.max_gap, now - self.last)
        self.last = now
        self.rows += batch.num_rows

    def finish(self):
        return (self.max_gap, self.rows)


class GapSink(Sink):
    def create_writer(self, info):
        return GapWriter()


class GapSinkCombine(GapSink):
    def combine(self, results):
        results = list(results)
        return max(r[0] for r in results), sum(r[1] for r in results)


def test_non_blocking_ops_do_not_stall_the_data():
    flow = Dataflow("no-stall")
    records = 120_000
    (flow.source(generate(records, rate=40_000, batch_size=500, num_keys=100, num_splits=2),
                 parallelism=2, name="src")
         .map(lambda b: b, parallelism=2, name="relay")
         .sink(GapSinkCombine(), parallelism=1, name="gaps"))
    job = flow.submit()
    handles = []
    while len(handles) < 60 and job.statistics().records_in("gaps") < records * 0.8:
        handles.append(job.run_control(ops.NoOp(blocking=False)))
        time.sleep(0.02)
    for h in handles:
        h.result(timeout=60)
    job.wait(timeout=120)
    max_gap, rows = job.result()
    assert rows == records
    with pytest.raises(OpFailedError, match=r"job 'no-stall' has ended \(finished\); there is nothing left"):
        job.checkpoint()
    assert len(handles) >= 20, "too few ops ran while data flowed"
    # Batches arrive every ~12 ms at this rate; a stall would show as a long gap (generous bound:
    # the real figures are in benchmarks.control_overhead).
    assert max_gap < 1.0, f"the data paused for {max_gap:.3f} s while non-blocking ops ran"


def tag_above(batch: pa.RecordBatch, params: dict[str, Any]) -> pa.RecordBatch:
    kept = batch.filter(pc.greater(batch.column("value"), params["threshold"]))
    return kept.select(["seq", "value"]).append_column(
        "threshold", pa.array([params["threshold"]] * kept.num_rows, pa.int64()))


def test_reconfigure_switches_both_branches_at_one_cut():
    flow = Dataflow("fig4b")
    src = flow.source(generate(60_000, rate=60_000, batch_size=500, num_keys=10), name="src")
    a = src.map(tag_above, params={"threshold": 100}, name="a")
    b = src.map(tag_above, params={"threshold": 100}, name="b")
    a.union(b, name="join").collect(name="out")
    job = flow.submit()
    wait_for(lambda: job.statistics().records_out("src") >= 15_000, 60, "src to emit 15,000 records")
    job.run_control(ops.Reconfigure({"a": {"threshold": 900}, "b": {"threshold": 900}})).result(timeout=60)
    job.wait(timeout=120)
    rows = job.result().to_pylist()
    switched = [r["seq"] for r in rows if r["threshold"] == 900]
    assert switched, "the reconfiguration never took effect"
    cut = min(switched)
    for r in rows:
        assert r["threshold"] == (900 if r["seq"] >= cut else 100), r
    per_seq = collections.Counter(r["seq"] for r in rows)
    source_rows = {r["seq"]: r["value"] for r in rows}
    for seq, value in source_rows.items():
        threshold = 900 if seq >= cut else 100
        assert per_seq[seq] == (2 if value > threshold else 0)


class Slow(ControlOp):
    """Blocking op that lingers at the sink, so it is surely in flight when a host dies."""

    blocking = True
    timeout_s = 120.0

    class Instance(InstanceHandler):
        def on_begin(self, ctx):
            if ctx.kind == "sink":
                time.sleep(2.0)


def test_a_host_failure_during_an_op_fails_the_op_clearly(tmp_path):
    flow = Dataflow("dies")
    src = flow.source(PausedSource(2, batches=2, rows=5), parallelism=2, name="src")
    src.key_by("key").count(parallelism=2, emit="updates", name="count").collect(name="out")
    # No recovery: the job fails with the op, and keeps its checkpoint directory (to restore from): the test's.
    job = flow.submit(poll_interval_s=0.2, max_restarts=0, checkpoint_dir=str(tmp_path / "chk"))
    try:
        count_host = job.actors[0]  # keyed instance 0 lives on host 0; the sink on host 2
        handle = job.run_control(Slow())

        def running() -> bool:
            try:
                return handle.progress()["state"] == "RUNNING"
            except Exception:  # not registered yet
                return False

        # run_control does not wait: make sure the op is in flight before the kill
        wait_for(running, 30, "the op to start", interval=0.01)
        ray.kill(count_host, no_restart=True)
        started = time.monotonic()
        with pytest.raises(OpFailedError, match="host 0"):
            handle.result(timeout=60)
        assert time.monotonic() - started < 30, "the op failed only after a long hang"
        with pytest.raises(Exception, match="host 0"):
            job.wait(timeout=60)
    finally:
        job.cancel()


@pytest.mark.parametrize("victim", ["host 0 (the controller's)", "another host"])
def test_a_side_controller_still_runs_ops_after_a_recovery(victim):
    """A recovery gives the job a new controller (the old one moved, or died with host 0) and new hosts:
    a side controller injects through the new one, and the new hosts return its ops to it."""
    flow = Dataflow("side-after-recovery")
    _endless(flow).key_by("key").count(parallelism=2, emit="final", name="count").collect(name="out")
    job = flow.submit(poll_interval_s=0.2)
    try:
        job.add_controller("second")
        assert set(job.run_control(Who(), controller="second").result(timeout=60)) == set(job.plan.instances)
        hosts = job.topology.hosts()
        ray.kill(hosts[0] if victim.startswith("host 0") else hosts[-1], no_restart=True)
        wait_for(lambda: any(e.startswith("recovered") for e in job.status().events), 90,
                 "the job to recover from the killed host", detail=lambda: job.status().events)
        assert set(job.run_control(Who(), controller="second").result(timeout=60)) == set(job.plan.instances)
    finally:
        job.cancel()
