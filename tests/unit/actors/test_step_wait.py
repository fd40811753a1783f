"""A rescale step whose job ended meanwhile fails at once, not at the step's timeout (without Ray)."""

from __future__ import annotations

import time
import types

import pytest

from chiray.actors import rescalejob
from chiray.actors.rescalejob import JobTarget
from chiray.actors.rescaler import RescaleError
from chiray.control.coordination import JobState
from chiray.control.oprun import OpTimeoutError


class StillRunning:
    """An op handle whose op never completes (it reached instances that finished without acting on it)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.calls = error, 0

    def result(self, timeout):
        self.calls += 1
        if self.error is not None:
            raise self.error
        time.sleep(timeout)
        raise TimeoutError(f"still running after {timeout} s")


def run_with(state: JobState) -> JobTarget:
    """The rescale of 'count' after 1 of its 2 steps, on a job in ``state``."""
    job = types.SimpleNamespace(name="j", final_snapshot=types.SimpleNamespace(state=state))
    return JobTarget(job, "count", types.SimpleNamespace(where=lambda: "1 of 2 steps"))


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(rescalejob, "STEP_POLL_S", 0.05)


def test_a_step_of_a_job_that_ended_fails_at_the_first_look():
    started = time.monotonic()
    with pytest.raises(RescaleError, match=r"the job ended \(FINISHED\) after 1 of 2 steps"):
        run_with(JobState.FINISHED).wait_op(StillRunning(), timeout_s=60.0)
    assert time.monotonic() - started < 5.0  # not the step's 60 s


def test_a_step_of_a_running_job_waits_for_its_timeout():
    handle = StillRunning()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run_with(JobState.RUNNING).wait_op(handle, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 5.0 and handle.calls >= 3  # polled, job checked between


def test_the_ops_own_timeout_and_failures_pass_through():
    with pytest.raises(OpTimeoutError):
        run_with(JobState.FINISHED).wait_op(StillRunning(OpTimeoutError("op timed out")), timeout_s=60.0)
