"""Each NEXMark query, run in process (LocalRun), equals DuckDB's answer to its SQL on the same events."""

from __future__ import annotations

import pytest

from benchmarks.nexmark.generator import NexmarkConfig
from benchmarks.nexmark.oracle import run_sql, same_rows
from benchmarks.nexmark.queries import Events, all_queries
from benchmarks.nexmark.source import write_parquet
from chiray.actors.jobs.harness import LocalRun

from .nexmark_process import PROCESS_QUERIES

# 1,000 events per second of event time: 50 s, so 5 tumbling windows and 25 hopping ones
EVENTS = Events(50_000, NexmarkConfig(event_rate=1_000), batch_events=2_000)  # 2 s of events a batch


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    return write_parquet(str(tmp_path_factory.mktemp("nexmark")), EVENTS.num_events, EVENTS.config)


CORE = {"q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8"}  # also at parallelism 1; the rest at 2 (suite time)
ONE_ROW = {"q15"}  # statistics per day: 100 s of events are one day


@pytest.mark.parametrize("query,parallelism", [(q, p) for q in sorted(all_queries(), key=lambda q: int(q[1:]))
                                               for p in ((1, 2) if q in CORE else (2,))])
def test_query_equals_duckdb(query, parallelism, parquet):
    got = LocalRun(all_queries()[query](EVENTS, parallelism)).run()["out"].to_pandas()
    expected = run_sql(query, parquet)
    assert len(expected) >= (1 if query in ONE_ROW else 5), f"{query}: the oracle selects almost nothing"
    difference = same_rows(got, expected)
    assert difference is None, f"{query} at parallelism {parallelism}: {difference}"


@pytest.mark.parametrize("query", sorted(PROCESS_QUERIES, key=lambda q: int(q[1:])))
def test_query_with_process_functions_equals_duckdb(query, parquet):
    """The queries the benchmark writes with lifetime_join, top and rolling, written with keyed process
    functions and timers instead (a test of ``process``), give the same answer."""
    got = LocalRun(PROCESS_QUERIES[query](EVENTS, 2)).run()["out"].to_pandas()
    difference = same_rows(got, run_sql(query, parquet))
    assert difference is None, f"{query} with process functions: {difference}"
