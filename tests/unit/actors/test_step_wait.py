"""A rescale step whose job ended meanwhile fails at once, not at the step's timeout (without Ray)."""

from __future__ import annotations

import types

import pytest

from chiray.actors.jobs import rescalejob
from chiray.actors.jobs.rescalejob import JobTarget
from chiray.actors.jobs.rescaler import RescaleError
from chiray.control.coordination import JobState
from chiray.control.oprun import OpTimeoutError


class FakeClock:
    """``time.monotonic`` for ``rescalejob``: it moves only when an op handle waits (no timing on a loaded machine)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class StillRunning:
    """An op handle whose op never completes (it reached instances that finished without acting on it)."""

    def __init__(self, clock: FakeClock, error: BaseException | None = None) -> None:
        self.clock, self.error, self.calls = clock, error, 0

    def result(self, timeout):
        self.calls += 1
        if self.error is not None:
            raise self.error
        self.clock.now += timeout
        raise TimeoutError(f"still running after {timeout} s")

    def progress(self):  # what the op's controller says it still waits for
        return {"state": "RUNNING", "sinks_waiting": [("sink", 0)], "acks_waiting": [("count", 2)]}


def run_with(state: JobState) -> JobTarget:
    """The rescale of 'count' after 1 of its 2 steps, on a job in ``state``."""
    job = types.SimpleNamespace(name="j", final_snapshot=types.SimpleNamespace(state=state))
    return JobTarget(job, "count", types.SimpleNamespace(where=lambda: "1 of 2 steps"))


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(rescalejob, "STEP_POLL_S", 0.05)
    monkeypatch.setattr(rescalejob, "time", fake)
    return fake


def test_a_step_of_a_job_that_ended_fails_at_the_first_look(clock):
    handle = StillRunning(clock)
    with pytest.raises(RescaleError, match=r"the job ended \(FINISHED\) after 1 of 2 steps"):
        run_with(JobState.FINISHED).wait_op(handle, timeout_s=60.0)
    assert handle.calls == 1 and clock.now - 1000.0 == pytest.approx(0.05)  # one poll, not the step's 60 s


def test_a_step_of_a_running_job_waits_for_its_timeout_then_names_what_the_op_waits_for(clock):
    handle = StillRunning(clock)
    with pytest.raises(TimeoutError, match=r"sinks still to return it: \[\('sink', 0\)\]; instances still to "
                                           r"acknowledge it: \[\('count', 2\)\]"):
        run_with(JobState.RUNNING).wait_op(handle, timeout_s=0.3)
    assert clock.now - 1000.0 == pytest.approx(0.3) and handle.calls >= 6  # polled, the job checked between


def test_the_ops_own_timeout_and_failures_pass_through():
    with pytest.raises(OpTimeoutError):
        run_with(JobState.FINISHED).wait_op(StillRunning(FakeClock(), OpTimeoutError("op timed out")), timeout_s=60.0)
