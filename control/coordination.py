"""coordination.py: the controller's bookkeeping of a job: which instances finished, failed, or were lost.

A plain state machine, unit-tested without Ray; ``actors.controller`` wraps
it in a Ray actor. Lifecycle::

    RUNNING --all sinks finished--> FINISHED
    RUNNING --instance failed / host lost--> FAILED
    RUNNING --cancel()--> CANCELLED

The first terminal state wins; later events are ignored.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Iterable

__all__ = ["JobState", "JobLifecycle", "LifecycleSnapshot"]


class JobState(str, enum.Enum):
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self is not JobState.RUNNING


@dataclasses.dataclass(frozen=True, slots=True)
class LifecycleSnapshot:
    """What the controller knows of a job at one moment."""

    state: JobState
    finished_instances: tuple[tuple[str, int], ...]
    pending_sinks: tuple[tuple[str, int], ...]
    error: BaseException | None
    events: tuple[str, ...]


class JobLifecycle:
    """Tracks a job's instances to completion or failure.

    Args:
        sinks: every sink instance; the job finishes when all have finished.
    """

    def __init__(self, sinks: Iterable[tuple[str, int]]):
        self.state = JobState.RUNNING
        self._pending = set(sinks)
        if not self._pending:
            raise ValueError("a job needs at least one sink instance")
        self._finished: list[tuple[str, int]] = []
        self.results: dict[tuple[str, int], Any] = {}
        self.error: BaseException | None = None
        self.events: list[str] = []

    def instance_finished(self, instance: tuple[str, int], result: Any = None) -> None:
        if instance in self._finished:
            return
        self._finished.append(instance)
        if instance in self._pending:
            self._pending.discard(instance)
            self.results[instance] = result
        if not self._pending and self.state is JobState.RUNNING:
            self.state = JobState.FINISHED
            self.events.append("finished")

    def fail(self, error: BaseException, reason: str) -> None:
        if self.state.terminal:
            return
        self.state = JobState.FAILED
        self.error = error
        self.events.append(f"failed: {reason}")

    def cancel(self) -> None:
        if self.state.terminal:
            return
        self.state = JobState.CANCELLED
        self.events.append("cancelled")

    def snapshot(self) -> LifecycleSnapshot:
        return LifecycleSnapshot(self.state, tuple(self._finished), tuple(sorted(self._pending)),
                                 self.error, tuple(self.events))
