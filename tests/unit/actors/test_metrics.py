"""The exported metrics without Ray: the Grafana dashboard queries only metrics that ``metrics.py`` defines, event
time becomes seconds for timestamp columns (and stays ticks for integer ones), and the derived gauges (input wait,
source backlog, job state) against a plain computation of the same snapshots."""

from __future__ import annotations

import datetime
import importlib.resources
import json
import re

import pyarrow as pa
import pytest

import chiray
from chiray.actors.jobs import metrics
from chiray.actors.jobs.job import JobStatistics
from chiray.actors.runtime.statistics import InstanceStatistics
from chiray.control.coordination import JobState


def test_metric_names():
    assert metrics.metric_name("busy_s") == "chiray_busy_seconds"
    assert metrics.metric_name("records_in") == "chiray_records_in"
    assert all(metrics.metric_name(f).startswith("chiray_") for f in metrics.COUNTERS)


def test_every_dashboard_panel_queries_metrics_that_metrics_py_defines():
    text = importlib.resources.files("chiray").joinpath("grafana/chiray_dashboard.json").read_text()
    panels = json.loads(text)["panels"]
    defined = metrics.endpoint_names()
    queried = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\bray_chiray_\w+", target["expr"]))
            assert names and names <= set(defined), (panel["title"], target["expr"], names - set(defined))
            for name in names:  # a counter is read by its rate or increase, a gauge as it is
                counted = re.search(rf"(rate|increase)\(\s*{name}\b", target["expr"]) is not None
                assert counted == (defined[name] == "counter"), (panel["title"], name)
            queried |= names
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    wanted = {"ray_chiray_event_time_latency_seconds", "ray_chiray_input_wait_seconds", "ray_chiray_source_backlog",
              "ray_chiray_late_records_total", "ray_chiray_job_state", "ray_chiray_watermark_lag_seconds",
              "ray_chiray_watermark_lag"}
    assert wanted <= queried, wanted - queried


def _flow(*columns: tuple[str, pa.DataType | None]) -> chiray.Dataflow:
    """One source per (time column, its type); ``None``: a source without watermarks."""
    flow = chiray.Dataflow("ticks")
    streams = []
    for i, (column, kind) in enumerate(columns):
        if kind is None:
            streams.append(flow.source(chiray.from_items([{"k": 1}]), name=f"s{i}"))
            continue
        schema = pa.schema([(column, kind)])
        zero = datetime.datetime(2026, 1, 1) if pa.types.is_timestamp(kind) else 0
        delay = datetime.timedelta(seconds=1) if pa.types.is_timestamp(kind) else 1
        src = chiray.from_items([{column: zero}], schema=schema)
        streams.append(flow.source(src, name=f"s{i}", watermarks=chiray.bounded_out_of_orderness(column, delay)))
    for s in streams:
        s.sink(chiray.collect(), name=f"out-{s.name}")
    return flow


@pytest.mark.parametrize("columns, seconds", [
    ([("ts", pa.timestamp("ms"))], 1e-3),
    ([("ts", pa.timestamp("us", tz="UTC")), ("ts", pa.timestamp("us")), ("k", None)], 1e-6),
    ([("ts", pa.timestamp("s"))], 1.0),
    ([("ts", pa.timestamp("ns"))], 1e-9),
    ([("ts", pa.timestamp("ms")), ("ts", pa.timestamp("us"))], None),  # units differ: ticks
    ([("t", pa.int64())], None),  # integer event time: ticks
    ([("k", None)], None),  # no watermarks
])
def test_an_event_time_tick_lasts_its_timestamp_columns_unit(columns, seconds):
    assert metrics.tick_seconds(_flow(*columns).graph) == seconds


def test_watermarks_from_a_function_stay_in_ticks():
    flow = chiray.Dataflow("fn")
    flow.source(chiray.from_items([{"t": 1}]), name="s", watermarks=chiray.watermarks_from(lambda b: 0)).sink(
        chiray.collect())
    assert metrics.tick_seconds(flow.graph) is None


class _Metric:
    """A stand-in for ``ray.util.metrics`` Gauge and Counter: the last value set (or the sum added) per tag set."""

    def __init__(self, name, description="", tag_keys=()):
        self.name, self.tag_keys, self.values = name, tag_keys, {}

    def _key(self, tags):
        assert set(tags) == set(self.tag_keys), (self.name, tags)
        return tuple(tags[k] for k in self.tag_keys)

    def set(self, value, tags):
        self.values[self._key(tags)] = value

    def inc(self, value, tags):
        self.values[self._key(tags)] = self.values.get(self._key(tags), 0) + value


def _stat(operator, index, watermark=None, batches_in=0, queued=0, backlog=0, late=0, kept=0):
    return InstanceStatistics(operator, index, 0, 10 * batches_in, 0, batches_in, 0, queued, 100 * queued, 0,
                              0.0, 0.0, False, watermark=watermark, late_records=late, backlog=backlog,
                              kept_apart_records=kept)


@pytest.fixture
def exporter(monkeypatch):
    monkeypatch.setattr(metrics.metrics, "Gauge", _Metric)
    monkeypatch.setattr(metrics.metrics, "Counter", _Metric)
    return lambda graph: metrics.MetricsExporter("wc", graph)


def _gauge(exporter, field):
    return {(op, int(i)): v for (_, op, i), v in exporter._gauges[field].values.items()}


def test_watermark_lag_and_event_time_latency_in_seconds_for_a_timestamp_column(exporter):
    ex = exporter(_flow(("ts", pa.timestamp("ms"))).graph)
    epoch_ms = 1_790_000_000_000
    marks = {("s0", 0): epoch_ms + 5_000, ("w", 0): epoch_ms + 1_500, ("w", 1): epoch_ms}
    taken = epoch_ms / 1000 + 9.25
    ex.export(JobStatistics(tuple(_stat(op, i, w) for (op, i), w in marks.items()), taken))
    top = max(marks.values())
    assert _gauge(ex, "watermark_lag_seconds") == pytest.approx({k: (top - w) / 1000 for k, w in marks.items()})
    assert _gauge(ex, "event_time_latency_seconds") == pytest.approx({k: taken - w / 1000 for k, w in marks.items()})
    assert _gauge(ex, "watermark_lag") == {}


def test_watermark_lag_stays_in_ticks_for_an_integer_column(exporter):
    ex = exporter(_flow(("t", pa.int64())).graph)
    ex.export(JobStatistics((_stat("s0", 0, 70), _stat("w", 0, 40), _stat("w", 1)), 100.0))
    assert _gauge(ex, "watermark_lag") == {("s0", 0): 0.0, ("w", 0): 30.0}
    assert _gauge(ex, "watermark_lag_seconds") == {} and _gauge(ex, "event_time_latency_seconds") == {}


def test_input_wait_source_backlog_late_records_and_job_state(exporter):
    ex = exporter(_flow(("k", None)).graph)  # source s0
    ex.export(JobStatistics((_stat("s0", 0, backlog=900), _stat("w", 0, batches_in=10, queued=3)), 100.0))
    assert _gauge(ex, "input_wait_seconds") == {}  # no rate before a second snapshot
    ex.export(JobStatistics((_stat("s0", 0, backlog=400), _stat("w", 0, batches_in=30, queued=5, late=7),
                             _stat("w", 1, batches_in=0, queued=2)), 102.0))
    # Little's law: queued / (consumed per second); w1 consumed nothing since it appeared: the time since then
    assert _gauge(ex, "input_wait_seconds") == pytest.approx({("s0", 0): 0.0, ("w", 0): 5 / (20 / 2.0),
                                                              ("w", 1): 2.0})
    ex.export(JobStatistics((_stat("s0", 0), _stat("w", 0, batches_in=30, queued=5, late=9),
                             _stat("w", 1, batches_in=0, queued=2)), 105.0))
    waits = _gauge(ex, "input_wait_seconds")  # stalled: the time since each last consumed (or appeared)
    assert (waits[("w", 0)], waits[("w", 1)]) == pytest.approx((105.0 - 102.0, 105.0 - 100.0))
    assert _gauge(ex, "source_backlog") == {("s0", 0): 0.0}  # sources only
    ex.export(JobStatistics((_stat("s0", 0), _stat("w", 0, kept=250)), 106.0))
    assert _gauge(ex, "kept_apart_records") == {("s0", 0): 0.0, ("w", 0): 250.0, ("w", 1): 0.0}
    assert _gauge(ex, "records_per_second")[("w", 0)] == pytest.approx(0.0)
    assert ex._counters["late_records"].values == {("wc", "w", "0"): 9}
    ex.job_state(JobState.RECOVERING)
    ex.job_state(JobState.FAILED)
    assert ex._gauges["job_state"].values == {("wc", s.value): float(s is JobState.FAILED) for s in JobState}
