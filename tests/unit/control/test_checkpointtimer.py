"""When the job controller starts a checkpoint of its own (control/checkpointtimer.py), on the suite's fake clock:
the ticks, the skips (a job not running, a checkpoint still running or already committed) and the back-off of a
restored job's first checkpoint."""

from __future__ import annotations

import pytest

from chiray.control.checkpointtimer import RESTORE_RETRY_S, CheckpointTimer
from chiray.control.coordination import JobState

from tests.clock import FakeClock


def test_the_first_tick_is_every_s_after_creation_and_a_wake_too_early_starts_nothing():
    clock = FakeClock()
    timer = CheckpointTimer(10.0, clock)
    assert timer.wait_s() == 10.0
    clock.advance(9.5)
    assert timer.wait_s() == 0.5
    assert not timer.due(JobState.RUNNING, busy=False)
    assert timer.wait_s() == 0.5  # an early wake moves nothing
    clock.advance(0.5)
    assert timer.wait_s() == 0.0
    assert timer.due(JobState.RUNNING, busy=False)


def test_periodic_ticks_follow_the_end_of_the_last_attempt():
    clock = FakeClock(0.0)
    timer = CheckpointTimer(10.0, clock)
    starts = []
    for _ in range(3):
        clock.advance(timer.wait_s())
        if timer.due(JobState.RUNNING, busy=False):
            starts.append(clock.now)
            clock.advance(0.25)  # starting the checkpoint took a while
            timer.tried()
    assert starts == [10.0, 20.25, 30.5]
    assert timer.every_s == 10.0  # no retry_s: the period stays


@pytest.mark.parametrize("state, busy", [(JobState.RUNNING, True), (JobState.RECOVERING, False),
                                         (JobState.FINISHED, False), (JobState.FAILED, False)])
def test_a_tick_passes_without_a_checkpoint_while_the_job_does_not_run_or_one_holds_it_back(state, busy):
    clock = FakeClock()
    timer = CheckpointTimer(5.0, clock)
    clock.advance(5.0)
    assert not timer.due(state, busy=busy)
    assert timer.wait_s() == 5.0  # the skipped tick counts: the next is a period on
    clock.advance(5.0)
    assert timer.due(JobState.RUNNING, busy=False)


def test_a_late_wake_counts_from_the_wake_not_from_the_missed_tick():
    clock = FakeClock(0.0)
    timer = CheckpointTimer(5.0, clock)
    clock.advance(12.0)  # two ticks' worth late: one checkpoint, not two
    assert timer.due(JobState.RUNNING, busy=False)
    assert not timer.due(JobState.RUNNING, busy=False)
    assert timer.wait_s() == 5.0


def test_a_restored_jobs_first_checkpoint_backs_off_to_the_retry_floor_after_an_attempt():
    clock = FakeClock(0.0)
    timer = CheckpointTimer(0.0, clock, retry_s=RESTORE_RETRY_S)
    assert timer.wait_s() == 0.0 and timer.due(JobState.RUNNING, busy=False)  # restore_checkpoint_s=0: at once
    clock.advance(3.0)  # the attempt ran 3 s and failed
    timer.tried()
    assert timer.every_s == RESTORE_RETRY_S == 0.5
    assert timer.wait_s() == 0.5  # from the attempt's end
    clock.advance(0.5)
    assert timer.due(JobState.RUNNING, busy=False)


def test_a_skipped_restore_tick_keeps_the_delay_it_had():
    clock = FakeClock(0.0)
    timer = CheckpointTimer(0.0, clock, retry_s=RESTORE_RETRY_S)
    assert not timer.due(JobState.RECOVERING, busy=False)  # no attempt: no back-off
    assert timer.every_s == 0.0 and timer.wait_s() == 0.0
    long = CheckpointTimer(30.0, clock, retry_s=RESTORE_RETRY_S)
    clock.advance(30.0)
    assert long.due(JobState.RUNNING, busy=False)
    long.tried()
    assert long.every_s == 30.0 and long.wait_s() == 30.0  # a delay above the floor stays
