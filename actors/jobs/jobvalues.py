"""jobvalues.py: the frozen values that cross the job interface (``JobInfo``, ``JobEvent``, ``RescaleProgress``,
``RescaleRecord``, ``CheckpointInfo``) and their plain JSON forms.

Each value is a ``dataclass(frozen=True, slots=True)`` that pickles across
Ray processes. ``as_dict()`` gives the dict a verb returned before these
values existed (same keys, enums as their values) and ``to_json()`` the same
as JSON-able data: the CLI's ``--json`` output. A value also reads like that
dict (``info["state"]``, ``progress.get("steps_done")``, ``"error" in
record``), so code written against the dicts keeps working; new code reads
the attributes. A ``JobEvent`` becomes text only in ``str(event)`` (and the
CLI that prints it): enum members render as their values, never as reprs.

Example:
    >>> from chiray.actors.jobs.jobvalues import EventKind, JobEvent, RescaleOutcome
    >>> str(JobEvent.of(EventKind.RESCALE_ENDED, None, operator="count", **{"from": 2}, to=3,
    ...                 outcome=RescaleOutcome.DONE))
    'rescale count 2 -> 3 done'
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Any, Callable, Iterator, Mapping, TypeAlias

from chiray.control.coordination import JobState
from chiray.operators.sides import SourceSideStatus

__all__ = ["EventKind", "JobEvent", "JobInfo", "RescaleProgress", "RescaleRecord", "CheckpointInfo", "RescaleState",
           "RescaleOutcome", "UpgradeOutcome", "UpgradeRecord", "plain_json", "JsonValue"]

JsonValue: TypeAlias = "str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]"
"""JSON-able data: what ``plain_json`` and the values' ``to_json()`` return."""

_RENAMED = {"from_": "from"}
"""Attribute -> key in the dict form, where the key is a Python keyword."""


def plain_json(value: object) -> JsonValue:
    """``value`` as JSON-able data: values by their ``to_json()``, other dataclasses field by field, enums by
    value, tuples as lists, NumPy arrays as lists, exceptions as their text."""
    if isinstance(value, _Value) or hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k if not isinstance(k, tuple) else "/".join(map(str, k))): plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    if isinstance(value, BaseException):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class RescaleState(str, enum.Enum):
    """Where a driver's rescale run is: ``WAITING -> PLANNING -> MIGRATING -> DONE | FAILED``."""

    WAITING = "WAITING"
    PLANNING = "PLANNING"
    MIGRATING = "MIGRATING"
    DONE = "DONE"
    FAILED = "FAILED"


class RescaleOutcome(str, enum.Enum):
    """A rescale's state in a job manager's record (its history, as the CLI shows it)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


def _plain(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


class UpgradeOutcome(str, enum.Enum):
    """How an upgrade ended (``UpgradeRecord.outcome``)."""

    DONE = "done"
    ROLLED_BACK = "rolled back"
    REFUSED = "refused"
    FAILED = "failed"


class _Value:
    """What the job values share: the dict form, its JSON, and reading the value like that dict."""

    __slots__ = ()
    _OMIT_NONE: tuple[str, ...] = ()
    """Keys left out of the dict form while ``None`` (the dicts before had them only when set)."""

    def as_dict(self) -> dict[str, Any]:
        """The value as the dict its verb returned before (enums as their values)."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.name in self._OMIT_NONE:
                continue
            out[_RENAMED.get(f.name, f.name)] = _plain(value)
        return out

    def to_json(self) -> dict[str, JsonValue]:
        """The dict form as JSON-able data (what ``--json`` prints)."""
        return {key: plain_json(value) for key, value in self.as_dict().items()}

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.as_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def get(self, key: str, default: object = None) -> Any:
        """``as_dict().get(key, default)``."""
        return self.as_dict().get(key, default)


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointInfo(_Value):
    """A durable checkpoint: what ``checkpoint_info()``, ``stop()`` (and, as its path, ``savepoint()``) report.

    Attributes:
        id: the checkpoint's id.
        path: its directory (a savepoint's: the copy's).
        duration_s: how long taking it took, when this call took it.
        root: a savepoint's root directory.
    """

    id: int
    path: str
    duration_s: float | None = None
    root: str | None = None
    _OMIT_NONE = ("duration_s", "root")


class EventKind(str, enum.Enum):
    """What happened to a job, in its manager's record (``JobEvent.kind``)."""

    SUBMITTED = "submitted"
    START_FAILED = "start_failed"
    RECOVERY = "recovery"
    RESCALE_STARTED = "rescale_started"
    RESCALE_ENDED = "rescale_ended"
    AUTOSCALE = "autoscale"
    AUTOSCALE_SWITCHED = "autoscale_switched"
    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"
    SAVEPOINT_DELETED = "savepoint_deleted"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    ENDED = "ended"
    SOURCE_RECOVERY = "source_recovery"
    """A source's side (a Spark driver the job owns) failed: the job restarted from its last checkpoint."""
    UPGRADE = "upgrade"
    BRANCH = "branch"
    """A branch added to or removed from the running job (its dataflow in the record changed with it)."""
    RUN = "run"
    """An event of the job's current run (its controller's lifecycle: failures, recoveries)."""


def _names(operators: object) -> str:
    """Operator names, comma-separated (a branch event's)."""
    return ", ".join(map(str, operators)) if isinstance(operators, (tuple, list)) else str(operators or "")


def _text(kind: EventKind, f: Mapping[str, object]) -> str:
    """The words for an event of ``kind`` with fields ``f`` (enum fields already plain)."""
    error = f": {f['error']}" if f.get("error") else ""
    render: dict[EventKind, Callable[[], str]] = {
        EventKind.SUBMITTED: lambda: "submitted",
        EventKind.START_FAILED: lambda: f"failed to start: {f.get('error')}",
        EventKind.RECOVERY: lambda: (f"recovery: the job manager restarted (restart {f.get('restart')}); "
                                     f"the job rolled back to {f.get('where')}"),
        EventKind.RESCALE_STARTED: lambda: (f"rescale {f.get('operator')} {f.get('from')} -> {f.get('to')} "
                                            f"started ({f.get('strategy')})"),
        EventKind.RESCALE_ENDED: lambda: (f"rescale {f.get('operator')} {f.get('from')} -> {f.get('to')} "
                                          f"{f.get('outcome')}{error}"),
        EventKind.AUTOSCALE: lambda: str(f.get("text")),
        EventKind.AUTOSCALE_SWITCHED: lambda: ("autoscale off" if not f.get("enabled") else
                                               f"autoscale on {f.get('options')}"),
        EventKind.CHECKPOINT: lambda: f"checkpoint {f.get('id')} ({f.get('duration_s', 0.0):.2f} s)",
        EventKind.SAVEPOINT: lambda: f"savepoint {f.get('path')}",
        EventKind.SAVEPOINT_DELETED: lambda: f"savepoint {f.get('path')} deleted",
        EventKind.STOPPED: lambda: (f"stopped at checkpoint {f.get('id')}"
                                    + (f" (savepoint {f['savepoint']})" if f.get("savepoint") else "")),
        EventKind.CANCELLED: lambda: "cancelled",
        EventKind.ENDED: lambda: f"job {str(f.get('state', '')).lower()}{error}",
        EventKind.SOURCE_RECOVERY: lambda: f"recovery: {f.get('cause')}; the job rolled back to {f.get('where')}",
        EventKind.UPGRADE: lambda: (f"upgrade {f.get('operator')} {f.get('old')} -> {f.get('new')} "
                                    f"{f.get('outcome')}{error}"),
        EventKind.BRANCH: lambda: f"{f.get('verb')} {_names(f.get('operators'))} at {f.get('operator')}{error}",
        EventKind.RUN: lambda: (f"run {f['run']}: " if "run" in f else "") + str(f.get("text")),
    }
    return render[kind]()


@dataclasses.dataclass(frozen=True, slots=True)
class JobEvent:
    """One thing that happened to a job: its kind, when, and the fields that say what.

    Attributes:
        kind: what happened.
        at: ``time.time()`` when it happened; ``None`` for a run's events (their text carries no time).
        fields: (name, value) pairs; which names each kind has is in ``_text``.
    """

    kind: EventKind
    at: float | None
    fields: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, kind: EventKind, at: float | None = None, **fields: object) -> "JobEvent":
        """An event of ``kind`` at ``at`` (default: now) with ``fields``; a ``RUN`` event has no time."""
        when = None if kind is EventKind.RUN else (time.time() if at is None else at)
        return cls(kind, when, tuple(fields.items()))

    def field(self, name: str, default: object = None) -> Any:
        """The value of field ``name``."""
        return dict(self.fields).get(name, default)

    @property
    def text(self) -> str:
        """What happened, in words, without the time."""
        return _text(self.kind, {k: _plain(v) for k, v in self.fields})

    def __str__(self) -> str:
        if self.at is None:
            return self.text
        return f"{time.strftime('%H:%M:%S', time.localtime(self.at))} {self.text}"

    def to_json(self) -> dict[str, JsonValue]:
        """``{"kind", "at", "text", "fields"}`` as JSON-able data."""
        return {"kind": self.kind.value, "at": self.at, "text": self.text,
                "fields": plain_json(dict(self.fields))}


@dataclasses.dataclass(frozen=True, slots=True)
class RescaleProgress(_Value):
    """Where a rescale or migration is (``progress()``) or how it ended (``result()``).

    Attributes:
        operator / strategy: what is rescaled, how.
        state: a driver's run: ``RescaleState`` (``WAITING -> ... -> DONE | FAILED``); a job manager's finished
            one: its ``RescaleOutcome`` (``done``, ``failed``, ``interrupted``).
        parallelism: the target parallelism.
        steps_done / steps, bins_moved / bins, bytes_moved, bins_reloaded, bytes_replicated, predicted_bytes:
            the run's counters.
        elapsed_s: seconds since it started (its duration once done).
        first_step_ns: ``time.time_ns()`` when its first migration op was injected.
        step_log: one dict per step (a driver's run only).
        id / done: a manager's rescale: its id, whether it ended.
        from_ / to / duration_s / error: a manager's finished rescale: its history entry.
    """

    operator: str
    strategy: str
    state: RescaleState | RescaleOutcome
    parallelism: int | None = None
    steps_done: int = 0
    steps: int = 0
    bins_moved: int = 0
    bins: int = 0
    bytes_moved: int = 0
    bins_reloaded: int = 0
    bytes_replicated: int = 0
    predicted_bytes: int = 0
    elapsed_s: float = 0.0
    first_step_ns: int | None = None
    step_log: tuple[Mapping[str, object], ...] = ()
    id: str | None = None
    done: bool | None = None
    from_: int | None = None
    to: int | None = None
    duration_s: float | None = None
    error: str | None = None
    _OMIT_NONE = ("id", "done", "from_", "to", "duration_s", "error")

    def replace(self, **changes: Any) -> "RescaleProgress":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, slots=True)
class RescaleRecord(_Value):
    """One entry of a job's rescale history (``rescales()``).

    Attributes:
        id: the rescale's id.
        started_at: ``time.time()`` when it started.
        operator / from_ / to / strategy: what changed, how.
        state: its ``RescaleOutcome``.
        error, duration_s, bytes_moved, bins_moved: how it ended.
        by: ``"autoscale"`` for the autoscaler's, ``None`` for a verb's; reason, target_rate,
            true_rate_per_instance, predicted_*: the autoscaler's decision.
        progress: its final progress (kept in the record, left out of ``rescales()``).
    """

    id: str
    started_at: float
    operator: str
    from_: int | None
    to: int | None
    strategy: str
    state: RescaleOutcome
    error: str | None = None
    duration_s: float | None = None
    bytes_moved: int | None = None
    bins_moved: int | None = None
    by: str | None = None
    reason: str | None = None
    target_rate: float | None = None
    true_rate_per_instance: float | None = None
    predicted_duration_s: float | None = None
    predicted_max_latency_ms: float | None = None
    progress: RescaleProgress | None = None
    _OMIT_NONE = ("bins_moved", "by", "reason", "target_rate", "true_rate_per_instance", "predicted_duration_s",
                  "predicted_max_latency_ms", "progress")

    def replace(self, **changes: Any) -> "RescaleRecord":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def without_progress(self) -> "RescaleRecord":
        """The entry as ``rescales()`` reports it."""
        return dataclasses.replace(self, progress=None)


@dataclasses.dataclass(frozen=True, slots=True)
class UpgradeRecord(_Value):
    """One entry of a job's upgrade history (``upgrades()``, ``chiray upgrades``).

    Attributes:
        id: the upgrade's id.
        started_at: ``time.time()`` when it started.
        operator: the upgraded operator.
        old_code / new_code: the code's identity before and after, ``qualname@hash`` (``"submitted"``: the
            code the job was submitted with).
        outcome: its ``UpgradeOutcome``.
        duration_s: from the call to the end (checks, canary and cut).
        pause_ms: the longest time an instance of the operator held its inputs at the cut.
        canary: the canary's batches (0: none).
        canary_result: what the canary trial found (``"passed"``, or why it rolled back).
        cut: per upgraded instance (``"operator/index"``): ``records`` taken before the cut and, per upstream
            instance, ``inputs`` (the records of each input channel before it).
        error: why it was refused, rolled back or failed.
    """

    id: str
    started_at: float
    operator: str
    old_code: str
    new_code: str
    outcome: UpgradeOutcome
    duration_s: float | None = None
    pause_ms: float | None = None
    canary: int = 0
    canary_result: str | None = None
    cut: Mapping[str, object] | None = None
    error: str | None = None
    _OMIT_NONE = ("canary_result", "cut", "error")

    def replace(self, **changes: Any) -> "UpgradeRecord":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, slots=True)
class JobInfo(_Value):
    """A job's summary (``info()``, ``chiray list``).

    Attributes:
        name / state: the job and its state; ``restarting``: its manager is restarting (listed as
            ``RESTARTING``).
        submitted_at / ended_at / uptime_s: ``time.time()`` stamps and seconds.
        operators: (operator, parallelism) pairs, as the job runs now.
        restarts: how often its manager restarted.
        error: why it failed.
        checkpoint_dir / last_checkpoint: where its checkpoints go; the newest complete one.
        records_per_second: what its sources read per second (running jobs).
        sources: the status of each source's side (a Spark driver the job owns), running jobs only.
    """

    name: str
    state: JobState
    submitted_at: float | None = None
    ended_at: float | None = None
    uptime_s: float | None = None
    operators: tuple[tuple[str, int], ...] = ()
    restarts: int = 0
    error: str | None = None
    checkpoint_dir: str | None = None
    last_checkpoint: CheckpointInfo | None = None
    records_per_second: float | None = None
    restarting: bool = False
    sources: tuple[SourceSideStatus, ...] = ()

    def as_dict(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "restarting"}
        out["state"] = "RESTARTING" if self.restarting else self.state.value
        out["operators"] = dict(self.operators)
        last = self.last_checkpoint
        out["last_checkpoint"] = None if last is None else {"id": last.id, "path": last.path}
        return out
