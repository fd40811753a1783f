"""The hand-off buffer's rules without Ray or Spark: credit, commit of successful attempts, replay."""

from __future__ import annotations

import pytest

from spark_bridge.units import SparkUnitFailed, UnitBuffer

UNITS = [(0, p) for p in range(6)]


def push_all(buf: UnitBuffer, unit, generation: int, attempt: int, batches: int, rows: int = 10) -> None:
    for seq in range(batches):
        assert buf.push(unit, generation, attempt, seq, f"{unit}-{attempt}-{seq}".encode(), rows)


def test_launch_respects_the_credit_window_and_wanted_units_jump_the_queue():
    buf = UnitBuffer(UNITS, max_units=2)
    assert buf.launch() == (1, [(0, 0), (0, 1)])
    assert buf.launch() == (1, [])  # no credit left
    assert buf.take((0, 4)) is None  # a source instance waits for unit 4: launched despite the window
    assert buf.launch() == (2, [(0, 4)])
    assert buf.statistics().buffered_units == 3


def test_only_the_attempt_spark_reports_successful_is_visible():
    buf = UnitBuffer(UNITS, max_units=1)
    generation, [unit] = buf.launch()
    push_all(buf, unit, generation, attempt=7, batches=2)  # failed mid-push
    push_all(buf, unit, generation, attempt=8, batches=3)  # the retry
    assert buf.staged_rows(unit) == 50
    buf.job_done(generation, [unit], None, succeeded=[(unit, 8, 3)])
    assert buf.take(unit) == [f"{unit}-8-{s}".encode() for s in range(3)]
    stats = buf.statistics()
    assert (stats.discarded_attempts, stats.delivered_rows, stats.buffered_rows) == (1, 30, 0)
    assert not buf.push(unit, generation, 9, 0, b"late speculative", 10)  # told to stop
    assert buf.statistics().rejected_pushes == 1


def test_a_delivered_unit_is_recomputed_when_wanted_again():
    buf = UnitBuffer(UNITS[:1], max_units=1)
    g1, [unit] = buf.launch()
    push_all(buf, unit, g1, attempt=1, batches=1)
    buf.job_done(g1, [unit], None, succeeded=[(unit, 1, 1)])
    assert buf.take(unit) is not None
    assert buf.take(unit) is None  # a restored source instance asks again: replay
    g2, again = buf.launch()
    assert again == [unit] and g2 == g1 + 1
    push_all(buf, unit, g2, attempt=5, batches=1)
    buf.job_done(g1, [unit], None)  # a stale report of the older launch changes nothing
    buf.job_done(g2, [unit], None, succeeded=[(unit, 5, 1)])
    assert buf.take(unit) == [f"{unit}-5-0".encode()]
    assert buf.statistics().committed_units == 2


def test_a_failed_spark_job_reaches_the_waiting_source_with_its_error():
    buf = UnitBuffer(UNITS[:2], max_units=2)
    generation, units = buf.launch()
    buf.job_done(generation, units, "PythonException: ValueError: bad row")
    with pytest.raises(SparkUnitFailed, match="partition 1 .*bad row"):
        buf.take((0, 1))


def test_misuse_is_named():
    with pytest.raises(ValueError, match="max_units"):
        UnitBuffer(UNITS, max_units=0)
    buf = UnitBuffer(UNITS, max_units=1)
    with pytest.raises(KeyError, match="unknown unit"):
        buf.take((3, 3))
    generation, [unit] = buf.launch()
    push_all(buf, unit, generation, attempt=1, batches=1)
    with pytest.raises(ValueError, match="bug in spark_bridge"):
        buf.job_done(generation, [unit], None, succeeded=[(unit, 1, 2)])  # a batch never arrived
