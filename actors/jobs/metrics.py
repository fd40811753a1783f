"""metrics.py: a job's statistics exported through ``ray.util.metrics`` (Prometheus, the Ray dashboard).

The job manager calls :meth:`MetricsExporter.export` about once a second
with the ``JobStatistics`` the hosts keep anyway, so the data path pays
nothing. Counters grow by the difference to the previous snapshot (a new
host after a recovery starts from zero: its counters are added again, so a
replay counts as work done). Every metric is tagged ``job``, ``operator``
and ``instance`` (the instance's index; ``""`` for job-wide ones), except
``chiray_job_state``, tagged ``job`` and ``state``.

Names (Ray's exporter may add a ``ray_`` prefix and, for counters, a
``_total`` suffix): ``chiray_records_in``, ``chiray_records_out``,
``chiray_batches_in``, ``chiray_batches_out``,
``chiray_backpressured_seconds``, ``chiray_busy_seconds``,
``chiray_late_records``, ``chiray_expired_keys`` (counters); ``chiray_records_per_second``,
``chiray_queued_batches``, ``chiray_queued_bytes``, ``chiray_pending_out``, ``chiray_kept_apart_records``,
``chiray_input_wait_seconds``, ``chiray_source_backlog``,
``chiray_watermark_lag_seconds`` and ``chiray_event_time_latency_seconds``
(timestamp event time), ``chiray_watermark_lag`` (integer event time, in its
ticks), ``chiray_keyed_state_bytes``, ``chiray_keyed_state_keys`` (gauges);
job-wide ``chiray_checkpoints``, ``chiray_recoveries``,
``chiray_rescale_bytes_moved`` (counters), ``chiray_checkpoint_duration_seconds``,
``chiray_checkpoint_bytes``, ``chiray_checkpoint_age_seconds``,
``chiray_rescale_progress`` and ``chiray_job_state`` (gauges).

Event time is in ticks of the sources' time column: a ``timestamp`` column's
unit (``tick_seconds``), or whatever an integer column counts, which the
metrics cannot turn into seconds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping

import pyarrow as pa
from ray.util import metrics

from chiray.control.coordination import JobState
from chiray.operators.graph import LogicalGraph, OperatorKind
from chiray.operators.watermarks import WatermarkedSource

from ..runtime.statistics import InstanceStatistics

if TYPE_CHECKING:
    from .job import JobStatistics

__all__ = ["MetricsExporter", "COUNTERS", "GAUGES", "JOB_COUNTERS", "metric_name", "endpoint_names", "tick_seconds"]

TAGS = ("job", "operator", "instance")
STATE_TAGS = ("job", "state")

COUNTERS = {
    "records_in": "records an instance consumed",
    "records_out": "records an instance emitted",
    "batches_in": "batches an instance consumed",
    "batches_out": "batches an instance emitted",
    "backpressured_s": "seconds an instance held output waiting for credit",
    "busy_s": "seconds an instance spent processing",
    "late_records": "records an instance's operator dropped as too late for their event-time window",
    "expired_keys": "keys whose state an instance's operator dropped by its state TTL",
}
_COUNTER_NAMES = {"backpressured_s": "backpressured_seconds", "busy_s": "busy_seconds"}

GAUGES = {
    "records_per_second": "records an instance consumed per second, over the last export interval",
    "queued_batches": "batches buffered in an instance's input channels",
    "queued_bytes": "bytes buffered in an instance's input channels",
    "pending_out": "messages waiting for credit on an instance's outputs",
    "kept_apart_records": "records a sink instance took in after a pending checkpoint's barrier, for the next "
                          "epoch (kept in memory or written ahead), until the barrier has come on its other inputs",
    "input_wait_seconds": "estimated seconds a batch waits in an instance's input channels: its queued batches "
                          "over the batches it consumed per second in the last interval (while it consumes none: "
                          "the time since it last did)",
    "source_backlog": "records offered to a source instance that it has not read yet (where its readers can say)",
    "watermark_lag_seconds": "seconds an instance's watermark is behind the job's most advanced one (timestamp "
                             "event time)",
    "event_time_latency_seconds": "seconds an instance's watermark is behind the wall clock (timestamp event "
                                  "time; at a sink: how late its output is, allowed disorder included)",
    "watermark_lag": "ticks an instance's watermark is behind the job's most advanced one, for integer event time "
                     "(its ticks count what the time column counts; timestamp event time: watermark_lag_seconds)",
    "keyed_state_bytes": "bytes of an instance's keyed state",
    "keyed_state_keys": "keys in an instance's keyed state",
    "checkpoint_duration_seconds": "how long the last on-demand checkpoint took",
    "checkpoint_bytes": "size of the newest complete checkpoint",
    "checkpoint_age_seconds": "seconds since the newest complete checkpoint",
    "rescale_progress": "fraction of the running rescale's bins moved (1 when none runs)",
    "job_state": "1 for the state the job is in (tag state: RUNNING, RECOVERING, FINISHED, FAILED or CANCELLED), "
                 "0 for the others",
}
JOB_COUNTERS = {
    "checkpoints": "checkpoints the job manager saw complete",
    "recoveries": "times the job was rolled back to a checkpoint (host, controller or manager failure)",
    "rescale_bytes_moved": "state bytes moved by completed rescales",
}


def metric_name(field: str) -> str:
    """The exported name of a statistics field or metric (``busy_s`` -> ``chiray_busy_seconds``)."""
    return f"chiray_{_COUNTER_NAMES.get(field, field)}"


def endpoint_names() -> dict[str, str]:
    """Every metric by its name on Ray's Prometheus endpoint (``ray_`` prefix, ``_total`` for counters) -> its
    kind, ``counter`` or ``gauge``: what the dashboard may query."""
    names = {f"ray_{metric_name(f)}_total": "counter" for f in (*COUNTERS, *JOB_COUNTERS)}
    return {**names, **{f"ray_{metric_name(f)}": "gauge" for f in GAUGES}}


_TICKS_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def tick_seconds(graph: LogicalGraph) -> float | None:
    """The length of an event-time tick in seconds, where it has one.

    Each source that makes watermarks takes them from a time column; where every such column is a
    ``timestamp`` of one unit, a tick is that unit. ``None`` (ticks stay ticks) where a source takes them from
    an integer column or a function, where their units differ, or where no source makes watermarks.

    Args:
        graph: the dataflow's (logical or physical) graph.
    """
    units = set()
    for node in graph.nodes.values():
        source = node.source if node.kind is OperatorKind.SOURCE else None
        if not isinstance(source, WatermarkedSource):
            continue
        column, schema = source.strategy.column, source.schema()
        if column is None or schema is None or column not in schema.names:
            return None
        kind = schema.field(column).type
        if not pa.types.is_timestamp(kind):
            return None
        units.add(kind.unit)
    return 1 / _TICKS_PER_SECOND[units.pop()] if len(units) == 1 else None


class MetricsExporter:
    """Exports one job's statistics; create it in the process that exports (the job manager).

    Args:
        job: the job's name (the ``job`` tag).
        graph: the job's dataflow graph, which says which operators are sources and what an event-time tick is
            (``tick_seconds``); set later with :meth:`describe`.
    """

    def __init__(self, job: str, graph: LogicalGraph | None = None):
        self.job = job
        self._counters = {f: metrics.Counter(metric_name(f), d, tag_keys=TAGS) for f, d in COUNTERS.items()}
        self._counters.update({f: metrics.Counter(metric_name(f), d, tag_keys=TAGS) for f, d in JOB_COUNTERS.items()})
        self._gauges = {f: metrics.Gauge(metric_name(f), d, tag_keys=STATE_TAGS if f == "job_state" else TAGS)
                        for f, d in GAUGES.items()}
        self._last: dict[tuple[str, int, str], float] = {}
        self._last_at: float | None = None
        self._consumed_at: dict[tuple[str, int], float] = {}  # when an instance last consumed (or had nothing queued)
        self.tick_s: float | None = None
        self.sources: frozenset[str] = frozenset()
        if graph is not None:
            self.describe(graph)

    def describe(self, graph: LogicalGraph) -> None:
        """The job's dataflow graph: its sources, and the length of its event-time tick."""
        self.tick_s = tick_seconds(graph)
        self.sources = frozenset(n.name for n in graph.nodes.values() if n.kind is OperatorKind.SOURCE)

    def _tags(self, operator: str = "", index: int | None = None) -> dict[str, str]:
        return {"job": self.job, "operator": operator, "instance": "" if index is None else str(index)}

    def export(self, stats: JobStatistics) -> None:
        """One ``JobStatistics`` snapshot: counters by their growth, gauges set."""
        interval = None if self._last_at is None else max(stats.taken_at - self._last_at, 1e-6)
        self._last_at = stats.taken_at
        marks = [s.watermark for s in stats.instances if s.watermark is not None]
        top = max(marks) if marks else None
        for s in stats.instances:
            tags = self._tags(s.operator, s.index)
            growth = {f: self._grow(s, f) for f in COUNTERS}
            for field, delta in growth.items():
                if delta > 0:
                    self._counters[field].inc(delta, tags)
            if interval is not None:
                self._gauges["records_per_second"].set(growth["records_in"] / interval, tags)
                self._gauges["input_wait_seconds"].set(self._input_wait(s, growth["batches_in"], interval,
                                                                        stats.taken_at), tags)
            for field in ("queued_batches", "queued_bytes", "pending_out", "kept_apart_records"):
                self._gauges[field].set(float(getattr(s, field)), tags)
            if s.operator in self.sources:
                self._gauges["source_backlog"].set(float(s.backlog), tags)
            if top is not None and s.watermark is not None:
                self._event_time(s.watermark, top, stats.taken_at, tags)

    def _input_wait(self, s: InstanceStatistics, consumed: float, interval: float, now: float) -> float:
        """Little's law: queued batches over batches consumed per second; while it consumes none, the time since
        it last did (a lower bound on its oldest batch's wait)."""
        key = (s.operator, s.index)
        if consumed > 0 or not s.queued_batches:
            self._consumed_at[key] = now
            return s.queued_batches * interval / consumed if s.queued_batches else 0.0
        return now - self._consumed_at.setdefault(key, now - interval)

    def _event_time(self, watermark: int, top: int, now: float, tags: dict[str, str]) -> None:
        """An instance's watermark lag (in seconds where a tick has a length, else in ticks) and its event-time
        latency (where it has)."""
        if self.tick_s is None:
            self._gauges["watermark_lag"].set(float(top - watermark), tags)
            return
        self._gauges["watermark_lag_seconds"].set((top - watermark) * self.tick_s, tags)
        self._gauges["event_time_latency_seconds"].set(now - watermark * self.tick_s, tags)

    def job_state(self, state: JobState) -> None:
        """The job is in ``state``: its series is 1, the other states' 0."""
        for each in JobState:
            self._gauges["job_state"].set(1.0 if each == state else 0.0, {"job": self.job, "state": each.value})

    def _grow(self, s: InstanceStatistics, field: str) -> float:
        key = (s.operator, s.index, field)
        value = float(getattr(s, field))
        last = self._last.get(key, 0.0)
        self._last[key] = value
        return value if value < last else value - last  # a new host after a recovery starts at zero

    def state_sizes(self, instances: Mapping[tuple[str, int], Mapping[str, float]]) -> None:
        """Keyed state sizes from a ``Monitor`` result's per-instance metrics."""
        for (operator, index), values in instances.items():
            if values.get("keys") or values.get("state_bytes"):
                tags = self._tags(operator, index)
                self._gauges["keyed_state_bytes"].set(float(values.get("state_bytes", 0)), tags)
                self._gauges["keyed_state_keys"].set(float(values.get("keys", 0)), tags)

    def checkpoint(self, duration_s: float | None, size_bytes: int, created: float) -> None:
        tags = self._tags()
        self._counters["checkpoints"].inc(1, tags)
        if duration_s is not None:
            self._gauges["checkpoint_duration_seconds"].set(duration_s, tags)
        self._gauges["checkpoint_bytes"].set(float(size_bytes), tags)
        self._gauges["checkpoint_age_seconds"].set(max(time.time() - created, 0.0), tags)

    def checkpoint_age(self, created: float) -> None:
        self._gauges["checkpoint_age_seconds"].set(max(time.time() - created, 0.0), self._tags())

    def recovery(self) -> None:
        self._counters["recoveries"].inc(1, self._tags())

    def rescale(self, operator: str, fraction: float, bytes_moved: int | None = None) -> None:
        self._gauges["rescale_progress"].set(fraction, self._tags(operator))
        if bytes_moved:
            self._counters["rescale_bytes_moved"].inc(float(bytes_moved), self._tags(operator))
