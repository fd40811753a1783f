"""Each NEXMark query, run in process (LocalRun), equals DuckDB's answer to its SQL on the same events."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks.nexmark.oracle import run_sql
from benchmarks.nexmark.queries import QUERIES, Events
from benchmarks.nexmark.source import write_parquet
from chiray.actors.harness import LocalRun

EVENTS = Events(200_000, batch_events=20_000)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    return write_parquet(str(tmp_path_factory.mktemp("nexmark")), EVENTS.num_events, EVENTS.config)


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = frame[column].astype("datetime64[ms]")
    return frame.sort_values(list(frame.columns), kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("parallelism", [1, 2])
@pytest.mark.parametrize("query", sorted(QUERIES))
def test_query_equals_duckdb(query, parallelism, parquet):
    got = LocalRun(QUERIES[query](EVENTS, parallelism)).run()["out"].to_pandas()
    expected = run_sql(query, parquet)
    assert len(expected) > 0, f"{query}: the oracle selects nothing; the test would prove little"
    assert list(got.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(_sorted(got), _sorted(expected), check_dtype=False)
