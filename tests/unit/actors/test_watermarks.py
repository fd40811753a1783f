"""InputWatermarks: the minimum over open, non-idle inputs, monotone, against a direct recomputation."""

from __future__ import annotations

import random

import pytest

from chiray.actors.runtime.messages import Watermark
from chiray.actors.runtime.watermarks import MIN_WATERMARK, InputWatermarks


@pytest.mark.parametrize("seed", range(20))
def test_watermark_is_the_running_max_of_the_min_over_active_inputs(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    tracker = InputWatermarks(n)
    marks, idle, ended = [MIN_WATERMARK] * n, [False] * n, [False] * n
    current, was_idle = MIN_WATERMARK, False
    for _ in range(60):
        i = rng.randrange(n)
        if ended[i]:
            continue
        if rng.random() < 0.1:
            ended[i] = True
            got = tracker.on_end(i)
        else:
            mark = Watermark(max(marks[i], rng.randint(0, 100)) if rng.random() < 0.8 else marks[i],
                             idle=rng.random() < 0.2)
            idle[i] = mark.idle
            if not mark.idle:
                marks[i] = mark.timestamp
            got = tracker.on_watermark(i, mark)
        if all(ended):
            assert got is None
            break
        active = [marks[j] for j in range(n) if not ended[j] and not idle[j]]
        expected = None
        if not active:
            if not was_idle:
                expected, was_idle = Watermark(current, idle=True), True
        else:
            new = max(current, min(active))
            if new > current or was_idle:
                expected, current, was_idle = Watermark(new), new, False
        assert got == expected
        assert tracker.current == current


def test_an_input_back_from_idle_cannot_lower_the_watermark():
    tracker = InputWatermarks(2)
    tracker.on_watermark(0, Watermark(10))
    assert tracker.on_watermark(1, Watermark(0, idle=True)) == Watermark(10)
    assert tracker.on_watermark(1, Watermark(3)) is None  # holds the minimum, does not lower it
    assert tracker.current == 10
    assert tracker.on_watermark(1, Watermark(20)) is None
    assert tracker.on_watermark(0, Watermark(15)) == Watermark(15)


def test_an_input_added_later_holds_the_minimum_until_its_first_watermark():
    tracker = InputWatermarks(1)
    assert tracker.on_watermark(0, Watermark(10)) == Watermark(10)
    tracker.add_inputs(2)  # a rescale added a channel: records of any time may come on it until it speaks
    assert tracker.on_watermark(0, Watermark(12)) is None
    assert tracker.on_watermark(1, Watermark(11)) == Watermark(11)
    assert tracker.on_watermark(0, Watermark(20)) is None
    assert tracker.on_watermark(1, Watermark(25)) == Watermark(20)
    tracker.add_inputs(3)
    assert tracker.on_watermark(2, Watermark(5)) is None  # it speaks late: event time never goes back
    assert tracker.on_watermark(0, Watermark(30)) is None
    assert tracker.on_watermark(2, Watermark(40)) == Watermark(25)
