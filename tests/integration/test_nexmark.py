"""NEXMark's stateful queries on Ray stay equal to DuckDB's answer across a live rescale and a killed host."""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
import ray

from benchmarks.nexmark.generator import NexmarkConfig
from benchmarks.nexmark.oracle import run_sql, same_rows
from benchmarks.nexmark.queries import Events, all_queries
from benchmarks.nexmark.source import NexmarkSource, watermarks, write_parquet
from benchmarks.nexmark.stateful import HEAVIEST
from tests.gate import Gate, Gated
from tests.waiting import wait_for

# Results only, never timings: `make test` runs them in its low-priority stream (see docs/development.md).
pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.background]

N = 50_000  # 50 s of event time: 5 tumbling and 25 sliding windows of 10 s, 3,000 auctions
SHARE = {"person": 1 / 50, "auction": 3 / 50, "bid": 46 / 50}
FAST, HOLD = 0.2, 0.6  # of each split: at once, then a trickle up to HOLD while the test acts
# Key bins of each keyed operator (the default is 1,024): a bin of window state costs about 13 KB to move
# or checkpoint however few keys it holds (q5's scale-out moved 9.4 MB of windows in 683 of 1,024 bins,
# 0.7 MB in 43 of 64), and what the rescales prove needs bins to move, not many of them.
NUM_BINS = 64


@dataclasses.dataclass(frozen=True)
class GatedEvents(Events):
    """The queries' events, each split held (``tests/gate.py``) mid-stream until the test opens ``gate``."""

    gate: str = ""
    parallelism: int = 2

    def stream(self, flow, kind, parallelism):
        flow.num_bins = NUM_BINS  # each query keys its streams after it made them
        source = NexmarkSource(kind, self.num_events, self.config, self.batch_events)
        span = self.num_events / self.parallelism  # event numbers a split
        per_split = SHARE[kind] * span
        # The hold is at a place in each split's data, also for a reader restored mid-split (a recovery).
        gated = Gated(source, self.gate, hold_after=int(FAST * per_split), trickle=per_split / 20,
                      hold_at=int(HOLD * per_split), position=functools.partial(_position, span, SHARE[kind]))
        return flow.source(gated, parallelism=parallelism, name=kind, watermarks=watermarks())


def _position(span: float, share: float, offset: int) -> int:
    """About how many records of a kind with ``share`` of the events a split of ``span`` events emitted
    before event ``offset`` (a split's end reads as 0: it has nothing left to hold back)."""
    return int(offset % span * share)


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


def _recovered_from(job) -> list[int]:
    """The checkpoint ids the job's recoveries restored (-1: the start)."""
    found = [re.match(r"recovered from (?:checkpoint (\d+)|the start)", e) for e in job.status().events]
    return [int(m.group(1) or -1) for m in found if m]


# One job per stateful query: its heaviest keyed operator is rescaled live 2 -> 3 -> 2, a checkpoint is
# taken, and a host of that operator is killed; the output must equal DuckDB's exactly. So each query is
# exact across a live rescale, and across a recovery from a checkpoint that holds the state the rescales
# moved. The two-input operators (q3's join, q4's co-process, q8's window join: where the new owner holds
# back each input's records by that input's own key column) move with each strategy, one out and the
# other in; the one-input ones (q5's sliding window, q7's keyed process) all at once. That suffices here:
# tests/integration/test_rescale.py scales out and in with each strategy family and kills a host mid-migration
# (tests/unit/actors/test_rescaler.py runs every strategy and knob in-process),
# test_event_time.py moves window-join and timer state non-disruptively and windows all at once, and the
# unit tests cover the planners and the migration ops.
AAO, ND = ("all_at_once", {}), ("non_disruptive", {"chunk_bins": 8})  # ND: a few steps of 8 bins
STRATEGIES = {"q3": (ND, AAO), "q4": (AAO, ND), "q5": (AAO, AAO), "q7": (AAO, AAO), "q8": (ND, AAO)}
FAST_QUERIES = {"q3", "q5", "q8"}  # what `make test-fast` may run; the others are marked slow
QUERIES = [pytest.param(q, marks=() if q in FAST_QUERIES else pytest.mark.slow) for q in sorted(HEAVIEST)]


def _rescale(job, query: str, parallelism: int, strategy: tuple[str, dict]) -> None:
    name, knobs = strategy
    progress = job.rescale(HEAVIEST[query], parallelism, name, planner="round_robin", **knobs).result(120)
    assert progress["state"] == "DONE" and progress["parallelism"] == parallelism, progress
    assert job.status().state.name == "RUNNING", "the input ended before the rescale"


@pytest.mark.parametrize("query", QUERIES)
def test_stateful_query_rescaled_2_3_2_live_then_recovered_equals_duckdb(query, parquet, tmp_path):
    flow_events, gate = events(tmp_path)
    out, back = STRATEGIES[query]
    job = all_queries()[query](flow_events, 2).submit(spare_hosts=1, poll_interval_s=0.2,
                                                      checkpoint_dir=str(tmp_path / "chk"))
    try:
        _wait_events(job, FAST)  # records keep trickling in while the operator rescales
        _rescale(job, query, 3, out)
        _rescale(job, query, 2, back)
        taken = job.checkpoint()  # holds the state both rescales moved
        host = next(i.host for i in job.statistics().of(HEAVIEST[query]) if i.index == 1)
        ray.kill(job.topology.peers()[host], no_restart=True)
        gate.open()
        job.wait(timeout=180)
    finally:
        job.cancel()
    assert _recovered_from(job) == [taken], job.status().events
    _check(job, query, parquet)
