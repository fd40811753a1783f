"""NEXMark's stateful queries on Ray stay equal to DuckDB's answer across a live rescale and a killed host."""

from __future__ import annotations

import time

import pytest
import ray

from benchmarks.nexmark.generator import NexmarkConfig
from benchmarks.nexmark.oracle import run_sql, same_rows
from benchmarks.nexmark.queries import Events, all_queries
from benchmarks.nexmark.source import write_parquet
from benchmarks.nexmark.stateful import HEAVIEST

pytestmark = pytest.mark.usefixtures("ray_session")

# 100 s of event time, paced to about 10 s of wall time so the rescale lands mid-stream
EVENTS = Events(100_000, NexmarkConfig(event_rate=1_000), batch_events=1_000, rate=10_000)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    return write_parquet(str(tmp_path_factory.mktemp("nexmark")), EVENTS.num_events, EVENTS.config)


SHARE = {"person": 1 / 50, "auction": 3 / 50, "bid": 46 / 50}


def _wait_events(job, fraction: float, timeout: float = 60) -> None:
    """Wait until the job's sources emitted ``fraction`` of their records."""
    kinds = {s.operator for s in job.statistics().instances} & set(SHARE)
    at_least = fraction * sum(SHARE[k] for k in kinds) * EVENTS.num_events
    deadline = time.monotonic() + timeout
    while sum(job.statistics().records_out(k) for k in kinds) < at_least:
        assert time.monotonic() < deadline, f"the sources emitted fewer than {at_least} records in {timeout} s"
        time.sleep(0.05)


def _check(job, query: str, parquet) -> None:
    difference = same_rows(job.result("out").to_pandas(), run_sql(query, parquet))
    assert difference is None, f"{query}: {difference}"


# Every stateful query all at once; the two-input ones (a join, a co-process, a window join) also
# non-disruptively, where the new owner holds back each input's records by that input's own key column.
RESCALES = [(q, "all_at_once", {}) for q in sorted(HEAVIEST)] + [
    (q, "non_disruptive", {"chunk_bins": 64}) for q in ("q3", "q4", "q8")]


@pytest.mark.parametrize("query,strategy,knobs", RESCALES)
def test_stateful_query_rescaled_2_3_2_live_equals_duckdb(query, strategy, knobs, parquet):
    job = all_queries()[query](EVENTS, 2).submit(spare_hosts=1)
    try:
        _wait_events(job, 0.1)
        for parallelism in (3, 2):
            progress = job.rescale(HEAVIEST[query], parallelism, strategy, planner="round_robin",
                                   **knobs).result(120)
            assert progress["state"] == "DONE" and progress["parallelism"] == parallelism, progress
        assert job.status().state.name == "RUNNING", "the input ended before the rescales"
        job.wait(timeout=180)
    finally:
        job.cancel()
    _check(job, query, parquet)


@pytest.mark.parametrize("query", sorted(HEAVIEST))
def test_stateful_query_recovers_a_killed_host_exactly(query, parquet, tmp_path):
    job = all_queries()[query](EVENTS, 2).submit(checkpoint_interval_s=0.5, poll_interval_s=0.2,
                                                 checkpoint_dir=str(tmp_path / "chk"))
    try:
        _wait_events(job, 0.2)
        job.checkpoint()  # at least one checkpoint holds state before the host dies
        ray.kill(job.actors[-1], no_restart=True)
        job.wait(timeout=180)
        assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    finally:
        job.cancel()
    _check(job, query, parquet)
