"""The runtime on real Ray actors: back-pressure bounds, user errors, cancel, timeouts, statistics."""

from __future__ import annotations

import gc
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from chiray.actors import JobCancelledError, OperatorError
from chiray.actors.runtime.messages import Parcel
from chiray.operators import Dataflow, Sink, SinkWriter, collect, from_items, generate
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("ray_session")


def actors_dead(actors) -> bool:
    for actor in actors:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)
            return False
        except ray.exceptions.RayActorError:
            continue
        except ray.exceptions.GetTimeoutError:
            return False
    return True


def released(actors) -> bool:
    """Each of a job's actors is gone, or a bare host again, idle in the warm pool (``JobConfig.reuse_hosts``)."""
    from chiray.actors.jobs.pool import warm_pool

    idle = {a._actor_id for v in warm_pool()._idle.values() for a in v}
    return (actors_dead([a for a in actors if a._actor_id not in idle])
            and all(ray.get(a.statistics.remote(), timeout=5) == [] for a in actors if a._actor_id in idle))


class SlowWriter(SinkWriter):
    def __init__(self, delay: float):
        self.delay = delay
        self.seqs: list[pa.Array] = []

    def write(self, batch: pa.RecordBatch) -> None:
        time.sleep(self.delay)  # a deliberately slow consumer
        self.seqs.append(batch.column("seq"))

    def finish(self):
        return pa.concat_arrays(self.seqs) if self.seqs else pa.array([], pa.int64())


class SlowSink(Sink):
    def __init__(self, delay: float):
        self.delay = delay

    def create_writer(self, info):
        return SlowWriter(self.delay)

    def combine(self, results):
        return pa.concat_arrays(list(results))


def test_backpressure_bounds_buffered_batches_and_source_read_ahead():
    capacity, batch_size, batches = 2, 500, 120
    flow = Dataflow("backpressure")
    (flow.source(generate(batches * batch_size, batch_size=batch_size, num_keys=50), name="src")
         .map(lambda b: b, name="relay")
         .sink(SlowSink(0.01), name="slow"))
    # The slow sink gets a host of its own, so the relay and the source really wait for its credit.
    job = flow.submit(channel_capacity=capacity, placement={"src": [0], "relay": [0], "slow": [1]})
    num_channels = len(job.plan.channels)
    bound_batches = num_channels * (capacity + 1)
    samples = 0
    while True:
        stats = job.statistics()
        for inst in stats.instances:
            for ch in inst.outputs:
                assert ch.outstanding_batches <= capacity, ch
        assert stats.buffered_batches <= bound_batches, stats
        read_ahead = stats.records_in("src") - stats.records_in("slow")
        assert read_ahead <= bound_batches * batch_size, (read_ahead, stats)
        samples += 1
        try:
            job.wait(timeout=0.05)
            break
        except TimeoutError:
            continue
    assert samples > 5, "the job finished too fast to observe back-pressure"
    bp = sum(s.backpressured_s for s in job.statistics().of("src"))
    assert bp > 0.1, f"the source was never back-pressured ({bp} s)"
    seqs = sorted(job.result().to_pylist())
    assert seqs == list(range(batches * batch_size))  # nothing lost or doubled


def failing(batch: pa.RecordBatch) -> pa.RecordBatch:
    if pc.any(pc.equal(batch.column("x"), 77)).as_py():
        raise ZeroDivisionError("x must not be 77")
    return batch


@pytest.mark.parametrize("p", [1, 2])
def test_user_error_names_operator_instance_and_cause_and_cleans_up(p, tmp_path):
    rows = [{"x": i} for i in range(200)]
    flow = Dataflow("fails")
    flow.source(from_items(rows, batch_size=10, num_splits=p), parallelism=p).map(
        failing, name="checker").collect()
    job = flow.submit(checkpoint_dir=str(tmp_path))  # a failed job keeps its checkpoints: in the test's directory
    with pytest.raises(OperatorError) as info:
        job.wait(timeout=60)
    err = info.value
    assert err.operator == "checker"
    assert err.index in range(p)
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert "x must not be 77" in str(err) and "'checker'" in str(err)
    assert wait_for(lambda: released(job.actors), 30, "the job's actors to go away")
    with pytest.raises(OperatorError):
        job.result()


def test_cancel_leaves_no_actor_behind():
    flow = Dataflow("endless")
    flow.source(generate(None, rate=20_000, batch_size=1000)).key_by("key").count(emit="final").collect()
    job = flow.submit()
    wait_for(lambda: job.statistics().records_in("source-1") > 0, 30, "records to flow")
    own_dir = job.checkpoint_dir
    assert own_dir is not None and os.path.isdir(own_dir)
    job.cancel()
    job.cancel()  # idempotent
    assert not os.path.exists(own_dir), "the job's own temporary directory outlived the cancel"
    assert wait_for(lambda: released(job.actors), 30, "the job's actors to go away")
    with pytest.raises(JobCancelledError):
        job.wait()
    assert job.status().state.value == "CANCELLED"


def test_a_host_freezes_what_it_holds_once_set_up_out_of_the_collectors_passes():
    """A full pass of the cyclic collector walks every object it tracks with the interpreter held (over 100 ms
    in a host holding millions of keys): what a host holds once set up is frozen out of those passes."""
    flow = Dataflow("frozen")
    flow.source(generate(None, rate=20_000, batch_size=1000), parallelism=2).key_by("key").count(
        emit="final", parallelism=2, name="count").collect()
    job = flow.submit(num_hosts=2)
    try:
        wait_for(lambda: job.statistics().records_in("count") > 0, 30, "records to flow")
        hosts = job.topology.hosts()
        frozen = ray.get([h.__ray_call__.remote(lambda host: gc.get_freeze_count()) for h in hosts], timeout=30)
        tracked = ray.get([h.__ray_call__.remote(lambda host: len(gc.get_objects())) for h in hosts], timeout=30)
    finally:
        job.cancel()
    assert len(hosts) == 2
    assert all(f > 10_000 and f > t for f, t in zip(frozen, tracked)), (frozen, tracked)


def test_timeouts_follow_one_rule_and_status_reports_progress():
    flow = Dataflow("paced")
    flow.source(generate(4000, rate=2000, batch_size=500), name="src").collect(name="out")
    submitted_ns = time.time_ns()
    job = flow.submit()
    with pytest.raises(ValueError, match="timeout"):
        job.wait(timeout=-1)
    with pytest.raises(TimeoutError):
        job.wait(timeout=0)
    assert job.status().state.value == "RUNNING"
    job.wait(timeout=60)
    status = job.status()
    assert status.state.value == "FINISHED" and ("out", 0) in status.finished_instances
    table = job.result()
    assert sorted(table.column("seq").to_pylist()) == list(range(4000))
    stats = job.statistics()
    assert stats.records_out("src") == 4000 and stats.records_in("out") == 4000
    # Paced at 2,000 records/s from when the split opened (after the submit): the last of 8 batches is due
    # 1.75 s after it, never sooner. (Between the first and the last batch there may be less: a reader
    # opened on a busy machine long before its first read catches up at once, as open-loop pacing does.)
    last_ns = pc.max(table.column("ts").cast(pa.int64())).as_py()
    assert (last_ns - submitted_ns) / 1e9 >= 1.75 - 0.01


def test_collect_to_driver_preserves_records_across_hosts():
    rows = [{"k": f"k{i % 13}", "v": i} for i in range(5000)]
    flow = Dataflow("hosts")
    (flow.source(from_items(rows, batch_size=100, num_splits=4), parallelism=3)
         .key_by("k").sum("v", parallelism=3, name="sum").sink(collect(), parallelism=2, name="out"))
    job = flow.submit(num_hosts=3, channel_capacity=1)
    job.wait(timeout=120)
    got = {r["k"]: r["sum"] for r in job.result().to_pylist()}
    expected: dict[str, int] = {}
    for r in rows:
        expected[r["k"]] = expected.get(r["k"], 0) + r["v"]
    assert got == expected


def test_a_slow_step_is_reported_and_neither_stopped_nor_taken_for_a_dead_host(tmp_path):
    """One batch takes 2.5 s in a user function: the watchdog names the operator, instance and function
    in the job's events, and the host answers its liveness check (1 s here) meanwhile, so the job runs on
    (the check used to wait for the step and roll the job back)."""
    marker = tmp_path / "slept"

    def sleep_once(batch):
        if not marker.exists():
            marker.touch()
            time.sleep(2.5)
        return batch

    rows = [{"k": i % 7, "v": i} for i in range(2000)]
    flow = Dataflow("slow-step")
    flow.source(from_items(rows, batch_size=200), name="src").map(sleep_once, name="slow").collect(name="out")
    job = flow.submit(step_warning_s=0.5, liveness_timeout_s=1, poll_interval_s=0.2)
    job.wait(timeout=60)
    events = job.status().events
    slow = [e for e in events if e.startswith("slow step: operator 'slow' instance 0")]
    assert slow and "sleep_once" in slow[0] and "still running" in slow[0], events
    assert not [e for e in events if "recover" in e], events
    assert sorted(job.result("out").to_pylist(), key=lambda r: r["v"]) == rows


def test_a_job_ray_has_no_room_for_fails_fast_with_a_clear_error():
    from chiray.actors import JobFailedError

    flow = Dataflow("too-big")
    flow.source(from_items([{"x": 1}])).collect()
    started = time.monotonic()
    with pytest.raises(JobFailedError, match=r"could not start its 1 hosts .* asks for 64 CPUs"):
        flow.submit(host_num_cpus=64, deploy_timeout_s=2)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("controller_process", [False, True])
def test_warm_hosts_serve_the_next_submit_and_are_released(controller_process):
    from chiray.actors import release_warm_actors, wait_warm_actors
    from chiray.actors.jobs.pool import warm_pool
    from chiray.actors.jobs.supervisor import CONTROLLER_POOL_KEY

    def run(name: str, items: list[dict]) -> tuple[dict, list, set]:
        flow = Dataflow(name)
        flow.source(from_items(items, num_splits=2), parallelism=2).key_by("key").count(parallelism=2).collect()
        job = flow.submit(warm_hosts=2, host_num_cpus=0.25, controller_process=controller_process)
        try:
            table = job.result()
        finally:
            job.cancel()
        return ({r["key"]: r["count"] for r in table.to_pylist()}, [a._actor_id for a in job.actors],
                {h._actor_id for h in job.topology.hosts()})

    items = [{"key": f"k{i % 7}", "v": i} for i in range(500)]
    oracle: dict[str, int] = {}
    for item in items:
        oracle[item["key"]] = oracle.get(item["key"], 0) + 1
    release_warm_actors()  # the session's warm hosts (tests/conftest.py): these jobs start from none
    try:
        first, _, first_hosts = run("warm-a", items)
        controllers = int(controller_process)  # else the job's controller runs in its first host
        assert wait_warm_actors(60) == 2 + controllers
        pool = warm_pool()
        host_key = ("host", (0.25, ()))
        assert pool.size(host_key) == 2 and pool.size(CONTROLLER_POOL_KEY) == controllers
        warm_ids = {a._actor_id for a in pool._idle[host_key] + pool._idle.get(CONTROLLER_POOL_KEY, [])}
        assert first_hosts <= warm_ids, "the ended job's hosts (the controller's too) were not recycled"
        recycled = next(a for a in pool._idle[host_key] if a._actor_id in first_hosts)
        assert ray.get(recycled.statistics.remote(), timeout=30) == [], "a recycled host still holds instances"
        assert ray.get(recycled.__ray_call__.remote(lambda host: gc.get_freeze_count()), timeout=30) == 0, \
            "a recycled host keeps what its last job froze"
        ray.get(recycled.receive.remote(Parcel(), "r00000000"), timeout=30)  # a late parcel of the old job: dropped
        ray.kill(pool._idle[host_key][0], no_restart=True)  # a warm host that died is replaced, not used
        second, used, _ = run("warm-b", items)
        assert first == oracle and second == oracle
        assert len(warm_ids & set(used)) == 1 + controllers, "the next job did not take the live warm actors"
        assert pool.size(host_key) == 2, "the pool was not refilled when the job ended"
    finally:
        idle = [a for v in warm_pool()._idle.values() for a in v]
        assert release_warm_actors() == len(idle)
    assert wait_for(lambda: actors_dead(idle), 30, "the warm actors to go away")
    assert warm_pool().size() == 0


def test_a_late_abort_of_the_previous_job_leaves_the_next_job_on_its_reused_hosts_running(tmp_path):
    """A cancelled job's controller sends its hosts aborts on its own, unordered with the driver's recycling of
    them: one that arrives once a host serves the next job must not stop that job (it names the job life it
    was meant for, and the host ignores it)."""
    from tests.gate import Gate, Gated

    def flow(name: str, source) -> Dataflow:
        f = Dataflow(name)
        f.source(source).map(lambda b: b.select(["seq"]), name="m").collect()
        return f

    first = flow("abort-a", generate(None, rate=5_000, batch_size=100)).submit(reuse_hosts=4)
    try:
        wait_for(lambda: first.statistics().records_in("m") > 0, 30, "records through the first job")
    finally:
        first.cancel()
    old_run, old_hosts = first.deployment.config.run_id, {h._actor_id for h in first.topology.hosts()}
    gate = Gate(tmp_path)
    second = flow("abort-b", Gated(generate(6_000, batch_size=100), gate.path, hold_after=2_000)).submit(reuse_hosts=4)
    try:
        wait_for(lambda: second.statistics().records_in("m") >= 2_000, 30, "records through the second job")
        hosts = second.topology.hosts()
        assert old_hosts & {h._actor_id for h in hosts}, "the second job did not reuse the first one's hosts"
        ray.get([h.abort.remote(old_run) for h in hosts], timeout=30)  # the first job's, arriving late
        gate.open()
        second.wait(60)
        seqs = sorted(second.result().column("seq").to_pylist())
    finally:
        second.cancel()
    assert seqs == list(range(6_000))
