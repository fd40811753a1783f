"""jobstatus.py: what the driver's ``Job`` reports of itself: ``JobStatus``, ``JobStatistics`` and the figures
its ``info()`` and ``result()`` derive (a source rate, the newest checkpoint, the sinks' combined output).

These are pure functions of the job's plan, its hosts' answers and its storage; ``Job`` calls them and keeps
what they return.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Mapping, Sequence

import ray

from chiray.control.coordination import JobState
from chiray.operators.graph import OperatorKind, PhysicalPlan

from ..runtime.statistics import InstanceStatistics
from .jobvalues import CheckpointInfo, JobEvent

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from ..runtime.storage import CheckpointStorage

__all__ = ["JobStatus", "JobStatistics", "collect_statistics", "source_rate", "newest_checkpoint",
           "combine_results", "STATISTICS_TIMEOUT_S"]

STATISTICS_TIMEOUT_S = 30.0
"""How long the hosts may take to answer for ``statistics()``."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobStatus:
    """A job's state, the instances that finished, and its events (failures, recoveries).

    Attributes:
        events: the events as text, oldest first (``str`` of each of ``history``).
        history: the same events as ``JobEvent`` values.
    """

    name: str
    state: JobState
    finished_instances: tuple[tuple[str, int], ...]
    events: tuple[str, ...]
    error: BaseException | None
    history: tuple[JobEvent, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class JobStatistics:
    """A snapshot of every instance of a job.

    Attributes:
        instances: per instance, its ``InstanceStatistics``.
        taken_at: ``time.time()`` of the snapshot.
    """

    instances: tuple[InstanceStatistics, ...]
    taken_at: float

    def of(self, operator: str) -> list[InstanceStatistics]:
        return [s for s in self.instances if s.operator == operator]

    def records_out(self, operator: str) -> int:
        return sum(s.records_out for s in self.of(operator))

    def records_in(self, operator: str) -> int:
        return sum(s.records_in for s in self.of(operator))

    @property
    def buffered_batches(self) -> int:
        """Data messages in flight, buffered in channels, or waiting for credit, job-wide."""
        return sum(c.outstanding_batches for s in self.instances for c in s.outputs) + sum(
            s.pending_out for s in self.instances)


def collect_statistics(hosts: Sequence[ActorHandle]) -> JobStatistics:
    """Every instance's statistics, asked of ``hosts`` now.

    Raises:
        RayError: a host did not answer (within ``STATISTICS_TIMEOUT_S``).
    """
    per_host = ray.get([h.statistics.remote() for h in hosts], timeout=STATISTICS_TIMEOUT_S)
    return JobStatistics(tuple(s for stats in per_host for s in stats), time.time())


def source_rate(plan: PhysicalPlan, statistics: JobStatistics, started_at: float) -> float:
    """The records the sources of ``plan`` read per second since ``started_at``."""
    sources = {n.name for n in plan.graph.nodes.values() if n.kind is OperatorKind.SOURCE}
    out = sum(s.records_out for s in statistics.instances if s.operator in sources)
    return out / max(time.time() - started_at, 1e-6)


def newest_checkpoint(storage: CheckpointStorage | None) -> CheckpointInfo | None:
    """The newest complete checkpoint in ``storage`` (``None``: no storage, or none yet)."""
    ids = storage.committed() if storage is not None else []
    return CheckpointInfo(ids[-1], storage.chk_dir(ids[-1])) if ids and storage is not None else None


def combine_results(plan: PhysicalPlan, per_instance: Mapping[tuple[str, int], object]) -> dict[str, object]:
    """Each sink's output once every instance finished: its instances' parts committed (the last epoch is
    safe) and combined (``collect()``: one table)."""
    results: dict[str, object] = {}
    for node in plan.graph.nodes.values():
        if node.kind is OperatorKind.SINK:
            assert node.sink is not None
            parts = [per_instance.get((node.name, i)) for i in range(node.parallelism)]
            node.sink.commit_final(parts)
            results[node.name] = node.sink.combine(parts)
    return results
