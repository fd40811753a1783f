"""Blocking alignment (``alignment.py``) and non-blocking tracking (``tracker.py``) as state machines.

Besides hand-written transitions, a property test replays random arrival /
end-of-input sequences against a plain-set oracle of what is expected,
arrived and blocked.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chiray.control.alignment import Aligned, AlignmentState, Collecting, WaitingForFirst
from chiray.control.tracker import Tracking

INPUTS = frozenset({"a", "b", "c"})


# --------------------------------------------------------------------------- blocking


def held(state):
    """What an op holds back in this state: a blocking op the inputs it arrived on, until aligned;
    a non-blocking one nothing."""
    return frozenset() if isinstance(state, Tracking) or state.complete else frozenset(state.arrived)


def test_waiting_collecting_aligned():
    state = WaitingForFirst(INPUTS)
    assert not state.complete and held(state) == frozenset()
    state = state.arrive("b")
    assert isinstance(state, Collecting)
    assert held(state) == {"b"} and not state.complete
    state = state.arrive("a")
    assert isinstance(state, Collecting) and held(state) == {"a", "b"}
    state = state.arrive("c")
    assert isinstance(state, Aligned)
    assert state.complete and state.arrived == INPUTS
    assert held(state) == frozenset(), "an aligned op holds back nothing"


def test_single_input_aligns_on_first_arrival():
    state = WaitingForFirst(frozenset({"only"})).arrive("only")
    assert isinstance(state, Aligned) and held(state) == frozenset()


def test_states_share_one_arrived_set_so_each_arrival_is_constant_time():
    # A state belongs to one instance and is consumed by ``arrive``: the next state reuses its
    # ``arrived`` set (no copy), which keeps alignment over N inputs O(N), not O(N^2).
    first = WaitingForFirst(INPUTS)
    second = first.arrive("a")
    assert second.arrived == {"a"} and second.arrived is first.arrived
    assert second.missing == len(INPUTS) - 1


def test_arriving_twice_on_one_input_is_a_bug():
    state = WaitingForFirst(INPUTS).arrive("a")
    with pytest.raises(RuntimeError, match=r"bug in alignment: .*arrived twice on 'a'"):
        state.arrive("a")


def test_arriving_on_an_unexpected_input_is_a_bug():
    with pytest.raises(RuntimeError, match=r"bug in alignment: .*unexpected input 'z'"):
        WaitingForFirst(INPUTS).arrive("z")


def test_input_ended_before_arrival_lets_the_op_complete():
    state = WaitingForFirst(INPUTS).arrive("a").arrive("b")
    assert held(state) == {"a", "b"}
    state = state.input_ended("c")
    assert isinstance(state, Aligned) and state.complete
    assert state.expected == {"a", "b"} and held(state) == frozenset()


def test_every_input_ending_completes_without_any_arrival():
    state: AlignmentState = WaitingForFirst(frozenset({"a", "b"}))
    state = state.input_ended("a")
    assert not state.complete
    state = state.input_ended("b")
    assert state.complete and held(state) == frozenset()


def test_input_ended_after_arrival_or_unknown_changes_nothing():
    state = WaitingForFirst(INPUTS).arrive("a")
    assert state.input_ended("a") is state, "it arrived there already: the end comes after it"
    assert state.input_ended("zz") is state


def test_extra_edge_inputs_align_like_channels():
    extra = ("extra", ("old", 0))
    state = WaitingForFirst(frozenset({0, 1, extra})).arrive(0).arrive(extra)
    assert held(state) == {0, extra} and not state.complete
    assert state.arrive(1).complete


# --------------------------------------------------------------------------- non-blocking


def test_tracking_never_blocks():
    state: AlignmentState = Tracking(INPUTS)
    for source in ("c", "a"):
        state = state.arrive(source)
        assert isinstance(state, Tracking) and held(state) == frozenset() and not state.complete
    state = state.arrive("b")
    assert isinstance(state, Tracking) and state.complete and held(state) == frozenset()


def test_tracking_detects_the_same_bugs():
    state = Tracking(INPUTS).arrive("a")
    with pytest.raises(RuntimeError, match="arrived twice"):
        state.arrive("a")
    with pytest.raises(RuntimeError, match="unexpected input"):
        state.arrive("q")


def test_tracking_completes_when_the_rest_ends():
    state = Tracking(INPUTS).arrive("a").input_ended("b").input_ended("c")
    assert isinstance(state, Tracking) and state.complete


# --------------------------------------------------------------------------- property: against sets


EVENTS = st.lists(st.tuples(st.sampled_from(["arrive", "end"]), st.integers(0, 5)), max_size=20)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 5), events=EVENTS, blocking=st.booleans())
def test_random_arrivals_and_ends_match_a_set_oracle(n, events, blocking):
    expected, arrived, ended = set(range(n)), set(), set()
    state: AlignmentState = (WaitingForFirst if blocking else Tracking)(frozenset(expected))
    for kind, source in events:
        if kind == "arrive":
            if source in arrived or source not in expected:
                with pytest.raises(RuntimeError, match="bug in alignment"):
                    state.arrive(source)
                continue
            arrived.add(source)
            state = state.arrive(source)
        else:
            if source in ended or source in arrived:
                continue  # an input ends once, and only after what it carried arrived
            ended.add(source)
            expected.discard(source)
            state = state.input_ended(source)
        done = expected <= arrived
        assert state.complete == done
        assert state.arrived == arrived and state.expected == expected
        assert held(state) == (frozenset() if done or not blocking else arrived)
        if blocking:
            assert isinstance(state, Aligned if done else (Collecting, WaitingForFirst))
