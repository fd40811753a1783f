"""What a small job costs in memory: instances share hosts, and the job's processes stay under a bound.

The bound is set from measurement, with room for noise: a keyed count at parallelism 2 on this machine
takes two hosts of about 200-280 MB, the job controller running inside the first
(``benchmarks.keyed_count`` reports ``job_rss_mb``); with a controller process of its own it took about
150 MB more, and one host per instance and a pandas import in every process about 940 MB.
"""

from __future__ import annotations

import pytest
import ray

from benchmarks.common import RssSampler
from chiray.operators import Dataflow, generate
from tests.oracles import assert_counts_equal, key_counts

pytestmark = pytest.mark.usefixtures("ray_session")

JOB_RSS_BOUND_MB = 650


def _keyed_count(name: str) -> tuple[Dataflow, dict[str, int]]:
    """The flow and its oracle: records per key of its source."""
    source = generate(200_000, num_keys=20_000, batch_size=20_000, num_splits=2, seed=11)
    flow = Dataflow(name)
    (flow.source(source, parallelism=2, name="src").key_by("key").count(parallelism=2, name="count")
         .collect(name="out"))
    return flow, key_counts(source)


def test_a_keyed_count_shares_two_hosts_and_stays_under_the_memory_bound():
    flow, expected = _keyed_count("memory-shared")
    job = flow.submit()
    try:
        hosts = job.topology.hosts()
        assert len(hosts) == 2, "one host per instance index: the largest parallelism"
        assert job.actors == list(hosts), "no process beyond the hosts: the controller runs in the first"
        pools = ray.get([h.__ray_call__.remote(lambda _: __import__("pyarrow").default_memory_pool().backend_name)
                         for h in hosts])
        assert pools == ["system"] * 2, "mimalloc (pyarrow's default) held about 35 MB more per host"
        pids = ray.get([h.pid.remote() for h in hosts])
        with RssSampler(pids, interval=0.02) as rss:
            job.wait(timeout=120)
        peak = rss.peak_mb
    finally:
        job.cancel()
    assert_counts_equal(job.result("out"), expected)
    assert peak < JOB_RSS_BOUND_MB, f"the job's processes peaked at {peak:.0f} MB"


def test_keyed_instances_on_hosts_of_their_own_still_run_exactly():
    flow, expected = _keyed_count("memory-apart")
    job = flow.submit(colocate=False)
    try:
        assert len(job.topology.hosts()) == 4  # two keyed, two others
        job.wait(timeout=120)
    finally:
        job.cancel()
    assert_counts_equal(job.result("out"), expected)


def test_a_controller_in_a_process_of_its_own_still_runs_exactly():
    flow, expected = _keyed_count("memory-own-controller")
    job = flow.submit(controller_process=True)
    try:
        hosts = job.topology.hosts()
        assert len(job.actors) == len(hosts) + 1
        controller_pid = ray.get(job.actors[-1].pid.remote())
        assert controller_pid not in ray.get([h.pid.remote() for h in hosts])
        job.wait(timeout=120)
    finally:
        job.cancel()
    assert_counts_equal(job.result("out"), expected)
