"""migration.py: Megaphone's NEXMark experiment: a live rescale of each stateful query's heaviest
operator, 2 -> 3 -> 2, strategy by strategy, with latency over time.

Per query (q3, q4, q5, q7, q8) and strategy: the query runs paced at ``load`` (0.6) of its
measured capacity, with the generator's event rate equal to the pace, so event time runs with
wall time. A sampler reads the sink's watermark every ``SAMPLE_S``: the latency at wall time
``t`` is ``t`` minus the wall time at which the source emitted the event time that watermark
stands for (a source split is a contiguous range of event numbers paced at ``rate / splits``, so
the first split's event time, which holds the watermark, runs at ``1 / splits`` of wall time). In steady state that is the watermark delay (4 s) plus processing; a migration
that stalls the pipeline shows as a rise. Per strategy: the steady median (before the first
rescale), the max and p99 from the first rescale to one second after the last, and whether the
output still equals DuckDB's. A PNG draws latency over time, a row per strategy and a column
per query, the rescales shaded.

Bins are planned by SSM (fewest moved), q7's round robin (it keys by window: too few keys
for SSM's load bound); steps move 64 bins. Fluid
migration (one bin per step) is left out here: the queries have 1,024 bins, and 1,024
steps under this load took longer than a run (over 120 s for q3's join).
Run it alone: on a loaded machine the figures mean little.
"""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any

import numpy as np

from .generator import NexmarkConfig
from .oracle import run_sql, same_rows
from .queries import Events, all_queries
from .source import write_parquet
from .stateful import HEAVIEST

SAMPLE_S = 0.02
PLANNER = {"q7": "round_robin"}  # q7 keys by window: too few keys for SSM's load bound
STRATEGIES: list[tuple[str, str, dict[str, Any]]] = [
    ("all_at_once", "all_at_once", {}),
    ("batched_64", "batched", {"chunk_bins": 64}),
    ("non_disruptive_64", "non_disruptive", {"chunk_bins": 64}),
]


class SinkLag(threading.Thread):
    """Samples the sink's watermark: (wall time since start, latency ms) pairs."""

    def __init__(self, job: Any, start_wall: float, base_ms: int, splits: int) -> None:
        super().__init__(daemon=True)
        self.job, self.start_wall, self.base_ms, self.splits = job, start_wall, base_ms, splits
        self.samples: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                marks = [s.watermark for s in self.job.statistics().of("out") if s.watermark is not None]
            except Exception:  # noqa: BLE001 - the job ended between two samples
                break
            now = time.perf_counter()
            if marks:
                # A split is a contiguous range of event numbers paced at rate / splits: the first
                # split's event time, which holds the watermark, runs at 1 / splits of wall time.
                emitted_at = self.start_wall + self.splits * (min(marks) - self.base_ms) / 1000.0
                self.samples.append((now - self.start_wall, (now - emitted_at) * 1000.0))
            time.sleep(SAMPLE_S)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def run_one(query: str, strategy: str, knobs: dict[str, Any], rate: int, seconds: float,
            paths: dict[str, str], config: NexmarkConfig) -> dict[str, Any]:
    events = Events(int(rate * seconds), config, batch_events=max(1_000, rate // 10), rate=rate)
    job = all_queries()[query](events, 2).submit(spare_hosts=1)
    start_wall = time.perf_counter()  # the sources start pacing about now
    lag = SinkLag(job, start_wall, config.base_time_ms, splits=2)  # the sources' parallelism
    lag.start()
    legs = []
    error = None
    try:
        time.sleep(seconds * 0.3)
        for parallelism in (3, 2):
            begin = time.perf_counter() - start_wall
            try:
                job.rescale(HEAVIEST[query], parallelism, strategy, planner=PLANNER.get(query, "ssm"),
                            **knobs).result(120)
            except (TimeoutError, RuntimeError) as exc:  # reported, and the next run goes on
                error = str(exc)
                break
            legs.append((begin, time.perf_counter() - start_wall))
            time.sleep(seconds * 0.15)
        if error is None:
            job.wait(timeout=300)
    finally:
        lag.stop()
        job.cancel()
    if error is not None or not legs:
        return {"query": query, "strategy": strategy, "knobs": knobs, "rate": rate, "error": error,
                "exact": None, "_samples": np.array(lag.samples) if lag.samples else np.zeros((0, 2)),
                "_legs": legs, "steady_latency_ms": None, "max_latency_ms": None, "p99_latency_ms": None,
                "rescale_s": []}
    samples = np.array(lag.samples) if lag.samples else np.zeros((0, 2))
    before = samples[samples[:, 0] < legs[0][0], 1] if len(samples) else np.zeros(0)
    during = samples[(samples[:, 0] >= legs[0][0]) & (samples[:, 0] <= legs[-1][1] + 1.0), 1]
    exact = same_rows(job.result("out").to_pandas(), run_sql(query, paths)) is None
    return {
        "query": query, "strategy": strategy, "knobs": knobs, "events": events.num_events, "rate": rate,
        "steady_latency_ms": round(float(np.median(before)), 1) if len(before) else None,
        "max_latency_ms": round(float(during.max()), 1) if len(during) else None,
        "p99_latency_ms": round(float(np.percentile(during, 99)), 1) if len(during) else None,
        "rescale_s": [round(e - b, 3) for b, e in legs], "exact": exact,
        "_samples": samples, "_legs": legs,
    }


def experiment(capacities: dict[str, float], load: float = 0.6, seconds: float = 10.0,
               say: Any = print) -> list[dict[str, Any]]:
    """Every stateful query measured (``capacities``: their events/s) with every strategy."""
    results = []
    for query in sorted(q for q in HEAVIEST if q in capacities):  # the stateful ones of those run
        rate = int(capacities.get(query, 50_000) * load)
        config = NexmarkConfig(event_rate=rate)
        with tempfile.TemporaryDirectory() as directory:
            paths = write_parquet(directory, int(rate * seconds), config)
            for label, strategy, knobs in STRATEGIES:
                result = run_one(query, strategy, knobs, rate, seconds, paths, config)
                result["label"] = label
                say(f"  {query} {label}: steady {result['steady_latency_ms']} ms, max {result['max_latency_ms']} ms,"
                    f" p99 {result['p99_latency_ms']} ms, rescales {result['rescale_s']} s, exact={result['exact']}")
                results.append(result)
    return results


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    queries = sorted({r["query"] for r in results})
    labels = [label for label, _, _ in STRATEGIES]
    fig, axes = plt.subplots(len(labels), len(queries), figsize=(3.2 * len(queries), 1.8 * len(labels)),
                             squeeze=False, sharex="col")
    for r in results:
        ax = axes[labels.index(r["label"])][queries.index(r["query"])]
        samples = r["_samples"]
        if len(samples):
            ax.plot(samples[:, 0], samples[:, 1], "-", linewidth=0.8)
        for begin, end in r["_legs"]:
            ax.axvspan(begin, end, color="orange", alpha=0.3)
        ax.set_title(f"{r['query']} {r['label']}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("s", fontsize=8)
    for row in axes:
        row[0].set_ylabel("latency ms", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def public(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results without their curves (for the JSON line)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
