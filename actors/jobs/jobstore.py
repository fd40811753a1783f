"""jobstore.py: a detached job's record in Ray's internal key-value store, where a restarted manager finds it.

The record is one pickled ``JobRecord`` under ``chiray/job/<name>`` in the
KV namespace ``"chiray"``, stamped with ``RECORD_SCHEMA``: a record stored
by a chiray with another layout is refused with a ``JobRecordError``, never
half-read. It lives in the cluster's control store (GCS), so
it survives the job manager's process; it goes when the cluster goes or the
job is forgotten (``chiray forget``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TypedDict

import cloudpickle
from ray.experimental import internal_kv

from chiray.control.coordination import JobState

from ..config import JobConfig
from ..errors import ChirayError
from .jobvalues import EventKind, JobEvent, RescaleRecord, UpgradeRecord

__all__ = ["NAMESPACE", "RECORD_SCHEMA", "JobRecord", "RecordChanges", "JobRecordError", "save", "load", "delete",
           "names"]

NAMESPACE = "chiray"
"""The Ray namespace of every job manager actor, and the KV namespace of their records."""

_PREFIX = "chiray/job/"

RECORD_SCHEMA = 2
"""The layout of ``JobRecord``; bump it with every change of its fields or of the values it holds.
1: states, events and rescales as strings and dicts; 2: ``JobState``, ``JobEvent``, ``RescaleRecord``."""


class JobRecordError(ChirayError):
    """A stored job record this chiray cannot read (another schema version, or not a record)."""


@dataclasses.dataclass(frozen=True, slots=True)
class JobRecord:
    """What a job manager needs to bring its job back after a restart, and what it reports.

    Attributes:
        name: the job's name.
        flow: the dataflow, pickled (cloudpickle) as submitted.
        config: the ``JobConfig`` (``detached`` set).
        checkpoint_dir: where the job's checkpoints go (fixed at submit).
        restore_from: the checkpoint the job first started from, if any.
        state: the job's ``JobState``.
        parallelism: operator -> parallelism now (rescales change it).
        events: the manager's ``JobEvent``s, oldest first (submits, recoveries, rescales, checkpoints).
        rescales: the rescale history, one ``RescaleRecord`` per rescale.
        upgrades: the upgrade history, one ``UpgradeRecord`` per upgrade.
        results: sink -> its result, once the job finished.
        statistics: the last ``JobStatistics`` of a finished job.
        error: what made the job fail, as text.
        failure: what made the job fail (``errors.portable``), raised by ``wait()``.
        submitted_at / ended_at: ``time.time()`` stamps.
        restarts: how often the manager was restarted.
        autoscale: the autoscaler's options while it is on (``None``: off); a restarted manager turns it on.
        schema: the record's layout, ``RECORD_SCHEMA`` when this chiray wrote it.
    """

    name: str
    flow: bytes
    config: JobConfig
    checkpoint_dir: str
    restore_from: str | None
    state: JobState = JobState.RUNNING
    parallelism: tuple[tuple[str, int], ...] = ()
    events: tuple[JobEvent, ...] = ()
    rescales: tuple[RescaleRecord, ...] = ()
    upgrades: tuple[UpgradeRecord, ...] = ()
    results: tuple[tuple[str, object], ...] = ()
    statistics: object = None
    error: str | None = None
    failure: BaseException | None = None
    autoscale: tuple[tuple[str, object], ...] | None = None
    submitted_at: float = dataclasses.field(default_factory=time.time)
    ended_at: float | None = None
    restarts: int = 0
    schema: int = RECORD_SCHEMA

    def with_event(self, kind: EventKind, **fields: object) -> "JobRecord":
        """The record with one more event, of ``kind`` with ``fields``, stamped now."""
        return dataclasses.replace(self, events=(*self.events, JobEvent.of(kind, time.time(), **fields)))

    @property
    def terminal(self) -> bool:
        return self.state.terminal


class RecordChanges(TypedDict, total=False):
    """The fields of a ``JobRecord`` that its job manager changes as the job goes on (``RecordKeeper.update``)."""

    state: JobState
    flow: bytes
    parallelism: tuple[tuple[str, int], ...]
    rescales: tuple[RescaleRecord, ...]
    upgrades: tuple[UpgradeRecord, ...]
    results: tuple[tuple[str, object], ...]
    statistics: object
    error: str | None
    failure: BaseException | None
    autoscale: tuple[tuple[str, object], ...] | None
    ended_at: float | None


def _key(name: str) -> str:
    return f"{_PREFIX}{name}"


def save(record: JobRecord) -> None:
    """Store ``record`` (overwriting the previous one)."""
    internal_kv._internal_kv_put(_key(record.name), cloudpickle.dumps(record), overwrite=True,
                                 namespace=NAMESPACE)


def load(name: str) -> JobRecord | None:
    """The stored record of job ``name``, or ``None``.

    Raises:
        JobRecordError: the stored record has another schema version (or is no record).
    """
    data = internal_kv._internal_kv_get(_key(name), namespace=NAMESPACE)
    return None if data is None else decode(name, data)


def decode(name: str, data: bytes) -> JobRecord:
    """The record of job ``name`` from its stored bytes.

    Raises:
        JobRecordError: another schema version, or not a record.
    """
    try:
        record = cloudpickle.loads(data)
    except Exception as exc:  # a record of another layout may not even unpickle
        raise JobRecordError(f"job {name!r}: its stored record cannot be read ({type(exc).__name__}: {exc}); "
                             f"it was stored by another chiray version (this one reads record schema "
                             f"{RECORD_SCHEMA}): forget it with `chiray forget {name}`") from exc
    schema = getattr(record, "schema", 1) if isinstance(record, JobRecord) else None
    if schema != RECORD_SCHEMA:
        raise JobRecordError(f"job {name!r}: its stored record has schema {schema}, this chiray reads schema "
                             f"{RECORD_SCHEMA}: use the chiray version that submitted it, or forget it with "
                             f"`chiray forget {name}`")
    return record


def delete(name: str) -> None:
    internal_kv._internal_kv_del(_key(name), namespace=NAMESPACE)


def names() -> list[str]:
    """The names of every stored job record, sorted."""
    keys = internal_kv._internal_kv_list(_PREFIX, namespace=NAMESPACE)
    return sorted((k.decode() if isinstance(k, bytes) else k)[len(_PREFIX):] for k in keys)
