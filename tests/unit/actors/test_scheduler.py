"""The scheduler alone, with scripted instances and a fake ``now``: candidates in turn, timers, injected sources.

The oracle is the order a plain round-robin over the candidates gives, and the
timer rules written out by hand (a paced source is looked at again when due,
at the latest after ``RECHECK_S``; one that became due between the two
questions is looked at again at once).
"""

from __future__ import annotations

from chiray.actors.runtime.scheduler import RECHECK_S, Scheduler


class Scripted:
    """An instance whose answers the test sets: runnable per call, its wake time, source or not."""

    def __init__(self, name: str, answers: list[bool] | None = None, wake: float | None = None,
                 is_source: bool = False):
        self.name = name
        self.answers = list(answers or [])
        self.wake = wake
        self.is_source = is_source
        self.finished = False
        self.halted = False
        self.exhausted = False
        self.asked = 0

    def runnable(self, now: float) -> bool:
        self.asked += 1
        return self.answers.pop(0) if self.answers else False

    def wake_time(self) -> float | None:
        return self.wake

    def outputs_blocked(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self.name


def test_candidates_take_turns_and_a_runnable_one_goes_to_the_back():
    a, b, c = Scripted("a", [True, True]), Scripted("b", [True]), Scripted("c", [False])
    sched = Scheduler([a, b, c])
    order = []
    while (inst := sched.next_runnable(0.0)) is not None:
        order.append(inst.name)
    assert order == ["a", "b", "a"], "round robin: a, b, (c cannot), a again; b is out of answers"
    assert sched.next_runnable(0.0) is None, "nobody is a candidate until woken"
    b.answers = [True]
    sched.wake(b)
    assert sched.next_runnable(0.0) is b


def test_a_paced_source_is_looked_at_again_when_due_or_after_the_recheck_bound():
    soon = Scripted("soon", [False, True], wake=10.02, is_source=True)
    later = Scripted("later", [False, True], wake=15.0, is_source=True)
    sched = Scheduler([soon, later])
    assert sched.next_runnable(10.0) is None
    assert sched.next_timer == 10.02
    assert sched.next_runnable(10.019) is None and soon.asked == 1, "its timer is not due yet"
    assert sched.next_runnable(10.02) is soon
    assert sched.next_runnable(10.0 + RECHECK_S - 0.001) is None and later.asked == 1
    assert sched.next_runnable(10.0 + RECHECK_S) is later, "looked at again within RECHECK_S, not at 15 s"


def test_a_source_that_became_due_between_the_two_questions_still_runs():
    # Asked, it could not run; asked when it would be due, it says "now" (its reader got data meanwhile).
    src = Scripted("src", [False, True], wake=None, is_source=True)
    sched = Scheduler([src])
    assert sched.next_runnable(5.0) is None
    assert sched.next_timer == 5.0, "a timer due at once, not never"
    assert sched.next_runnable(5.0) is src


def test_one_live_timer_per_instance_and_a_finished_or_forgotten_one_is_not_asked():
    src = Scripted("src", [], wake=20.0, is_source=True)
    sched = Scheduler([src])
    for now in (10.0, 10.001, 10.002):  # found waiting again and again (each op makes it a candidate)
        sched.wake(src)
        assert sched.next_runnable(now) is None
    assert sched.pending_timers == 1, "a later re-check never adds a timer behind an earlier one"
    sched.forget(src)
    src.answers = [True]
    assert sched.next_runnable(100.0) is None and src.answers == [True]
    done = Scripted("done", [], is_source=True)
    done.finished = True
    sched.wake(done)
    assert sched.next_runnable(1.0) is None and sched.pending_timers == 0, "a finished source gets no timer"
    halted = Scripted("halted", [], is_source=True)
    halted.halted = True  # a stop's cut passed it: it reads nothing until resumed (a control op wakes it)
    sched.wake(halted)
    assert sched.next_runnable(1.0) is None and sched.pending_timers == 0, "a halted source gets no timer"
    held = Scripted("held", [], is_source=True)
    held.exhausted = True  # it read its last batch but is held open for a rescale's op, which wakes it
    sched.wake(held)
    assert sched.next_runnable(1.0) is None and sched.pending_timers == 0, "an exhausted source gets no timer"
    assert sched.next_runnable(1.0) is None and held.asked == 1, "nor is it asked again at the next step"


def test_injected_sources_are_handed_over_once():
    a, b = Scripted("a", is_source=True), Scripted("b", is_source=True)
    sched = Scheduler([a, b])
    assert list(sched.take_injected()) == []
    sched.injected(b)
    sched.injected(a)
    sched.injected(b)
    assert list(sched.take_injected()) == [b, a]
    assert list(sched.take_injected()) == []
