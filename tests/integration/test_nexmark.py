"""NEXMark's stateful queries on Ray stay equal to DuckDB's answer across a live rescale and a killed host."""

from __future__ import annotations

import dataclasses

import pytest
import ray

from benchmarks.nexmark.generator import NexmarkConfig
from benchmarks.nexmark.oracle import run_sql, same_rows
from benchmarks.nexmark.queries import Events, all_queries
from benchmarks.nexmark.source import NexmarkSource, watermarks, write_parquet
from benchmarks.nexmark.stateful import HEAVIEST
from tests.gate import Gate, Gated
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("ray_session")

N = 100_000  # 100 s of event time
SHARE = {"person": 1 / 50, "auction": 3 / 50, "bid": 46 / 50}
FAST, HOLD = 0.2, 0.6  # of each split: at once, then a trickle up to HOLD while the test acts


@dataclasses.dataclass(frozen=True)
class GatedEvents(Events):
    """The queries' events, each split held (``tests/gate.py``) mid-stream until the test opens ``gate``."""

    gate: str = ""
    parallelism: int = 2

    def stream(self, flow, kind, parallelism):
        source = NexmarkSource(kind, self.num_events, self.config, self.batch_events)
        per_split = SHARE[kind] * self.num_events / self.parallelism
        gated = Gated(source, self.gate, hold_after=int(FAST * per_split), trickle=per_split / 20,
                      hold_at=int(HOLD * per_split))
        return flow.source(gated, parallelism=parallelism, name=kind, watermarks=watermarks())


def events(tmp_path) -> tuple[GatedEvents, Gate]:
    gate = Gate(tmp_path)
    return GatedEvents(N, NexmarkConfig(event_rate=1_000), batch_events=1_000, gate=gate.path), gate


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    return write_parquet(str(tmp_path_factory.mktemp("nexmark")), N, NexmarkConfig(event_rate=1_000))


def _wait_events(job, fraction: float, timeout: float = 60) -> None:
    """Wait until the job's sources emitted ``fraction`` of their records."""
    kinds = {s.operator for s in job.statistics().instances} & set(SHARE)
    at_least = fraction * sum(SHARE[k] for k in kinds) * N
    wait_for(lambda: sum(job.statistics().records_out(k) for k in kinds) >= at_least, timeout,
             f"the sources to emit {at_least:.0f} records")


def _check(job, query: str, parquet) -> None:
    difference = same_rows(job.result("out").to_pandas(), run_sql(query, parquet))
    assert difference is None, f"{query}: {difference}"


# Every stateful query all at once; the two-input ones (a join, a co-process, a window join) also
# non-disruptively, where the new owner holds back each input's records by that input's own key column.
# Two of each matrix run in `make test-fast`; the rest are marked slow.
FAST_RESCALES = {("q5", "all_at_once"), ("q3", "non_disruptive")}
RESCALES = [pytest.param(q, strategy, knobs, marks=() if (q, strategy) in FAST_RESCALES else pytest.mark.slow)
            for q, strategy, knobs in [(q, "all_at_once", {}) for q in sorted(HEAVIEST)] + [
                (q, "non_disruptive", {"chunk_bins": 64}) for q in ("q3", "q4", "q8")]]
RECOVERIES = [pytest.param(q, marks=() if q == "q8" else pytest.mark.slow) for q in sorted(HEAVIEST)]


@pytest.mark.parametrize("query,strategy,knobs", RESCALES)
def test_stateful_query_rescaled_2_3_2_live_equals_duckdb(query, strategy, knobs, parquet, tmp_path):
    flow_events, gate = events(tmp_path)
    job = all_queries()[query](flow_events, 2).submit(spare_hosts=1)
    try:
        _wait_events(job, FAST)  # records keep trickling in while the operator rescales
        for parallelism in (3, 2):
            progress = job.rescale(HEAVIEST[query], parallelism, strategy, planner="round_robin",
                                   **knobs).result(120)
            assert progress["state"] == "DONE" and progress["parallelism"] == parallelism, progress
        assert job.status().state.name == "RUNNING", "the input ended before the rescales"
        gate.open()
        job.wait(timeout=180)
    finally:
        job.cancel()
    _check(job, query, parquet)


@pytest.mark.parametrize("query", RECOVERIES)
def test_stateful_query_recovers_a_killed_host_exactly(query, parquet, tmp_path):
    flow_events, gate = events(tmp_path)
    job = all_queries()[query](flow_events, 2).submit(checkpoint_interval_s=0.5, poll_interval_s=0.2,
                                                      checkpoint_dir=str(tmp_path / "chk"))
    try:
        _wait_events(job, FAST)
        job.checkpoint()  # at least one checkpoint holds state before the host dies
        ray.kill(job.actors[-1], no_restart=True)
        gate.open()
        job.wait(timeout=180)
        assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    finally:
        job.cancel()
    _check(job, query, parquet)
