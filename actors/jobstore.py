"""jobstore.py: a detached job's record in Ray's internal key-value store, where a restarted manager finds it.

The record is one pickled ``JobRecord`` under ``chiray/job/<name>`` in the
KV namespace ``"chiray"``. It lives in the cluster's control store (GCS), so
it survives the job manager's process; it goes when the cluster goes or the
job is forgotten (``chiray forget``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import cloudpickle
from ray.experimental import internal_kv

from chiray.control.coordination import JobState

__all__ = ["NAMESPACE", "JobRecord", "save", "load", "delete", "names"]

NAMESPACE = "chiray"
"""The Ray namespace of every job manager actor, and the KV namespace of their records."""

_PREFIX = "chiray/job/"


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What a job manager needs to bring its job back after a restart, and what it reports.

    Attributes:
        name: the job's name.
        flow: the dataflow, pickled (cloudpickle) as submitted.
        config: the ``JobConfig`` (``detached`` set).
        checkpoint_dir: where the job's checkpoints go (fixed at submit).
        restore_from: the checkpoint the job first started from, if any.
        state: ``RUNNING``, ``RECOVERING``, ``FINISHED``, ``FAILED`` or ``CANCELLED``.
        parallelism: operator -> parallelism now (rescales change it).
        events: the manager's events, oldest first (submits, recoveries, rescales, checkpoints).
        rescales: the rescale history, one dict per rescale.
        results: sink -> its result, once the job finished.
        statistics: the last ``JobStatistics`` of a finished job.
        error: what made the job fail, as text.
        submitted_at / ended_at: ``time.time()`` stamps.
        restarts: how often the manager was restarted.
        autoscale: the autoscaler's options while it is on (``None``: off); a restarted manager turns it on.
    """

    name: str
    flow: bytes
    config: Any
    checkpoint_dir: str
    restore_from: str | None
    state: str = "RUNNING"
    parallelism: tuple[tuple[str, int], ...] = ()
    events: tuple[str, ...] = ()
    rescales: tuple[dict, ...] = ()
    results: tuple[tuple[str, Any], ...] = ()
    statistics: Any = None
    error: str | None = None
    autoscale: tuple[tuple[str, Any], ...] | None = None
    submitted_at: float = dataclasses.field(default_factory=time.time)
    ended_at: float | None = None
    restarts: int = 0

    def with_event(self, text: str) -> "JobRecord":
        stamp = time.strftime("%H:%M:%S", time.localtime())
        return dataclasses.replace(self, events=(*self.events, f"{stamp} {text}"))

    @property
    def terminal(self) -> bool:
        return JobState(self.state).terminal


def _key(name: str) -> str:
    return f"{_PREFIX}{name}"


def save(record: JobRecord) -> None:
    """Store ``record`` (overwriting the previous one)."""
    internal_kv._internal_kv_put(_key(record.name), cloudpickle.dumps(record), overwrite=True,
                                 namespace=NAMESPACE)


def load(name: str) -> JobRecord | None:
    """The stored record of job ``name``, or ``None``."""
    data = internal_kv._internal_kv_get(_key(name), namespace=NAMESPACE)
    return None if data is None else cloudpickle.loads(data)


def delete(name: str) -> None:
    internal_kv._internal_kv_del(_key(name), namespace=NAMESPACE)


def names() -> list[str]:
    """The names of every stored job record, sorted."""
    keys = internal_kv._internal_kv_list(_PREFIX, namespace=NAMESPACE)
    return sorted((k.decode() if isinstance(k, bytes) else k)[len(_PREFIX):] for k in keys)
