"""The autoscaler on real Ray actors: the offered rate steps up 3x and back; the job follows, exactly.

The scaled operator costs a fixed time per record (it waits, as an operator calling a remote service
would), so one instance takes a known rate whatever the machine's load: that is the oracle. The rate
is a test's dial (``tests/gate.py``), turned when the job has reacted, not on a clock: each phase lasts
as long as the autoscaler needs, and no longer.
"""

from __future__ import annotations

import math
import time

import pytest

from chiray import Dataflow, collect, generate
from chiray.control.ds2 import Action
from tests.gate import Dial, Dialed
from tests.oracles import key_counts, output_counts
from tests.waiting import wait_for

pytestmark = pytest.mark.ray

COST_S = 0.0005              # per record: one instance takes 2,000 records/s
LOW, HIGH = 800.0, 2400.0    # the offered rate: 1 instance, then 3x (2 instances at 75%), then 1 again
BATCH = 100
UTILISATION = 0.8


def slow_pass(key, rows, state):
    """Per key: count, and pass the rows on after waiting COST_S per record."""
    time.sleep(COST_S * rows.num_rows)
    state.value = (state.value or 0) + rows.num_rows
    return rows


def dialed_flow(name: str, dial: Dial, seed: int) -> tuple[Dataflow, object]:
    source = generate(None, batch_size=BATCH, num_keys=32, seed=seed)
    flow = Dataflow(name)
    (flow.source(Dialed(source, dial.path, (LOW, HIGH, LOW)), name="events").key_by("key")
         .process(slow_pass, name="slow", schema=source.schema())
         .key_by("key").count(name="count").sink(collect(), name="out"))
    return flow, source


def emitted_oracle(source, records: int) -> dict[str, int]:
    """Per-key counts of the first ``records`` records of the (one-split, unbounded) source."""
    reader = source.open_split(source.splits()[0])
    return key_counts([reader.read() for _ in range(records // BATCH)])


def test_autoscaler_follows_a_rate_step_up_and_down(ray_session, tmp_path):
    capacity = 1 / COST_S
    oracle_up = math.ceil(HIGH / capacity / UTILISATION)
    oracle_down = math.ceil(LOW / capacity / UTILISATION)
    dial = Dial(tmp_path)
    flow, source = dialed_flow("autoscaled", dial, seed=3)
    job = flow.submit()
    try:
        scaler = job.autoscale(operators=["slow"], latency_budget_ms=1000, interval_s=1.0, max_parallelism=4,
                               target_utilisation=UTILISATION, cooldown_s=2.0, scale_down_stable_s=4.0,
                               catch_up_s=20.0)
        trace = lambda: "\n".join(e.describe() for e in scaler.events)  # noqa: E731
        wait_for(lambda: scaler.decisions >= 3, 60, "three decisions at the low rate", detail=trace)
        dial.turn(1)
        wait_for(lambda: any(e.decision.action is Action.UP and e.decision.target >= oracle_up
                             for e in scaler.events), 90, f"a scale-up to {oracle_up}", detail=trace)
        dial.turn(2)
        wait_for(lambda: any(e.decision.action is Action.DOWN for e in scaler.events), 90, "a scale-down",
                 detail=trace)
        job.autoscaler.stop()
        dial.turn(3)  # the input ends
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
    emitted = job.statistics().records_out("events")
    assert output_counts(job.result()) == emitted_oracle(source, emitted)


def test_a_detached_job_autoscales_and_shows_why(ray_session, tmp_path):
    """Switched on through the job's manager: each decision is an event and a rescale entry with its inputs."""
    import chiray

    dial = Dial(tmp_path)
    flow, source = dialed_flow("autoscaled-detached", dial, seed=5)
    job = chiray.submit(flow, name="autoscaled", detached=True, checkpoint_dir=str(tmp_path / "chk"))
    try:
        done = job.autoscale(operators=["slow"], latency_budget_ms=1000, interval_s=1.0, max_parallelism=4,
                             cooldown_s=2.0, scale_down_stable_s=30.0)
        assert done == {"name": "autoscaled", "autoscale": "on", "options": {
            "operators": ["slow"], "latency_budget_ms": 1000, "interval_s": 1.0, "max_parallelism": 4,
            "cooldown_s": 2.0, "scale_down_stable_s": 30.0}}
        dial.turn(1)
        auto = lambda: [r for r in job.rescales() if r.get("by") == "autoscale"]  # noqa: E731
        wait_for(lambda: any(r["state"] == "done" for r in auto()), 90, "a scale-up by the autoscaler",
                 detail=job.rescales)
        dial.turn(3)  # the input ends
        job.wait(timeout=120)
        assert auto()[0]["operator"] == "slow" and auto()[0]["to"] > auto()[0]["from"], job.rescales()
        assert auto()[0]["reason"] and auto()[0]["predicted_duration_s"] is not None
        assert any("autoscale slow: 1 -> " in e for e in job.status().events), job.status().events
        emitted = job.statistics().records_out("events")
        assert output_counts(job.result()) == emitted_oracle(source, emitted)
    finally:
        job.forget() if job.status().state.value in ("FINISHED", "FAILED", "CANCELLED") else job.cancel()
