"""The generator's rate schedule and backlog, against a plain step-by-step simulation of the schedule."""

from __future__ import annotations

import math

import pytest

from chiray.operators.generator import RateSchedule, generate
from chiray.operators.logic import SourceSplit
from tests.clock import FakeClock

STEPS = [(0, 100.0), (10, 300.0), (20, 0.0), (30, 50.0)]


def simulated_offered(steps, t: float, dt: float = 1e-3) -> float:
    """Integrate the rate in small steps (the oracle)."""
    total, x = 0.0, 0.0
    while x < t - 1e-12:
        h = min(dt, t - x)
        rate = [r for start, r in steps if start <= x + 1e-12][-1]
        total += rate * h
        x += h
    return total


@pytest.mark.parametrize("t", [0, 3.3, 10, 12.5, 20, 25, 30, 41.7])
def test_offered_matches_the_integral(t):
    assert RateSchedule(STEPS).offered(t) == pytest.approx(simulated_offered(STEPS, t), abs=0.5)


@pytest.mark.parametrize("rows", [0, 1, 999, 1000, 3999.5, 4000, 4001, 4500])
def test_due_is_the_first_time_enough_rows_were_offered(rows):
    schedule = RateSchedule(STEPS)
    t = schedule.due(rows)
    assert schedule.offered(t) >= rows - 1e-6
    assert t == 0 or schedule.offered(t - 1e-3) < rows


def test_due_never_when_the_rate_stops_for_good():
    assert math.isinf(RateSchedule([(0, 10.0), (1, 0.0)]).due(11))


def test_a_paced_reader_follows_the_schedule_and_reports_its_backlog():
    clock = FakeClock(100.0)
    src = generate(None, rate=[(0, 1000), (5, 3000)], batch_size=100, num_splits=2, clock=clock)
    reader = src.open_split(SourceSplit("generate-0", 0))  # 500 rec/s, then 1500 rec/s per split
    assert reader.ready_at() == 100.0 and reader.backlog() == 0
    reader.read()
    assert reader.ready_at() == pytest.approx(100.2)  # 100 rows at 500/s
    clock.now = 106.0  # 2500 + 1500 rows due; 100 read
    assert reader.backlog() == 4000 - 100
    while reader.ready_at() <= clock.now:
        reader.read()
    assert reader.backlog() == 0


def test_a_bounded_source_has_no_backlog_past_its_end():
    clock = FakeClock(100.0)
    reader = generate(250, rate=100, batch_size=100, clock=clock).open_split(SourceSplit("generate-0", 0))
    clock.advance(60)
    assert reader.backlog() == 250
    while reader.read() is not None:
        pass
    assert reader.backlog() == 0


def test_unpaced_sources_do_not_know_their_backlog():
    assert generate(10).open_split(SourceSplit("generate-0", 0)).backlog() is None


@pytest.mark.parametrize("rate", [[(1, 10)], [(0, 10), (0, 20)], [(0, -1)], []])
def test_bad_schedules_are_refused(rate):
    with pytest.raises(ValueError, match="schedule"):
        generate(10, rate=rate)


def test_a_schedule_that_is_not_pairs_is_refused():
    with pytest.raises(TypeError, match="rate must be"):
        generate(10, rate=["fast"])
