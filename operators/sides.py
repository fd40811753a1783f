"""sides.py: what a source runs beside its job, outside the hosts (a Spark driver), as the job's owner sees it.

Some sources need a process of their own while the job runs: a source fed
by Spark needs a SparkSession, the bridge's coordinator and, for a stream,
the streaming query. ``Source.splits()`` starts that part (in the process
that runs the job's ``submit``: the driver, or a detached job's manager,
which then owns it) and ``Source.side()`` hands it over as a
:class:`SourceSide`: the job's owner asks it whether it still serves the job
(``failure()``, polled), what it is doing (``status()``) and closes it with
the job. A detached job's manager restarts the job from its last checkpoint
when a side fails; the new side resumes from where that checkpoint is. So
that such a restart need not wait for a new side to start from nothing (a
JVM), the manager asks each side to keep a warm standby (``keep_standby()``,
polled: a side starts one once it serves the job) and, on a failure, closes
the failed side with ``hand_over()``, which leaves that standby to the side
the restarted run's source starts.

This module defines the interface only (no Ray); ``chiray.spark_bridge``
implements it.

Example:
    >>> status = SourceSideStatus("events", "spark streaming query", SideState.RUNNING, last_batch=7)
    >>> status.state.value, status.last_batch
    ('RUNNING', 7)
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Any

__all__ = ["SideState", "SourceSide", "SourceSideStatus", "source_sides"]


class SideState(str, enum.Enum):
    """Where a source's side is: ``STARTING -> RUNNING -> STOPPED``, or ``FAILED`` (it is gone)."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


@dataclasses.dataclass(frozen=True, slots=True)
class SourceSideStatus:
    """A snapshot of a source's side, for ``chiray status`` and ``chiray metrics``.

    Attributes:
        source: the source's name.
        kind: what runs there, in words (``"spark streaming query"``).
        state: its :class:`SideState`.
        detail: what it says it does (a streaming query's status message).
        last_batch: the last micro-batch the query started (``None``: none yet, or not a stream).
        input_rows_per_s: rows per second its last micro-batch read from its input.
        rows_waiting: rows handed to the dataflow that its source instances have not read yet.
        batches_committed: micro-batches (or partitions) handed over whole.
        error: why it failed.
    """

    source: str
    kind: str
    state: SideState
    detail: str = ""
    last_batch: int | None = None
    input_rows_per_s: float | None = None
    rows_waiting: int | None = None
    batches_committed: int | None = None
    error: str | None = None

    def describe(self) -> str:
        """One line: ``events (spark streaming query): RUNNING, batch 7, 1,200 rows/s in, 0 rows waiting``."""
        parts = [self.state.value]
        if self.last_batch is not None:
            parts.append(f"batch {self.last_batch}")
        if self.input_rows_per_s is not None:
            parts.append(f"{self.input_rows_per_s:,.0f} rows/s in")
        if self.rows_waiting is not None:
            parts.append(f"{self.rows_waiting:,} rows waiting")
        if self.detail:
            parts.append(self.detail)
        if self.error:
            parts.append(f"error: {self.error}")
        return f"{self.source} ({self.kind}): " + ", ".join(parts)


class SourceSide(abc.ABC):
    """The running side of a source (see the module docstring); ``Source.splits()`` started it.

    Lifecycle: ``RUNNING --close() or hand_over()--> CLOSED`` (idempotent), or
    ``failure()`` answers a reason once it is gone. Only the job's owner touches it.
    """

    @abc.abstractmethod
    def failure(self) -> str | None:
        """Why it no longer serves the job (it died), or ``None``. Answers at once: its owner polls it."""

    @abc.abstractmethod
    def status(self, timeout_s: float = 5.0) -> SourceSideStatus:
        """What it is doing now (a side that does not answer within ``timeout_s`` is reported ``FAILED``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop it and free what it holds, its standby included. Idempotent."""

    def keep_standby(self) -> None:
        """Have a replacement warming up, so that a run restarted after this side failed starts sooner.

        Polled by the job's owner (answers at once); the default keeps none.
        """

    def hand_over(self) -> None:
        """Close it for a restart of the job: its standby (if any) is left for the restarted run's side."""
        self.close()


def source_sides(graph: Any) -> list[tuple[str, SourceSide]]:
    """``(source name, side)`` of each source of ``graph`` (a ``LogicalGraph``) whose ``splits()`` started a side."""
    found = []
    for node in graph.nodes.values():
        source: Any = getattr(node, "source", None)
        side = source.side() if source is not None else None
        if side is not None:
            found.append((node.name, side))
    return found
