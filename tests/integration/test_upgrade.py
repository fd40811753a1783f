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
