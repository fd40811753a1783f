"""managersides.py: the sides of a detached job's sources (Spark drivers) that its job manager owns.

A source's ``splits()`` may start a side (``operators.sides.SourceSide``):
a process that serves the source, such as a Spark driver. The manager of a
detached job owns the sides of its running job's sources: it asks them to
keep a warm standby, restarts the job when one fails, and closes them (or
hands them over to the next run's sides) when the run ends.
"""

from __future__ import annotations

import logging

from chiray.operators.sides import SourceSide, SourceSideStatus

__all__ = ["SourceSides"]

log = logging.getLogger(__name__)


class SourceSides:
    """The sides of one run's sources, by source name; the job manager's watch thread drives them.

    Lifecycle: made with the run's sides when the run is deployed; ``close`` (idempotent) ends them when
    the run ends or fails, after which the object holds none.

    Args:
        job: the job's name (for messages).
        sides: ``(source name, side)`` of each source whose ``splits()`` started a side.
    """

    def __init__(self, job: str, sides: list[tuple[str, SourceSide]] | None = None):
        self.job = job
        self._sides = list(sides or ())

    def failure(self) -> str | None:
        """Why a side failed (the first one found), or ``None``."""
        for _, side in self._sides:
            reason = side.failure()
            if reason is not None:
                return reason
        return None

    def keep_standbys(self) -> None:
        """Have each side keep a warm standby (a side starts one once it serves the job)."""
        for name, side in self._sides:
            try:
                side.keep_standby()
            except Exception as exc:  # a restart then starts its side from nothing
                log.warning("job %s: starting a standby for the side of source %s failed: %r", self.job, name, exc)

    def close(self, hand_over: bool = False) -> None:
        """Close every side; with ``hand_over``, leave their warm standbys to the next run's sides."""
        sides, self._sides = self._sides, []
        for name, side in sides:
            try:
                side.hand_over() if hand_over else side.close()
            except Exception as exc:
                log.warning("job %s: closing the side of source %s failed: %r", self.job, name, exc)

    def statuses(self) -> tuple[SourceSideStatus, ...]:
        """Each side's status, in the order of the sources."""
        return tuple(side.status() for _, side in self._sides)
