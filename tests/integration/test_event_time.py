"""Event time on real Ray actors: windows and their watermarks survive a killed host exactly.

Event time is derived from the generator's deterministic ``seq`` (per split,
increasing) minus a deterministic jitter, so a replay after recovery sees the
very same records and times; the oracle is pandas over the same batches.
"""

from __future__ import annotations

import time

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from operators import Dataflow, bounded_out_of_orderness, generate, tumbling

pytestmark = pytest.mark.usefixtures("ray_session")

N = 100_000
SPLITS = 2
JITTER = 1000
SCHEMA = pa.schema([("key", pa.string()), ("t", pa.int64())])


def with_event_time(batch: pa.RecordBatch) -> pa.RecordBatch:
    """t = seq - (value mod JITTER): out of order by less than JITTER within a split."""
    t = pc.subtract(batch.column("seq"), pc.bit_wise_and(batch.column("value"), 511))
    return pa.RecordBatch.from_arrays([batch.column("key"), t], schema=SCHEMA)


def oracle(src) -> pd.DataFrame:
    batches = []
    for split in src.splits():
        reader = src.open_split(split)
        while (batch := reader.read()) is not None:
            batches.append(with_event_time(batch))
    df = pa.Table.from_batches(batches).to_pandas()
    df["window_start"] = df["t"] - df["t"] % 5000
    return normal(df.groupby(["key", "window_start"]).size().rename("count").reset_index())


def normal(df: pd.DataFrame) -> pd.DataFrame:
    return df[["key", "window_start", "count"]].sort_values(["key", "window_start"]).reset_index(drop=True)


def test_windows_recover_exactly_after_a_killed_host(tmp_path):
    src = generate(N, rate=50_000, batch_size=1000, num_keys=50, num_splits=SPLITS, seed=3)
    flow = Dataflow("windows-recovery", num_bins=64)
    (flow.source(src, parallelism=SPLITS, name="src", watermarks=bounded_out_of_orderness("seq", JITTER))
         .map(with_event_time, schema=SCHEMA, name="time")
         .key_by("key").window(tumbling(5000), on="t").count(name="win", parallelism=2)
         .collect(name="out"))
    job = flow.submit(checkpoint_interval_s=0.3, poll_interval_s=0.2, checkpoint_dir=str(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while job.statistics().records_out("src") < N * 0.4:
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.05)
        ray.kill(job.actors[0], no_restart=True)  # a window instance lives there
        job.wait(timeout=180)
    finally:
        job.cancel()
    assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    got = job.result("out").to_pandas()
    assert not got.duplicated(["key", "window_start"]).any()
    pd.testing.assert_frame_equal(normal(got), oracle(src))
