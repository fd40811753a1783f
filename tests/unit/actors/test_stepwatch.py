"""The controller's watchdog over long steps (actors/runtime/stepwatch.py): which liveness answers become events."""

from __future__ import annotations

from chiray.actors.runtime.mailbox import LongStep
from chiray.actors.runtime.stepwatch import StepWatch


def _step(seconds: float, since: float = 100.0, index: int = 0) -> LongStep:
    return {"operator": "count", "index": index, "function": "tally", "seconds": seconds, "since": since}


def test_a_long_step_is_reported_once_then_again_at_each_doubling():
    watch = StepWatch(10.0)
    seen = [watch.event(1, _step(s)) is not None for s in (9.9, 10.0, 15.0, 19.9, 20.0, 39.0, 40.0)]
    assert seen == [False, True, False, False, True, False, True]


def test_the_event_names_operator_instance_host_function_and_bound():
    assert StepWatch(2.0).event(3, _step(12.4, index=1)) == (
        "slow step: operator 'count' instance 1 (host 3) has run one step for 12 s in tally, "
        "over step_warning_s=2; still running")


def test_a_new_step_of_the_same_instance_is_reported_afresh_and_none_without_a_bound():
    watch = StepWatch(10.0)
    assert watch.event(0, _step(30.0, since=1.0)) is not None
    assert watch.event(0, _step(11.0, since=50.0)) is not None  # the earlier step ended: a new one
    assert watch.event(0, _step(12.0, since=50.0)) is None
    assert watch.event(0, None) is None
    assert StepWatch(None).event(0, _step(1e6)) is None
