"""What a small job costs in memory: instances share hosts, and the job's processes stay under a bound.

The bound is set from measurement, with room for noise: a keyed count at parallelism 2 on this machine
took two hosts of about 200-250 MB and a controller of about 150 MB (``benchmarks.keyed_count`` reports
``job_rss_mb``); one host per instance and a pandas import in every process took about 940 MB.
"""

from __future__ import annotations

import collections

import pytest
import ray

from benchmarks.common import RssSampler
from chiray.operators import Dataflow, generate

pytestmark = pytest.mark.usefixtures("ray_session")

JOB_RSS_BOUND_MB = 800


def _keyed_count(name: str) -> tuple[Dataflow, list[dict]]:
    source = generate(200_000, num_keys=20_000, batch_size=20_000, num_splits=2, seed=11)
    rows = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:
            rows.extend(batch.select(["key"]).to_pylist())
    flow = Dataflow(name)
    (flow.source(source, parallelism=2, name="src").key_by("key").count(parallelism=2, name="count")
         .collect(name="out"))
    return flow, rows


def test_a_keyed_count_shares_two_hosts_and_stays_under_the_memory_bound():
    flow, rows = _keyed_count("memory-shared")
    job = flow.submit()
    try:
        hosts = job.actors[:-1]
        assert len(hosts) == 2, "one host per instance index: the largest parallelism"
        pids = ray.get([h.pid.remote() for h in hosts]) + [ray.get(job.actors[-1].pid.remote())]
        with RssSampler(pids, interval=0.02) as rss:
            job.wait(timeout=120)
        peak = rss.peak_mb
    finally:
        job.cancel()
    got = {r["key"]: r["count"] for r in job.result("out").to_pylist()}
    assert got == collections.Counter(r["key"] for r in rows)
    assert peak < JOB_RSS_BOUND_MB, f"the job's processes peaked at {peak:.0f} MB"


def test_keyed_instances_on_hosts_of_their_own_still_run_exactly():
    flow, rows = _keyed_count("memory-apart")
    job = flow.submit(colocate=False)
    try:
        assert len(job.actors[:-1]) == 4  # two keyed, two others
        job.wait(timeout=120)
    finally:
        job.cancel()
    got = {r["key"]: r["count"] for r in job.result("out").to_pylist()}
    assert got == collections.Counter(r["key"] for r in rows)
