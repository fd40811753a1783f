"""The controller side of control ops (``oprun.py``, ``coordination.py``) without any runtime.

A hand-made ``JobView`` (two sources -> a map -> two sinks) stands for the job;
sink returns are fed to the ``OpCoordinator`` directly.
"""

from __future__ import annotations

from typing import Any

import pytest

from chiray.control.message import ControlMessage, ControlReturn
from chiray.control.op import ControlOp
from chiray.control.oprun import JobView, OpFailedError, OpState, OpTimeoutError
from chiray.control.coordination import OpCoordinator

SRC = [("src", 0), ("src", 1)]
MID = [("m", 0)]
SINKS = [("out", 0), ("out", 1)]
VIEW = JobView(
    "job",
    {"src": {"kind": "source", "parallelism": 2}, "m": {"kind": "transform", "parallelism": 1},
     "out": {"kind": "sink", "parallelism": 2}},
    SRC + MID + SINKS, SRC, SINKS,
    {SRC[0]: MID, SRC[1]: MID, MID[0]: SINKS, SINKS[0]: [], SINKS[1]: []},
)


class Calls(ControlOp):
    """Records its controller-side handler calls."""

    def __init__(self, extra: Any = (), configs: Any = None, fail_in: str | None = None):
        super().__init__()
        self.calls: list[tuple] = []
        self._extra = list(extra)
        self._configs = configs
        self.fail_in = fail_in

    def on_init(self, ctx: Any) -> Any:
        self.calls.append(("init", ctx.job_name))
        return self._configs

    def default_config(self) -> Any:
        return "the-default"

    def extra_edges(self, ctx: Any) -> Any:
        return self._extra

    def on_begin(self, ctx: Any) -> None:
        self.calls.append(("begin",))

    def on_next(self, ctx: Any, payloads: Any) -> None:
        self.calls.append(("next", dict(payloads)))

    def on_complete(self, ctx: Any) -> Any:
        self.calls.append(("complete",))
        if self.fail_in == "on_complete":
            raise LookupError("no")
        return sorted(self.returned.items())

    def on_dispose(self, ctx: Any) -> None:
        self.calls.append(("dispose",))
        if self.fail_in == "on_dispose":
            raise RuntimeError("dispose failed")


def _return(message: ControlMessage, sink: tuple, payload: Any) -> ControlReturn:
    return ControlReturn(message.op_id, (sink,), {sink: payload}, message.origin, message.op)


def test_start_builds_the_message():
    coord = OpCoordinator("ctl", VIEW)
    op = Calls(configs={MID[0]: {"special": True}})
    message = coord.start(op)
    assert message.origin == "ctl" and message.kind == "Calls" and message.blocking and message.seq == -1
    assert message.op is op and message.sender == "controller" and message.payload is None
    assert message.configs.get(MID[0]) == {"special": True}
    assert message.configs.get(SRC[0]) == "the-default"
    assert op.calls == [("init", "job")]
    assert coord.runs[message.op_id].state is OpState.RUNNING
    assert coord.runs[message.op_id].waiting == set(SINKS)


def test_op_ids_are_unique():
    coord = OpCoordinator("ctl", VIEW)
    ids = {coord.start(Calls()).op_id for _ in range(5)}
    assert len(ids) == 5 and all(i.startswith("ctl:") and i.endswith(":Calls") for i in ids)


def test_start_rejects_what_is_not_a_control_op():
    with pytest.raises(TypeError, match="expected a ControlOp, got str"):
        OpCoordinator("ctl", VIEW).start("checkpoint")


def test_start_rejects_extra_edges_to_unknown_instances():
    with pytest.raises(ValueError, match=r"extra edge \('m', 0\) -> \('m', 7\) names an unknown instance"):
        OpCoordinator("ctl", VIEW).start(Calls(extra=[(("m", 0), ("m", 7))]))


def test_extra_edges_travel_in_the_message_as_tuples():
    message = OpCoordinator("ctl", VIEW).start(Calls(extra=[[list(SRC[0]), list(MID[0])]]))
    assert message.extra_edges == ((SRC[0], MID[0]),)


def test_controller_handlers_in_order_and_the_result():
    coord = OpCoordinator("ctl", VIEW)
    op = Calls()
    message = coord.start(op)
    run = coord.runs[message.op_id]
    coord.on_return(_return(message, SINKS[1], "b"))
    assert run.state is OpState.RUNNING and run.waiting == {SINKS[0]}
    coord.on_return(_return(message, SINKS[0], "a"))
    assert run.state is OpState.COMPLETE
    assert op.calls == [("init", "job"), ("begin",), ("next", {SINKS[1]: "b"}), ("next", {SINKS[0]: "a"}),
                        ("complete",), ("dispose",)]
    assert run.result == [(SINKS[0], "a"), (SINKS[1], "b")]
    assert run.finished_at is not None and run.elapsed_s >= 0
    coord.on_return(_return(message, SINKS[0], "late"))  # after completion: ignored
    assert op.calls[-1] == ("dispose",) and run.result == [(SINKS[0], "a"), (SINKS[1], "b")]


def test_an_aggregated_return_covers_several_sinks():
    coord = OpCoordinator("ctl", VIEW)
    message = coord.start(Calls())
    coord.on_return(ControlReturn(message.op_id, tuple(SINKS), {s: s[1] for s in SINKS}, "ctl", message.op))
    assert coord.runs[message.op_id].state is OpState.COMPLETE


def test_returns_for_unknown_ops_are_ignored():
    coord = OpCoordinator("ctl", VIEW)
    coord.on_return(ControlReturn("nope", (SINKS[0],), {}, "ctl"))
    coord.on_return(ControlReturn(None, (SINKS[0],), None, "ctl"))


def test_finished_sinks_are_not_waited_for():
    coord = OpCoordinator("ctl", VIEW)
    first = coord.start(Calls())
    coord.sinks_finished([SINKS[0]])
    assert coord.runs[first.op_id].waiting == {SINKS[1]}
    coord.on_return(_return(first, SINKS[1], 1))
    assert coord.runs[first.op_id].state is OpState.COMPLETE
    coord.sinks_finished([SINKS[1]])
    later = coord.start(Calls())
    assert coord.runs[later.op_id].state is OpState.COMPLETE, "no sink left to return it"
    assert coord.runs[later.op_id].result == []


def test_on_complete_raising_fails_the_op():
    coord = OpCoordinator("ctl", VIEW)
    op = Calls(fail_in="on_complete")
    message = coord.start(op)
    coord.on_return(ControlReturn(message.op_id, tuple(SINKS), {}, "ctl", op))
    run = coord.runs[message.op_id]
    assert run.state is OpState.FAILED and isinstance(run.error, OpFailedError)
    assert "on_complete raised LookupError('no')" in str(run.error)
    assert isinstance(run.error.__cause__, LookupError)
    assert op.calls[-1] == ("dispose",)


def test_a_failing_dispose_does_not_hide_the_outcome():
    coord = OpCoordinator("ctl", VIEW)
    message = coord.start(Calls(fail_in="on_dispose"))
    coord.on_return(ControlReturn(message.op_id, tuple(SINKS), {}, "ctl", message.op))
    assert coord.runs[message.op_id].state is OpState.COMPLETE


def test_first_terminal_state_wins():
    coord = OpCoordinator("ctl", VIEW)
    op = Calls()
    message = coord.start(op)
    run = coord.runs[message.op_id]
    coord.fail_all(ConnectionError("host lost"))
    assert run.state is OpState.FAILED and isinstance(run.error, OpFailedError)
    assert isinstance(run.error.__cause__, ConnectionError)
    coord.on_return(ControlReturn(message.op_id, tuple(SINKS), {}, "ctl", op))
    run.fail(RuntimeError("again"))
    assert run.state is OpState.FAILED and isinstance(run.error.__cause__, ConnectionError)
    assert op.calls.count(("dispose",)) == 1 and ("complete",) not in op.calls


def test_timeout_follows_the_injected_clock():
    coord = OpCoordinator("ctl", VIEW)
    op = Calls()
    op.timeout_s = 2.0
    message = coord.start(op)
    run = coord.runs[message.op_id]
    assert not run.check_timeout(now=run.started + 2.0)
    assert run.check_timeout(now=run.started + 2.5)
    assert isinstance(run.error, OpTimeoutError) and "('out', 0)" in str(run.error)
    assert not run.check_timeout(now=run.started + 10), "already failed"


def test_no_timeout_means_never():
    coord = OpCoordinator("ctl", VIEW)
    op = Calls()
    op.timeout_s = None
    run = coord.runs[coord.start(op).op_id]
    assert not run.check_timeout(now=run.started + 1e9)
    assert run.state is OpState.RUNNING


# --------------------------------------------------------------------------- extra-edge misuse


@pytest.mark.parametrize("edges", [[(MID[0], SRC[0])], [(SINKS[0], MID[0])], [(MID[0], MID[0])],
                                   [(SRC[0], SRC[1]), (SRC[1], SRC[0])]],
                         ids=["back-to-source", "back-from-sink", "self-loop", "two-sources"])
def test_extra_edges_that_make_a_cycle_are_rejected(edges):
    with pytest.raises(ValueError):
        OpCoordinator("ctl", VIEW).start(Calls(extra=edges))


def test_a_repeated_extra_edge_is_rejected_or_merged():
    coord = OpCoordinator("ctl", VIEW)
    try:
        message = coord.start(Calls(extra=[(SRC[0], MID[0]), (SRC[0], MID[0])]))
    except ValueError:
        return
    assert len(message.extra_edges) == 1


def test_restart_limit_keeps_a_user_error_that_takes_other_arguments():
    """An OperatorError (built from operator, index, cause) must survive the restart-limit message."""
    from chiray.actors.errors import OperatorError
    from chiray.control.coordination import JobLifecycle, JobState

    life = JobLifecycle([("out", 0)], max_restarts=1)
    cause = ValueError("bad row")
    life.lost(OperatorError("map", 0, cause), "map[0] raised")
    assert life.state is JobState.RECOVERING
    life.restarted(None, 0.1)
    life.lost(OperatorError("map", 0, cause), "map[0] raised")
    assert life.state is JobState.FAILED
    assert isinstance(life.error, OperatorError) and life.error.__cause__ is cause
    assert "the limit" in life.events[-1]


@pytest.mark.parametrize("window", [None, 60.0])
def test_restarts_are_bounded_per_window_when_one_is_given(window):
    """With ``restart_window_s`` only the recoveries of the last window count (a failure rate); without,
    every recovery of the job's life. Oracle: a plain count over the loss times."""
    from chiray.control.coordination import JobLifecycle, JobState

    now = [0.0]
    life = JobLifecycle([("out", 0)], max_restarts=2, restart_window_s=window, clock=lambda: now[0])
    losses = [0.0, 30.0, 100.0, 150.0, 170.0, 175.0]  # seconds; each loss is followed by a recovery
    for i, at in enumerate(losses):
        now[0] = at
        counted = sum(1 for t in losses[:i] if window is None or t > at - window)
        life.lost(RuntimeError("host died"), f"loss {i}")
        if counted >= 2:
            assert life.state is JobState.FAILED and "the limit" in life.events[-1], life.events
            break
        assert life.state is JobState.RECOVERING, life.events
        assert life.events[-1].startswith(f"recovering (restart {counted + 1} of 2"), life.events
        life.restarted(1, 0.1)
    assert life.state is JobState.FAILED
    assert life.restarts == (2 if window is None else 5)  # within 60 s of 175: 150 and 170, so 175 fails


class Acked(Calls):
    """An op every sink must acknowledge (as a checkpoint's instances do)."""

    def expected_acks(self, ctx: Any) -> Any:
        return SINKS


def test_an_op_whose_sinks_close_before_acknowledging_says_the_job_finished():
    coord = OpCoordinator("ctl", VIEW)
    message = coord.start(Acked())
    coord.sinks_finished(SINKS)
    run = coord.runs[message.op_id]
    assert run.state is OpState.FAILED
    assert "the job finished before the op completed" in str(run.error)
    assert str(SINKS[0]) in str(run.error)


def test_a_branch_s_sinks_keep_the_job_running_until_they_finish_and_a_dropped_branch_lets_it_end():
    from chiray.control.coordination import JobLifecycle, JobState

    life = JobLifecycle([("out", 0)], max_restarts=1)
    life.add_sinks([("big", 0), ("big", 1), ("out", 0)])  # one already known: not counted twice
    life.instance_finished(("out", 0), "o")
    life.instance_finished(("big", 0), "b0")
    assert life.state is JobState.RUNNING and life.snapshot().pending_sinks == (("big", 1),)
    life.lost(RuntimeError("host died"), "host died")  # a recovery expects the branch's sinks again
    life.restarted(1, 0.1)
    assert life.snapshot().pending_sinks == (("big", 0), ("big", 1), ("out", 0))
    life.instance_finished(("out", 0), "o")
    life.drop_sinks([("big", 0), ("big", 1)])  # the branch's op failed: the job no longer waits for it
    assert life.state is JobState.FINISHED and life.results == {("out", 0): "o"}
