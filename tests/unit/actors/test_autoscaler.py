"""The autoscaling loop against a simulated job (no Ray): it converges, records why, and rebalances skew."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from chiray.actors.jobs.autoscaler import Autoscaler
from chiray.control.coordination import JobState
from chiray.control.ds2 import Action, Ds2Config
from chiray.control.ops.monitor import MonitorResult
from chiray.operators import Dataflow, collect, from_items
from chiray.operators.graph import physical_plan


class _Handle:
    def __init__(self, outcome: dict[str, Any]):
        self.outcome = outcome

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        return self.outcome


class _Status:
    def __init__(self, state: JobState):
        self.state = state


class SimulatedJob:
    """A source offering ``rate(t)`` records/s into a keyed count whose instances take ``capacity`` each.

    The count's instances share the load evenly unless ``hot`` (instance 0's share of the load) is set.
    """

    def __init__(self, rate, capacity: float, parallelism: int = 1, hot: float | None = None):
        flow = Dataflow("sim")
        (flow.source(from_items([{"k": "a"}]), name="src").key_by("k")
             .count(name="count").sink(collect(), name="out"))
        self.name, self.plan = "sim", physical_plan(flow.graph)
        self.rate, self.capacity, self.parallelism, self.hot = rate, capacity, parallelism, hot
        self.now, self.counters = 0.0, {}
        self.rescales: list[tuple[str, int, str, dict]] = []
        self.state = JobState.RUNNING
        self.events: list[str] = []
        self.refuse_metrics_until = 0.0  # recovering until then: metrics() raises

    def note_event(self, text: str) -> None:
        self.events.append(text)

    def advance(self, seconds: float) -> None:
        offered = self.rate(self.now)
        shares = self._shares()
        taken = min(offered, min(self.capacity / s for s in shares if s > 0))  # the hottest saturates first
        for i, share in enumerate(shares):
            c = self.counters.setdefault(("count", i), {"records_in": 0.0, "records_out": 0.0, "busy_s": 0.0})
            c["records_in"] += taken * share * seconds
            c["busy_s"] += taken * share / self.capacity * seconds
        s = self.counters.setdefault(("src", 0), {"records_in": 0.0, "records_out": 0.0, "busy_s": 0.0,
                                                   "backlog": 0.0})
        s["records_out"] += taken * seconds
        s["busy_s"] += 0.01 * seconds
        s["backlog"] += (offered - taken) * seconds
        self.now += seconds

    def _shares(self) -> list[float]:
        p = self.parallelism
        if self.hot is None or p == 1:
            return [1.0 / p] * p
        return [self.hot] + [(1 - self.hot) / (p - 1)] * (p - 1)

    def metrics(self) -> MonitorResult:
        if self.now < self.refuse_metrics_until:
            raise RuntimeError("job 'sim' is recovering")
        instances = {k: dict(v) for k, v in self.counters.items() if k[0] == "src" or k[1] < self.parallelism}
        return MonitorResult(instances, {"count": {"state_bytes": 10 * 2**20}},
                             {"count": np.full(1024, 1.0)}, self.now)

    def rescale(self, operator: str, parallelism: int, strategy: str, **knobs: Any) -> _Handle:
        self.rescales.append((operator, parallelism, strategy, knobs))
        self.parallelism = parallelism
        if knobs.get("priority") == "hot_first":
            self.hot = None  # the hot bins spread
        self.counters = {k: v for k, v in self.counters.items() if k[0] == "src"}
        return _Handle({"elapsed_s": 0.1, "bytes_moved": 1, "step_log": [{"step": 1}]})

    def status(self) -> _Status:
        return _Status(self.state)


def run(job: SimulatedJob, seconds: float, interval: float = 2.0, **cfg: Any) -> Autoscaler:
    config = Ds2Config(**{"target_utilisation": 0.8, "cooldown_s": 4, "scale_down_stable_s": 10,
                          "max_parallelism": 16, "catch_up_s": 30, **cfg})
    scaler = Autoscaler(job, ["count"], config, latency_budget_ms=200, interval_s=interval, clock=lambda: job.now)
    while job.now < seconds:
        scaler.tick()
        job.advance(interval)
    return scaler


def oracle(rate: float, capacity: float, utilisation: float = 0.8) -> int:
    return math.ceil(rate / capacity / utilisation)


def test_converges_up_and_down_with_few_decisions():
    step_up, step_down = 40, 120
    job = SimulatedJob(lambda t: 3000 if step_up <= t < step_down else 1000, capacity=1000, parallelism=2)
    scaler = run(job, 200)
    ups = [e for e in scaler.events if e.decision.action is Action.UP]
    downs = [e for e in scaler.events if e.decision.action is Action.DOWN]
    assert 1 <= len(ups) <= 2 and 1 <= len(downs) <= 2, [e.describe() for e in scaler.events]
    assert max(e.decision.target for e in ups) >= oracle(3000, 1000)  # 4, plus backlog to catch up
    assert all(e.at - step_up <= 30 for e in ups)
    assert job.parallelism == oracle(1000, 1000, 0.7)  # down to the dead band's edge: 2
    for e in scaler.events:  # every event says why, with its inputs and the prediction
        assert e.decision.reason and e.decision.target_rate > 0 and e.predicted_duration_s > 0
        assert e.outcome == {"elapsed_s": 0.1, "bytes_moved": 1}  # the step log stays in the rescale history


def test_steady_load_never_rescales():
    job = SimulatedJob(lambda t: 1500, capacity=1000, parallelism=2)
    scaler = run(job, 200)
    assert scaler.events == [] and job.rescales == []
    assert scaler.decisions > 50


def test_skew_rebalances_instead_of_adding_instances():
    job = SimulatedJob(lambda t: 900, capacity=1000, parallelism=3, hot=0.95)  # instance 0 does 95% of it
    scaler = run(job, 30)
    event = scaler.events[0]
    assert job.rescales[0][1] == 3 and job.rescales[0][3]["priority"] == "hot_first"
    assert "hot" in event.decision.reason
    # once spread, 900 rec/s on instances of 1000 needs 2 (at most 70% each): a scale-down follows
    assert [r[1] for r in job.rescales[1:]] in ([], [2])


def test_a_failed_rescale_is_an_event_not_a_crash():
    job = SimulatedJob(lambda t: 5000, capacity=1000, parallelism=1)

    def broken(*args: Any, **kwargs: Any) -> _Handle:
        raise RuntimeError("no room for a host")

    job.rescale = broken  # type: ignore[method-assign]
    scaler = run(job, 10)
    assert scaler.events and "no room for a host" in scaler.events[0].outcome["error"]


def test_the_loop_survives_a_recovery_backs_off_and_says_so():
    """metrics() is refused while the job recovers (from 10 s to 40 s of simulated time): the loop pauses,
    doubling its pause, says so in the job's events, resumes, and still scales the overloaded operator."""
    job = SimulatedJob(lambda t: 5000, capacity=1000, parallelism=1)
    job.refuse_metrics_until, job.now = 40.0, 10.0
    pauses: list[float] = []

    def wait(seconds: float) -> bool:  # the thread's pause: advance the simulated job instead of sleeping
        pauses.append(seconds)
        job.advance(seconds)
        return job.now > 120

    scaler = Autoscaler(job, ["count"], Ds2Config(max_parallelism=16), latency_budget_ms=200, interval_s=2.0,
                        clock=lambda: job.now, wait=wait)
    scaler.start()
    scaler.join(timeout=30)
    assert not scaler.is_alive() and scaler.error is None
    paused = [e for e in job.events if e.startswith("autoscale paused")]
    assert len(paused) >= 2 and "recovering" in paused[0], job.events
    assert pauses[1] > pauses[0] * 1.3  # backing off (2x, within the jitter)
    assert "autoscale resumed" in job.events and job.parallelism >= 5, (job.events, job.parallelism)


def test_stops_when_the_job_ends_and_checks_its_arguments():
    job = SimulatedJob(lambda t: 100, capacity=1000)
    job.state = JobState.FINISHED
    scaler = Autoscaler(job, ["count"], Ds2Config(), latency_budget_ms=100, interval_s=0.01)
    scaler.start()
    scaler.join(timeout=10)
    assert not scaler.is_alive() and scaler.error is None
    with pytest.raises(ValueError, match="latency_budget_ms"):
        Autoscaler(job, ["count"], Ds2Config(), latency_budget_ms=0)
    with pytest.raises(ValueError, match="not in the graph"):
        Autoscaler(job, ["nope"], Ds2Config(), latency_budget_ms=10)
