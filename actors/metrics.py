"""metrics.py: a job's statistics exported through ``ray.util.metrics`` (Prometheus, the Ray dashboard).

The job manager calls :meth:`MetricsExporter.export` about once a second
with the ``JobStatistics`` the hosts keep anyway, so the data path pays
nothing. Counters grow by the difference to the previous snapshot (a new
host after a recovery starts from zero: its counters are added again, so a
replay counts as work done). Every metric is tagged ``job``, ``operator``
and ``instance`` (the instance's index; ``""`` for job-wide ones).

Names (Ray's exporter may add a ``ray_`` prefix and, for counters, a
``_total`` suffix): ``chiray_records_in``, ``chiray_records_out``,
``chiray_batches_in``, ``chiray_batches_out``,
``chiray_backpressured_seconds``, ``chiray_busy_seconds`` (counters);
``chiray_records_per_second``, ``chiray_queued_batches``,
``chiray_queued_bytes``, ``chiray_pending_out``,
``chiray_watermark_lag`` (behind the job's most advanced watermark, in
event-time ticks), ``chiray_keyed_state_bytes``, ``chiray_keyed_state_keys``
(gauges); job-wide ``chiray_checkpoints``, ``chiray_recoveries``,
``chiray_rescale_bytes_moved`` (counters), ``chiray_checkpoint_duration_seconds``,
``chiray_checkpoint_bytes``, ``chiray_checkpoint_age_seconds`` and
``chiray_rescale_progress`` (gauges).
"""

from __future__ import annotations

import time
from typing import Any

from ray.util import metrics

__all__ = ["MetricsExporter", "COUNTERS", "GAUGES"]

TAGS = ("job", "operator", "instance")

COUNTERS = {
    "records_in": "records an instance consumed",
    "records_out": "records an instance emitted",
    "batches_in": "batches an instance consumed",
    "batches_out": "batches an instance emitted",
    "backpressured_s": "seconds an instance held output waiting for credit",
    "busy_s": "seconds an instance spent processing",
}
_COUNTER_NAMES = {"backpressured_s": "backpressured_seconds", "busy_s": "busy_seconds"}

GAUGES = {
    "records_per_second": "records an instance consumed per second, over the last export interval",
    "queued_batches": "batches buffered in an instance's input channels",
    "queued_bytes": "bytes buffered in an instance's input channels",
    "pending_out": "messages waiting for credit on an instance's outputs",
    "watermark_lag": "event-time ticks an instance's watermark is behind the job's most advanced one",
    "keyed_state_bytes": "bytes of an instance's keyed state",
    "keyed_state_keys": "keys in an instance's keyed state",
    "checkpoint_duration_seconds": "how long the last on-demand checkpoint took",
    "checkpoint_bytes": "size of the newest complete checkpoint",
    "checkpoint_age_seconds": "seconds since the newest complete checkpoint",
    "rescale_progress": "fraction of the running rescale's bins moved (1 when none runs)",
}
JOB_COUNTERS = {
    "checkpoints": "checkpoints the job manager saw complete",
    "recoveries": "times the job was rolled back to a checkpoint (host, controller or manager failure)",
    "rescale_bytes_moved": "state bytes moved by completed rescales",
}


def metric_name(field: str) -> str:
    """The exported name of a statistics field or metric (``busy_s`` -> ``chiray_busy_seconds``)."""
    return f"chiray_{_COUNTER_NAMES.get(field, field)}"


class MetricsExporter:
    """Exports one job's statistics; create it in the process that exports (the job manager)."""

    def __init__(self, job: str):
        self.job = job
        self._counters = {f: metrics.Counter(metric_name(f), d, tag_keys=TAGS) for f, d in COUNTERS.items()}
        self._counters.update({f: metrics.Counter(metric_name(f), d, tag_keys=TAGS) for f, d in JOB_COUNTERS.items()})
        self._gauges = {f: metrics.Gauge(metric_name(f), d, tag_keys=TAGS) for f, d in GAUGES.items()}
        self._last: dict[tuple[str, int, str], float] = {}
        self._last_at: float | None = None

    def _tags(self, operator: str = "", index: int | None = None) -> dict[str, str]:
        return {"job": self.job, "operator": operator, "instance": "" if index is None else str(index)}

    def export(self, stats: Any) -> None:
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
            for field in ("queued_batches", "queued_bytes", "pending_out"):
                self._gauges[field].set(float(getattr(s, field)), tags)
            if top is not None and s.watermark is not None:
                self._gauges["watermark_lag"].set(float(top - s.watermark), tags)

    def _grow(self, s: Any, field: str) -> float:
        key = (s.operator, s.index, field)
        value = float(getattr(s, field))
        last = self._last.get(key, 0.0)
        self._last[key] = value
        return value if value < last else value - last  # a new host after a recovery starts at zero

    def state_sizes(self, instances: dict[Any, dict[str, Any]]) -> None:
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
