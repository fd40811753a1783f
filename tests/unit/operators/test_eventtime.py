"""Durations on event-time columns: a timedelta on a timestamp column, an int on an integer one; a bare
number on a timestamp column and a duration too long for 64-bit ticks are refused when the graph is built."""

from __future__ import annotations

import datetime
import re

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import (Dataflow, bounded_out_of_orderness, collect, from_arrow, session, sliding,
                              tumbling)
from chiray.operators.errors import ChirayError
from chiray.operators.eventtime import MAX_DURATION, DurationRangeError, DurationUnitError, ticks
from chiray.operators.aggregates import AggSpec
from chiray.operators.windows import FixedWindowLogic

T0 = datetime.datetime(2024, 5, 1, 12, 0, 0)


def _events(unit: str = "ms") -> pa.Table:
    times = [T0 + datetime.timedelta(seconds=s) for s in (1, 5, 61, 62)]
    return pa.table({"k": ["a", "b", "a", "b"], "ts": pa.array(times, pa.timestamp(unit)), "n": [1, 2, 3, 4]})


def _keyed(table: pa.Table, delay=datetime.timedelta(seconds=1)):
    flow = Dataflow("d")
    return flow.source(from_arrow(table), name="src", watermarks=bounded_out_of_orderness("ts", delay)).key_by("k")


@pytest.mark.parametrize("unit, per_second", [("s", 1), ("ms", 10**3), ("us", 10**6), ("ns", 10**9)])
def test_a_timedelta_is_ticks_of_the_columns_unit(unit, per_second):
    assert ticks(datetime.timedelta(minutes=2, milliseconds=500), pa.timestamp(unit), "x") == \
        int(120.5 * per_second)
    assert ticks(0, pa.timestamp(unit), "x") == 0  # 0 is 0 in every unit (the defaults)
    assert ticks(120, pa.int64(), "x") == 120


def test_a_bare_number_on_a_timestamp_column_names_the_operator_the_column_and_the_unit():
    with pytest.raises(DurationUnitError) as caught:
        _keyed(_events()).window(tumbling(60), on="ts").count(name="per_minute")
    assert str(caught.value) == ("operator 'per_minute': tumbling(60) on timestamp[ms] column 'ts' would be 60 ms; "
                                 "pass timedelta(seconds=60) (or timedelta(milliseconds=60) if 60 ms is meant)")
    assert isinstance(caught.value, ChirayError) and isinstance(caught.value, TypeError)


@pytest.mark.parametrize("build, text", [
    (lambda k: k.window(sliding(600, 60), on="ts").count(name="w"),
     "operator 'w': the size of sliding(600, 60) on timestamp[us] column 'ts' would be 600 µs; "
     "pass timedelta(seconds=600)"),
    (lambda k: k.window(sliding(datetime.timedelta(minutes=10), 60), on="ts").count(name="w"),
     "operator 'w': the slide of sliding(timedelta(seconds=600), 60) on timestamp[us] column 'ts' would be 60 µs"),
    (lambda k: k.window(session(30), on="ts").count(name="w"),
     "operator 'w': session(30) on timestamp[us] column 'ts' would be 30 µs; pass timedelta(seconds=30)"),
    (lambda k: k.window(tumbling(datetime.timedelta(minutes=1)), on="ts", allowed_lateness=5).count(name="w"),
     "operator 'w': allowed_lateness=5 on timestamp[us] column 'ts' would be 5 µs; pass timedelta(seconds=5)"),
    (lambda k: k.stream.connect(k.stream).key_by("k", "k").window_join(tumbling(10), on="ts", name="w"),
     "operator 'w': tumbling(10) on timestamp[us] column 'ts' would be 10 µs"),
], ids=["sliding size", "sliding slide", "session gap", "allowed lateness", "window join"])
def test_every_window_duration_refuses_a_bare_number_on_a_timestamp_column(build, text):
    with pytest.raises(DurationUnitError, match=f"^{re.escape(text)}"):
        build(_keyed(_events("us")))


def test_out_of_orderness_refuses_a_bare_number_on_a_timestamp_column():
    with pytest.raises(DurationUnitError, match=re.escape(
            "operator 'src': bounded_out_of_orderness('ts', 2) on timestamp[ns] column 'ts' would be 2 ns; "
            "pass timedelta(seconds=2)")):
        Dataflow("d").source(from_arrow(_events("ns")), name="src", watermarks=bounded_out_of_orderness("ts", 2))


def test_integer_tick_columns_keep_taking_bare_numbers():
    table = pa.table({"k": ["a", "b"], "t": [1, 70]})
    flow = Dataflow("d")
    keyed = flow.source(from_arrow(table), watermarks=bounded_out_of_orderness("t", 5)).key_by("k")
    keyed.window(sliding(60, 20), on="t", allowed_lateness=10).count(name="w").sink(collect())
    with pytest.raises(DurationUnitError, match="is a timedelta but the time column is int64"):
        keyed.window(tumbling(datetime.timedelta(seconds=1)), on="t").count(name="w2")


def test_a_window_whose_time_type_shows_only_at_run_time_refuses_a_bare_number_then():
    logic = FixedWindowLogic("k", "ts", tumbling(60), 8, aggs=[AggSpec("n", "count")])  # type unknown: ints pass
    with pytest.raises(DurationUnitError, match=r"tumbling\(60\) on timestamp\[ms\] column 'ts' would be 60 ms"):
        logic.process(_events().to_batches()[0], 0)


def test_three_hundred_years_of_lateness_on_nanoseconds_is_refused_at_build_time_not_overflowed_later():
    with pytest.raises(DurationRangeError) as caught:
        _keyed(_events("ns")).window(tumbling(datetime.timedelta(minutes=1)), on="ts",
                                     allowed_lateness=datetime.timedelta(days=365 * 300)).count(name="w")
    text = str(caught.value)
    assert text.startswith("operator 'w': allowed_lateness=timedelta(days=109500) on timestamp[ns] column 'ts' is "
                           "9.46e+18 ticks, more than the 4.61e+18 (about 146 years in timestamp[ns])")
    assert isinstance(caught.value, ChirayError) and not isinstance(caught.value, OverflowError)


@pytest.mark.parametrize("build", [
    lambda k: k.window(session(datetime.timedelta(days=365 * 200)), on="ts").count(name="w"),
    lambda k: k.window(tumbling(datetime.timedelta(days=365 * 200)), on="ts").count(name="w"),
], ids=["session gap", "window size"])
def test_every_huge_duration_is_refused(build):
    with pytest.raises(DurationRangeError, match="operator 'w'"):
        build(_keyed(_events("ns")))
    with pytest.raises(DurationRangeError, match="operator 'src'"):
        _keyed(_events("ns"), delay=datetime.timedelta(days=365 * 200))
    with pytest.raises(DurationRangeError, match="on its time column is 1e\\+19 ticks"):
        ticks(10**19, None, "allowed_lateness")


def test_the_longest_duration_allowed_runs_on_times_of_today_without_overflow():
    """The bound leaves room: a window at today's nanoseconds with the longest lateness fires and expires."""
    now = int(np.datetime64("2026-11-27T00:00:00", "ns").astype(np.int64))
    logic = FixedWindowLogic("k", "t", tumbling(10**9), 8, aggs=[AggSpec("n", "count")],
                             allowed_lateness=MAX_DURATION, time_type=pa.int64())
    logic.process(pa.record_batch({"k": ["a", "a"], "t": [now, now + 1]}), 0)
    fired = logic.on_watermark(now + 2 * 10**9)
    assert [r["n"] for b in fired for r in b.to_pylist()] == [2]
    logic.process(pa.record_batch({"k": ["a"], "t": [now + 5]}), 0)  # within the lateness: updates the window
    assert logic.late_records == 0
