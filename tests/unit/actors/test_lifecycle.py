"""The data plane's lifecycles alone: every allowed move gives the state written out by hand, every other raises.

The oracle is each enum's transition table, written out here independently of
the code: (state, move) -> next state, or ``IllegalTransition``.
"""

from __future__ import annotations

import pytest

from chiray.actors.runtime.lifecycle import (HostLifecycle, IllegalTransition, InstanceLifecycle, SourceGate,
                                             SourceLifecycle)

I = InstanceLifecycle
INSTANCE_TABLE = {
    (I.RUNNING, "input_ended"): I.FINISHING,
    (I.FINISHING, "input_ended"): I.FINISHING,
    (I.FINISHED, "input_ended"): None,
    (I.RUNNING, "reopen"): I.RUNNING,
    (I.FINISHING, "reopen"): I.RUNNING,
    (I.FINISHED, "reopen"): None,
    (I.RUNNING, "finish"): None,
    (I.FINISHING, "finish"): I.FINISHED,
    (I.FINISHED, "finish"): None,
}

TABLES = {
    **{(state, move): nxt for (state, move), nxt in INSTANCE_TABLE.items()},
    (SourceLifecycle.READING, "exhaust"): SourceLifecycle.EXHAUSTED,
    (SourceLifecycle.EXHAUSTED, "exhaust"): None,
    (SourceGate.OPEN, "halt"): SourceGate.HALTED,
    (SourceGate.HALTED, "halt"): SourceGate.HALTED,
    (SourceGate.OPEN, "open"): SourceGate.OPEN,
    (SourceGate.HALTED, "open"): SourceGate.OPEN,
    (HostLifecycle.RUNNING, "stop"): HostLifecycle.STOPPED,
    (HostLifecycle.STOPPED, "stop"): HostLifecycle.STOPPED,
}


@pytest.mark.parametrize(("state", "move"), list(TABLES), ids=lambda v: getattr(v, "name", v))
def test_each_move_gives_the_state_of_the_table_or_raises(state, move):
    expected = TABLES[(state, move)]
    if expected is None:
        with pytest.raises(IllegalTransition) as caught:
            getattr(state, move)()
        assert caught.value.state is state and state.name in str(caught.value)
    else:
        assert getattr(state, move)() is expected


def test_every_state_is_in_the_table():
    for enum in (InstanceLifecycle, SourceLifecycle, SourceGate, HostLifecycle):
        moves = {move for (state, move) in TABLES if type(state) is enum}
        assert {(state, move) for state in enum for move in moves} <= set(TABLES), enum


def test_the_flags_read_the_state():
    assert [s.finished for s in InstanceLifecycle] == [False, False, True]
    assert [s.input_done for s in InstanceLifecycle] == [False, True, True]
    assert [s.exhausted for s in SourceLifecycle] == [False, True]
    assert [s.halted for s in SourceGate] == [False, True]
    assert [s.stopped for s in HostLifecycle] == [False, True]


def test_an_instance_finishes_once_only_after_its_input_ended():
    state = InstanceLifecycle.RUNNING
    with pytest.raises(IllegalTransition):
        state.finish()
    state = state.input_ended().reopen().input_ended().finish()
    assert state is InstanceLifecycle.FINISHED
    with pytest.raises(IllegalTransition, match="FINISHED cannot finish"):
        state.finish()
