"""Control ops end to end in ``LocalRun``: results, failures and timeouts at the controller.

* ``NoOp`` returns the number of sinks that returned it, blocking or not,
  through flat and tree aggregation.
* An op whose controller-side handler raises fails with ``OpFailedError``
  (the handler's exception as its cause) and the job carries on.
* An op that cannot complete (its pipeline is paused) fails with
  ``OpTimeoutError`` once its ``timeout_s`` has passed; late returns are ignored.
* An instance-side handler that raises fails the instance, naming it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.instance import OperatorFailure
from chiray.control.op import ControlOp, InstanceHandler
from chiray.control.oprun import OpFailedError, OpState, OpTimeoutError
from chiray.control.ops import NoOp
from chiray.operators import Dataflow, collect

from .support import SEQ_SCHEMA, SeqSource, ops_done, run_until


def _flow(sink_p: int = 3, hold_end: bool = True, limit: int | None = None) -> tuple[Dataflow, SeqSource]:
    src = SeqSource([30, 30], batch_size=2, hold_end=hold_end, limit=limit, name="src")
    flow = Dataflow("ops")
    (flow.source(src, parallelism=2, name="src")
         .map(lambda b: b, name="m", parallelism=3, schema=SEQ_SCHEMA)
         .sink(collect(), name="out", parallelism=sink_p))
    return flow, src


def _quiesce(run: LocalRun) -> None:
    for _ in range(100_000):
        if not run.step_all():
            return
    raise AssertionError("never quiescent")


@pytest.mark.parametrize("fanout", [None, 2])
@pytest.mark.parametrize("blocking", [True, False])
def test_noop_returns_from_every_sink(blocking, fanout):
    flow, src = _flow(sink_p=5)
    run = LocalRun(flow, JobConfig(control_fanout=fanout, channel_capacity=1, num_hosts=3), seed=1)
    for _ in range(20):
        run.step_all()
    op_run = run.run_control(NoOp(blocking=blocking))
    run_until(run, ops_done(op_run))
    assert op_run.state is OpState.COMPLETE
    assert op_run.result == 5 and set(op_run.op.returned) == {("out", i) for i in range(5)}
    src.hold_end = False
    assert run.run()["out"].num_rows == 60


def test_op_after_the_job_finished_completes_at_once():
    flow, _ = _flow(hold_end=False)
    run = LocalRun(flow, seed=2)
    run.run()
    op_run = run.run_control(NoOp())
    assert op_run.state is OpState.COMPLETE and op_run.result == 0


class Failing(ControlOp):
    """Raises in the controller-side handler named by ``where``; records dispose."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where
        self.disposed = False

    def on_next(self, ctx: Any, payloads: Any) -> None:
        if self.where == "on_next":
            raise ZeroDivisionError("on_next went wrong")

    def on_complete(self, ctx: Any) -> Any:
        if self.where == "on_complete":
            raise ZeroDivisionError("on_complete went wrong")
        return "fine"

    def on_dispose(self, ctx: Any) -> None:
        self.disposed = True


@pytest.mark.parametrize("where", ["on_next", "on_complete"])
def test_controller_handler_error_fails_the_op_with_op_failed_error(where):
    flow, src = _flow()
    run = LocalRun(flow, JobConfig(control_fanout=2), seed=3)
    for _ in range(10):
        run.step_all()
    op = Failing(where)
    op_run = run.run_control(op)
    run_until(run, ops_done(op_run))
    assert op_run.state is OpState.FAILED
    assert isinstance(op_run.error, OpFailedError)
    assert f"{where} raised" in str(op_run.error) and op_run.op_id in str(op_run.error)
    assert isinstance(op_run.error.__cause__, ZeroDivisionError)
    assert op.disposed and op_run.result is None
    # the dataflow is unharmed
    src.hold_end = False
    assert run.run()["out"].num_rows == 60


def test_op_on_a_paused_pipeline_times_out():
    flow, src = _flow(limit=6)
    run = LocalRun(flow, JobConfig(channel_capacity=1), seed=4)
    _quiesce(run)  # sources paused at their gate: nothing moves
    op_run = run.run_control(NoOp(timeout_s=0.5))
    # the hosts are paused too (nobody steps them): the op cannot complete
    assert not op_run.check_timeout(now=op_run.started + 0.25)
    assert op_run.state is OpState.RUNNING
    assert op_run.check_timeout(now=op_run.started + 0.75)
    assert op_run.state is OpState.FAILED and isinstance(op_run.error, OpTimeoutError)
    assert "did not complete in 0.5 s" in str(op_run.error) and "('out', 0)" in str(op_run.error)
    # resumed, the op's messages come back; the failed op stays failed
    src.limit, src.hold_end = None, False
    assert run.run()["out"].num_rows == 60
    assert op_run.state is OpState.FAILED and op_run.result is None


def test_coordinator_check_timeouts_fails_only_overdue_ops():
    flow, _ = _flow(limit=6)
    run = LocalRun(flow, seed=5)
    _quiesce(run)
    overdue = run.run_control(NoOp(timeout_s=1e-6))
    patient = run.run_control(NoOp(timeout_s=None))
    while time.monotonic() <= overdue.started + 1e-6:
        pass  # a few microseconds of the real clock
    run.ops.check_timeouts()
    assert overdue.state is OpState.FAILED and isinstance(overdue.error, OpTimeoutError)
    assert patient.state is OpState.RUNNING
    run_until(run, ops_done(patient))
    assert patient.state is OpState.COMPLETE and overdue.state is OpState.FAILED


class RaisesAtInstance(ControlOp):
    class Instance(InstanceHandler):
        def on_complete(self, ctx: Any) -> None:
            if ctx.instance == ("m", 1):
                raise KeyError("instance handler went wrong")


def test_instance_handler_error_fails_the_instance_naming_it():
    flow, _ = _flow()
    run = LocalRun(flow, seed=6)
    run.run_control(RaisesAtInstance())
    with pytest.raises(OperatorFailure, match=r"^m\[1\]: KeyError") as info:
        run.run(max_rounds=10_000)
    assert isinstance(info.value.cause, KeyError)


def test_an_instance_takes_the_control_messages_at_its_inputs_heads_in_one_step():
    """64 sources -> one count on one host: a NoOp costs one step per source plus one at the count
    (not one per input), and still completes only once it arrived on all 64 inputs; the paced
    sources it woke keep one timer each."""
    from chiray.operators import generate

    flow = Dataflow("fan_in")
    (flow.source(generate(None, rate=0.01, batch_size=1, num_keys=4, key_type="int", num_splits=64),
                 parallelism=64, name="src")
         .key_by("key").count(parallelism=1, emit="updates", name="count").collect(name="out"))
    run = LocalRun(flow, JobConfig(num_hosts=1, control_fanout=8))
    sources = [run.instance(("src", i)) for i in range(64)]
    for _ in range(100_000):  # until every source sent its one record and all is quiet
        if not run.step_all() and all(s.records_in for s in sources):
            break
    host = run.hosts[0]
    op_run = run.run_control(NoOp(blocking=True))
    run._deliver_some()
    steps = 0
    while host.run_step():
        steps += 1
    run._collect()
    assert op_run.state is OpState.COMPLETE and op_run.result == 1
    assert steps <= 64 + 2, steps
    # Each source, made a candidate by the op and found waiting again, still has one timer, not two.
    assert host.scheduler.pending_timers <= 64, host.scheduler.pending_timers
