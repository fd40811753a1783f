"""The autoscaler on real Ray actors: a paced source steps up 3x and back; the job follows, exactly.

The scaled operator costs a fixed time per record (it waits, as an operator calling a remote service
would), so one instance takes a known rate whatever the machine's load: that is the oracle.
"""

from __future__ import annotations

import math
import time

import pyarrow as pa
import pytest

from chiray import Dataflow, collect, generate
from chiray.control.ds2 import Action

pytestmark = pytest.mark.ray

COST_S = 0.0005              # per record: one instance takes 2,000 records/s
LOW, HIGH = 800.0, 2400.0    # the offered rate: 1 instance, then 3x (2 instances at 75%), then 1 again
UP_AT, DOWN_AT, END_AT = 6.0, 22.0, 38.0
UTILISATION = 0.8


def slow_pass(key, rows, state):
    """Per key: count, and pass the rows on after waiting COST_S per record."""
    time.sleep(COST_S * rows.num_rows)
    state.value = (state.value or 0) + rows.num_rows
    return rows


def test_autoscaler_follows_a_rate_step_up_and_down(ray_session):
    capacity = 1 / COST_S
    oracle_up = math.ceil(HIGH / capacity / UTILISATION)
    oracle_down = math.ceil(LOW / capacity / UTILISATION)
    records = int(LOW * UP_AT + HIGH * (DOWN_AT - UP_AT) + LOW * (END_AT - DOWN_AT))
    source = generate(records, rate=[(0, LOW), (UP_AT, HIGH), (DOWN_AT, LOW)], batch_size=100, num_keys=32,
                      seed=3)
    flow = Dataflow("autoscaled")
    (flow.source(source, name="events").key_by("key").process(slow_pass, name="slow", schema=source.schema())
         .key_by("key").count(name="count").sink(collect(), name="out"))
    job = flow.submit()
    try:
        scaler = job.autoscale(operators=["slow"], latency_budget_ms=1000, interval_s=1.0, max_parallelism=4,
                               target_utilisation=UTILISATION, cooldown_s=2.0, scale_down_stable_s=4.0,
                               catch_up_s=20.0)
        job.wait(timeout=120)
    finally:
        if job.autoscaler is not None:
            job.autoscaler.stop()
    events = list(scaler.events)
    trace = "\n".join(e.describe() for e in events)
    assert scaler.error is None, scaler.error
    ups = [e for e in events if e.decision.action is Action.UP]
    downs = [e for e in events if e.decision.action is Action.DOWN]
    assert 1 <= len(ups) <= 2 and 1 <= len(downs) <= 2, trace
    assert max(e.decision.target for e in ups) >= oracle_up, trace
    assert downs[-1].decision.target == oracle_down, trace
    assert all(e.outcome.get("state") == "DONE" for e in events), trace
    # exact: every record counted once across the rescales (pandas over the same generated records)
    expected = _oracle(source)
    got = job.result().to_pandas().set_index("key")["count"].sort_index()
    assert got.astype("int64").equals(expected.astype("int64"))


def _oracle(source):
    tables = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:  # pacing is advisory (ready_at): read at once
            tables.append(pa.Table.from_batches([batch]).select(["key"]))
    return pa.concat_tables(tables).to_pandas().groupby("key").size().sort_index()


def test_a_detached_job_autoscales_and_shows_why(ray_session, tmp_path):
    """Switched on through the job's manager: each decision is an event and a rescale entry with its inputs."""
    import chiray

    source = generate(int(LOW * 3 + HIGH * 9), rate=[(0, LOW), (3, HIGH)], batch_size=100, num_keys=32, seed=5)
    flow = Dataflow("autoscaled-detached")
    (flow.source(source, name="events").key_by("key").process(slow_pass, name="slow", schema=source.schema())
         .key_by("key").count(name="count").sink(collect(), name="out"))
    job = chiray.submit(flow, name="autoscaled", detached=True, checkpoint_dir=str(tmp_path / "chk"))
    try:
        done = job.autoscale(operators=["slow"], latency_budget_ms=1000, interval_s=1.0, max_parallelism=4,
                             cooldown_s=2.0, scale_down_stable_s=30.0)
        assert done == {"name": "autoscaled", "autoscale": "on", "options": {
            "operators": ["slow"], "latency_budget_ms": 1000, "interval_s": 1.0, "max_parallelism": 4,
            "cooldown_s": 2.0, "scale_down_stable_s": 30.0}}
        job.wait(timeout=120)
        auto = [r for r in job.rescales() if r.get("by") == "autoscale"]
        assert auto and auto[0]["operator"] == "slow" and auto[0]["to"] > auto[0]["from"], job.rescales()
        assert auto[0]["reason"] and auto[0]["predicted_duration_s"] is not None and auto[0]["state"] == "done"
        assert any("autoscale slow: 1 -> " in e for e in job.status().events), job.status().events
        got = job.result().to_pandas().set_index("key")["count"].sort_index()
        assert got.astype("int64").equals(_oracle(source).astype("int64"))
    finally:
        job.forget() if job.status().state.value in ("FINISHED", "FAILED", "CANCELLED") else job.cancel()
