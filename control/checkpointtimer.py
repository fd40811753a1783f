"""checkpointtimer.py: when the job controller starts a checkpoint of its own.

Two timers: the periodic checkpoints (``JobConfig.checkpoint_interval_s``) and a restored job's first
checkpoint of its own (``JobConfig.restore_checkpoint_s``, tried again until one completes). Both tick
``every_s`` seconds after the end of the last tick; at a tick a checkpoint starts only while the job
runs and nothing holds it back (the last periodic one still running; a committed checkpoint, for the
first). A plain class on an injected clock: the controller sleeps ``wait_s()`` and asks ``due``.

Example:
    >>> now = [0.0]
    >>> timer = CheckpointTimer(10.0, clock=lambda: now[0])
    >>> timer.due(JobState.RUNNING, busy=False)  # too early
    False
    >>> now[0] = 10.0
    >>> timer.due(JobState.RUNNING, busy=False), timer.wait_s()
    (True, 10.0)
"""

from __future__ import annotations

from typing import Callable

from .coordination import JobState

__all__ = ["CheckpointTimer", "RESTORE_RETRY_S"]

RESTORE_RETRY_S = 0.5
"""A restored job's first checkpoint that failed is tried again this long after (at least), not at once."""


class CheckpointTimer:
    """Ticks ``every_s`` seconds apart; says at each whether a checkpoint starts.

    Args:
        every_s: seconds from the end of one tick (or the creation) to the next.
        clock: monotonic seconds (the event loop's clock; a fake one in tests).
        retry_s: after an attempt (``tried``), the ticks are at least this far apart from then on.

    Only its owner touches it (the controller's periodic or restore task). Lifecycle: created when the task
    starts; at each wake ``due``, and ``tried`` after an attempt the owner waited for.
    """

    def __init__(self, every_s: float, clock: Callable[[], float], retry_s: float = 0.0) -> None:
        self.every_s = every_s
        self._clock = clock
        self._retry_s = retry_s
        self._next = clock() + every_s

    def wait_s(self) -> float:
        """Seconds until the next tick (0: it is due)."""
        return max(0.0, self._next - self._clock())

    def due(self, state: JobState, busy: bool) -> bool:
        """Whether to start a checkpoint now; a tick passed counts, and the next is ``every_s`` from now.

        Args:
            state: the job's state now: only a running job checkpoints.
            busy: a reason to skip this tick (the last checkpoint still runs; one was committed).

        Returns:
            False before the tick (a wake too early), while the job does not run, or while ``busy``.
        """
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.every_s
        return state is JobState.RUNNING and not busy

    def tried(self) -> None:
        """An attempt ended (it failed, or the job ended meanwhile): the next tick is ``every_s`` from now,
        and ``every_s`` is at least ``retry_s`` from now on."""
        self.every_s = max(self.every_s, self._retry_s)
        self._next = self._clock() + self.every_s
