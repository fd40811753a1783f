"""Upgrades on Ray: a ``map`` upgraded mid-stream is exact at the cut its op reports; a host killed after an
upgrade and a checkpoint recovers with the new code."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

import chiray
from chiray.operators import generate
from tests.waiting import wait_for

pytestmark = pytest.mark.ray

N = 30_000


def times(factor):
    def fn(batch):
        return pa.record_batch({"key": batch["key"], "value": batch["value"],
                                "y": pc.multiply(batch["value"], factor)})
    fn.__qualname__ = f"times{factor}"
    return fn


def _flow(name):
    flow = chiray.Dataflow(name)
    flow.source(generate(N, rate=4_000, batch_size=500, num_keys=50, seed=3)).map(times(2), name="m") \
        .sink(chiray.collect(), name="out")
    return flow




def test_map_upgrade_on_ray_is_exact(ray_session, tmp_path):
    job = chiray.submit(_flow("upgrade-map"), checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 30, "records through the map")
        record = job.upgrade("m", times(3))
        job.wait(60)
        out = job.result("out")
    finally:
        job.cancel()
    k = record.cut["m/0"]["records"]
    assert 4_000 <= k < N and record.outcome.value == "done" and job.upgrades() == (record,)
    values = out.column("value").to_pylist()
    ys = out.column("y").to_pylist()
    # one source instance, one channel: the map's k-th record is the source's k-th (in order)
    assert len(values) == N
    assert ys == [v * (2 if i < k else 3) for i, v in enumerate(values)]


def test_recovery_after_an_upgrade_runs_the_new_code(ray_session, tmp_path):
    flow = chiray.Dataflow("upgrade-recover")
    flow.source(generate(None, rate=20_000, batch_size=500, num_keys=50, seed=3)).map(times(2), name="m") \
        .sink(chiray.collect(), name="out")
    job = chiray.submit(flow, checkpoint_dir=str(tmp_path / "chk"), max_restarts=2)
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 2_000, 30, "records through the map")
        job.upgrade("m", times(5))
        job.checkpoint(60)
        ray.kill(job.topology.hosts()[0], no_restart=True)
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery")
        wait_for(lambda: job.tail("out", 50).num_rows == 50, 30, "output after the recovery")
        tail = job.tail("out", 50)
        assert tail.column("y").to_pylist() == [v * 5 for v in tail.column("value").to_pylist()]
    finally:
        job.cancel()


def _tail_is(job, factor, rows=1_000):
    tail = job.tail("out", rows)
    return tail.num_rows == rows and tail.column("y").to_pylist() == [v * factor for v in
                                                                      tail.column("value").to_pylist()]


def _each_took(job, parallelism, records):
    counts = [s.records_in for s in job.statistics().of("m")]
    return len(counts) == parallelism and min(counts) >= records


def test_scale_out_after_a_restore_or_a_recovery_builds_the_checkpointed_code(ray_session, tmp_path):
    """The operator's recorded code comes from the checkpoint a job starts from: a restore into a new job (its
    flow still says times2) and a recovery to a checkpoint cut before a later upgrade both scale out with it."""
    def flow():
        f = chiray.Dataflow("upgrade-rescale")
        f.source(generate(None, rate=20_000, batch_size=100, num_keys=50, seed=3)).map(times(2), name="m") \
            .sink(chiray.collect(), name="out")
        return f

    first = chiray.submit(flow(), checkpoint_dir=str(tmp_path / "a"))
    try:
        wait_for(lambda: first.statistics().records_in("m") >= 2_000, 30, "records through the map")
        first.upgrade("m", times(5))
        path = first.checkpoint_info(60).path
    finally:
        first.cancel()
    job = chiray.submit(flow(), checkpoint_dir=str(tmp_path / "b"), restore_from=path, max_restarts=2)
    try:
        job.rescale("m", 2).result(60)
        wait_for(lambda: _each_took(job, 2, 1_000), 30, "both instances")
        assert _tail_is(job, 5)  # 10 batches: both instances' output (round robin)
        job.checkpoint(60)  # records times5 for both instances
        job.upgrade("m", times(7))
        ray.kill(job.topology.hosts()[0], no_restart=True)
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery")
        job.rescale("m", 3).result(60)
        wait_for(lambda: _each_took(job, 3, 1_000), 30, "three instances")
        assert _tail_is(job, 5)  # 10 batches: every instance's output (round robin)
    finally:
        job.cancel()
