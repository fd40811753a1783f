"""Event time on real Ray actors: windows, joins and timers (with their watermarks) survive a killed host exactly.

Event time is derived from the generator's deterministic ``seq`` (per split,
increasing) minus a deterministic jitter, so a replay after recovery sees the
very same records and times; the oracle is pandas over the same batches.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

from chiray.operators import Dataflow, bounded_out_of_orderness, generate, tumbling
from tests.gate import Gate, gated
from tests.waiting import wait_for

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
    df = event_times(src)
    df["window_start"] = df["t"] - df["t"] % 5000
    return normal(df.groupby(["key", "window_start"]).size().rename("count").reset_index())


def normal(df: pd.DataFrame) -> pd.DataFrame:
    return df[["key", "window_start", "count"]].sort_values(["key", "window_start"]).reset_index(drop=True)


def wait_emitted(job, source: str, records: float) -> None:
    wait_for(lambda: job.statistics().records_out(source) >= records, 60, f"{records:.0f} records from {source}")


def test_windows_recover_exactly_after_a_killed_host(tmp_path):
    src = generate(N, batch_size=1000, num_keys=50, num_splits=SPLITS, seed=3)
    gate = Gate(tmp_path)
    flow = Dataflow("windows-recovery", num_bins=64)
    (flow.source(gated(src, gate, N / SPLITS, fast=0.4), parallelism=SPLITS, name="src",
                 watermarks=bounded_out_of_orderness("seq", JITTER))
         .map(with_event_time, schema=SCHEMA, name="time")
         .key_by("key").window(tumbling(5000), on="t").count(name="win", parallelism=2)
         .collect(name="out"))
    job = flow.submit(checkpoint_interval_s=0.3, poll_interval_s=0.2, checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_emitted(job, "src", N * 0.4)
        ray.kill(job.actors[0], no_restart=True)  # a window instance lives there
        gate.open()
        job.wait(timeout=180)
    finally:
        job.cancel()
    assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    got = job.result("out").to_pandas()
    assert not got.duplicated(["key", "window_start"]).any()
    pd.testing.assert_frame_equal(normal(got), oracle(src))


def bucket_timer(key, rows, ctx):
    """Counts per key and 5000-tick bucket with one event-time timer per bucket."""
    counts = dict(ctx.value or {})
    for t in rows.column("t").to_pylist():
        counts[t - t % 5000] = counts.get(t - t % 5000, 0) + 1
        ctx.register(t - t % 5000 + 4999)
    ctx.value = counts


def bucket_fire(key, time, ctx):
    counts = dict(ctx.value)
    n = counts.pop(time - 4999)
    ctx.value = counts or None
    return [{"key": key, "window_start": time - 4999, "count": n}]


def pair_counts(batch: pa.RecordBatch) -> pa.Table:
    """Joined pairs per (key, window) of one batch (keeps the collected output small)."""
    return (pa.Table.from_batches([batch]).group_by(["key", "window_start"]).aggregate([("t", "count")])
            .select(["key", "window_start", "t_count"]).rename_columns(["key", "window_start", "pairs"]))


@pytest.mark.parametrize("disturbance", ["kill", "rescale"])
def test_window_join_and_timers_are_exact_across_a_killed_host_or_a_rescale(tmp_path, disturbance):
    # A rescale needs the input to still flow: an op injected after the sources finished never reaches
    # the instances that prepared its change. The gate keeps the sources open, trickling, until both
    # rescales are done, however long they take.
    fast = 0.4 if disturbance == "kill" else 0.1
    left = generate(N // 8, batch_size=500, num_keys=1000, num_splits=1, seed=4)
    right = generate(N // 8, batch_size=500, num_keys=1000, num_splits=1, seed=5)
    gate = Gate(tmp_path)
    flow = Dataflow(f"join-{disturbance}", num_bins=64)
    streams = [flow.source(gated(src, gate, N // 8, fast=fast, trickle=500), name=name,
                           watermarks=bounded_out_of_orderness("seq", JITTER))
               .map(with_event_time, schema=SCHEMA, name=f"time-{name}")
               for name, src in (("left", left), ("right", right))]
    joined = (streams[0].connect(streams[1]).key_by("key")
              .window_join(tumbling(5000), on="t", name="wj", parallelism=2))
    joined.map(pair_counts, name="pairs").collect(name="joined")
    streams[0].key_by("key").process(bucket_timer, on_timer=bucket_fire, name="timers", parallelism=2) \
        .collect(name="timed")
    job = flow.submit(checkpoint_interval_s=0.3, poll_interval_s=0.2, checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_emitted(job, "left", N // 8 * fast)
        if disturbance == "kill":
            ray.kill(job.actors[0], no_restart=True)
        else:  # join state, window panes and pending timers move with their bins
            for op in ("wj", "timers"):
                assert job.rescale(op, 3, strategy="non_disruptive", chunk_bins=8).result(120)["state"] == "DONE"
        assert job.status().state.name == "RUNNING", "the input ended before the rescales"
        gate.open()
        job.wait(timeout=180)
    finally:
        job.cancel()
    if disturbance == "kill":
        assert any(e.startswith("recovered from") for e in job.status().events), job.status().events
    ldf, rdf = (event_times(src).assign(window_start=lambda d: d["t"] - d["t"] % 5000) for src in (left, right))
    lc = ldf.groupby(["key", "window_start"]).size().rename("l")
    rc = rdf.groupby(["key", "window_start"]).size().rename("r")
    both = pd.concat([lc, rc], axis=1, join="inner")
    pairs = (both["l"] * both["r"]).rename("pairs").reset_index()
    got = job.result("joined").to_pandas().groupby(["key", "window_start"])["pairs"].sum().reset_index()
    pd.testing.assert_frame_equal(got.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  pairs.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  check_dtype=False)
    timed = job.result("timed").to_pandas()
    assert not timed.duplicated(["key", "window_start"]).any()  # each timer fired once, also across recovery
    expected = lc.rename("count").reset_index()
    pd.testing.assert_frame_equal(normal(timed), normal(expected), check_dtype=False)


def event_times(src) -> pd.DataFrame:
    batches = []
    for split in src.splits():
        reader = src.open_split(split)
        while (batch := reader.read()) is not None:
            batches.append(with_event_time(batch))
    return pa.Table.from_batches(batches).to_pandas()


@pytest.mark.parametrize("strategy", ["all_at_once"])  # non_disruptive: the join and timer test below
def test_windows_are_exact_across_a_live_rescale(strategy, tmp_path):
    """Window contents and the watermark move with their bins: 2 -> 3 -> 1 mid-stream, exact result."""
    src = generate(N, batch_size=500, num_keys=50, num_splits=SPLITS, seed=5)
    gate = Gate(tmp_path)
    flow = Dataflow(f"windows-rescale-{strategy}", num_bins=16)
    (flow.source(gated(src, gate, N / SPLITS, fast=0.1, trickle=4_000), parallelism=SPLITS, name="src",
                 watermarks=bounded_out_of_orderness("seq", JITTER))
         .map(with_event_time, schema=SCHEMA, name="time")
         .key_by("key").window(tumbling(5000), on="t").count(name="win", parallelism=2)
         .collect(name="out"))
    job = flow.submit()
    try:
        wait_emitted(job, "src", N * 0.1)
        for p in (3, 1):
            assert job.rescale("win", p, strategy=strategy, chunk_bins=4).result(120)["state"] == "DONE"
        assert job.status().state.name == "RUNNING", "the input ended before the rescales"
        gate.open()
        job.wait(timeout=180)
    finally:
        job.cancel()
    got = job.result("out").to_pandas()
    assert not got.duplicated(["key", "window_start"]).any()
    pd.testing.assert_frame_equal(normal(got), oracle(src))
