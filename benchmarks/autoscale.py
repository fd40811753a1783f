"""autoscale.py: the DS2 autoscaler on a keyed count whose offered rate steps up 3x and back.

Pipeline: ``generate`` (paced by a rate schedule, ``ts`` stamped at the
source) -> ``key_by("key")`` -> a keyed count that pays a fixed service cost
per record (``--cost-us``, 100 us: one instance takes 10,000 records/s, as a
count that calls a remote service per record would; the cost is a wait, not
CPU, so several instances add capacity even on a 2-core machine, and the
oracle's parallelism is known) -> a sink that keeps each batch's latency
(now - ts) and the last count per key.

The rate: ``--low`` of one instance's capacity (30 %) for the first phase,
three times that (90 %: two instances at the 80 % target utilisation) for
the second, and the low rate again for the third. The autoscaler (decisions
every ``--interval`` seconds, latency budget ``--budget-ms``) starts at
parallelism 1.

Figures: ``decisions_up`` / ``decisions_down`` (rescales after each step),
``time_to_converge_up_s`` / ``_down_s`` (from the rate change to the end of
the last rescale of that phase), ``final_parallelism_up`` against
``oracle_parallelism_up``, the max and p99 record latency in each transition
(from the rate change until 2 s after convergence) and outside them, against
the budget, ``overprovision_ratio`` (instance-seconds used over those the
oracle needs), ``exact`` (the counts against a plain count of the same
generated records), and a PNG of offered and processed rate, parallelism and
latency over time (``--png``).

Targets: at most 2 decisions per step, convergence within 30 s of each rate
change, latency within the budget outside the decisions, ``exact``.

Run: ``python -m benchmarks.autoscale [--quick]`` (quick: 10 + 20 + 20 s phases, under a minute).
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import emit, start_ray
from benchmarks.measure import loadavg
from chiray.control.ds2 import Action
from chiray.operators.logic import InstanceInfo, Sink, SinkWriter

UTILISATION = 0.8
#: The count's output: per key and call, its count so far, the records it took (n) and their newest ts.
SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64()), ("n", pa.int64()), ("ts", pa.timestamp("ns"))])


class _Writer(SinkWriter):
    def __init__(self) -> None:
        self.samples: list[tuple[int, int, int]] = []  # (arrival ns, latency ns, records counted)
        self.counts: dict[str, int] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        now = time.time_ns()
        ts = int(pc.max(batch.column("ts")).cast(pa.int64()).as_py())
        self.samples.append((now, now - ts, int(pc.sum(batch.column("n")).as_py())))
        for key, count in zip(batch.column("key").to_pylist(), batch.column("count").to_pylist()):
            self.counts[key] = max(count, self.counts.get(key, 0))

    def finish(self) -> Any:
        return self.samples, self.counts


class LatencyCountSink(Sink):
    """Per batch its arrival time and latency; per key its last count."""

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return _Writer()

    def combine(self, results: Any) -> Any:
        samples: list[tuple[int, int, int]] = []
        counts: dict[str, int] = {}
        for part_samples, part_counts in results:
            samples.extend(part_samples)
            for key, count in part_counts.items():
                counts[key] = max(count, counts.get(key, 0))
        return np.array(samples, dtype=np.int64).reshape(-1, 3), counts


def make_count(cost_s: float) -> Any:
    def count(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
        time.sleep(cost_s * rows.num_rows)  # the per-record service cost
        state.value = (state.value or 0) + rows.num_rows
        ts = pc.max(rows.column("ts"))
        return pa.RecordBatch.from_pydict({"key": [key], "count": [state.value], "n": [rows.num_rows],
                                           "ts": [ts.as_py()]}, schema=SCHEMA)
    return count


class Sampler(threading.Thread):
    """Every ``interval`` s: the count's parallelism (instances reporting)."""

    def __init__(self, job: Any, interval: float = 0.5):
        super().__init__(daemon=True)
        self.job, self.interval = job, interval
        self.rows: list[tuple[float, int]] = []  # (time, instances)
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.rows.append((time.time(), len(self.job.statistics().of("count"))))
            except Exception:  # a rescale swapped hosts under us: the next sample will do
                continue

    def stop(self) -> None:
        self._stop.set()


def oracle_counts(source: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:  # pacing is advisory: read at once
            for key, n in zip(*np.unique(batch.column("key").to_numpy(zero_copy_only=False), return_counts=True)):
                counts[key] = counts.get(key, 0) + int(n)
    return counts


def window_latency(samples: np.ndarray, start: float, end: float) -> tuple[float, float]:
    sel = (samples[:, 0] >= start * 1e9) & (samples[:, 0] < end * 1e9)
    if not sel.any():
        return 0.0, 0.0
    lat = samples[sel, 1] / 1e6
    order = np.argsort(lat)
    weights = np.cumsum(samples[sel, 2][order])
    p99 = float(lat[order][np.searchsorted(weights, 0.99 * weights[-1])])
    return round(float(lat.max()), 1), round(p99, 1)


def converge(events: list[Any], action: Action, change_at: float) -> tuple[int, float | None, int | None]:
    mine = [e for e in events if e.decision.action is action and e.at >= change_at]
    if not mine:
        return 0, None, None
    last = mine[-1]
    return len(mine), round(last.at - change_at, 2), last.decision.target


def plot(path: str, t0: float, schedule: list[tuple[float, float]], sampler: Sampler, samples: np.ndarray,
         budget_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    end = max([r[0] - t0 for r in sampler.rows] + [schedule[-1][0]])
    axes[0].step([t for t, _ in schedule] + [end], [r for _, r in schedule] + [schedule[-1][1]], where="post",
                 label="offered")
    if len(samples):  # processed: records the count took, as their updates reached the sink, per half second
        edges = np.arange(0.0, end + 0.5, 0.5)
        seen, _ = np.histogram(samples[:, 0] / 1e9 - t0, bins=edges, weights=samples[:, 2])
        axes[0].plot(edges[1:], seen / 0.5, label="processed")
    if sampler.rows:
        axes[1].step([r[0] - t0 for r in sampler.rows], [r[1] for r in sampler.rows], where="post")
    axes[0].set_ylabel("records/s")
    axes[0].legend()
    axes[1].set_ylabel("instances")
    if len(samples):
        axes[2].plot(samples[:, 0] / 1e9 - t0, samples[:, 1] / 1e6, ".", markersize=2)
    axes[2].axhline(budget_ms, color="red", linestyle="--", label="budget")
    axes[2].set_ylabel("latency (ms)")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cost-us", type=float, default=100.0, help="service cost per record, microseconds")
    parser.add_argument("--low", type=float, default=0.3, help="the low rate, as a fraction of one instance")
    parser.add_argument("--phases", default=None, help="seconds of low,high,low (default 20,40,40; quick 10,20,20)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between decisions")
    parser.add_argument("--budget-ms", type=float, default=1000.0)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--png", default="autoscale.png")
    args = parser.parse_args(argv)
    phases = [float(x) for x in (args.phases or ("10,20,20" if args.quick else "20,40,40")).split(",")]
    capacity = 1e6 / args.cost_us
    low, high = args.low * capacity, 3 * args.low * capacity
    schedule = [(0.0, low), (phases[0], high), (phases[0] + phases[1], low)]
    records = int(low * phases[0] + high * phases[1] + low * phases[2])
    oracle_up = math.ceil(high / capacity / UTILISATION)
    oracle_low = math.ceil(low / capacity / UTILISATION)
    print(f"autoscale: capacity {capacity:,.0f} rec/s an instance; offered {low:,.0f} -> {high:,.0f} -> "
          f"{low:,.0f} rec/s over {phases} s; oracle parallelism {oracle_low} -> {oracle_up} -> {oracle_low}")
    start_ray(num_cpus=8)
    from chiray import Dataflow, generate

    load_start = loadavg()
    source = generate(records, rate=schedule, batch_size=args.batch_size, num_keys=args.keys, seed=11)
    flow = Dataflow("autoscale")
    (flow.source(source, name="events").key_by("key")
         .process(make_count(args.cost_us / 1e6), name="count", schema=SCHEMA)
         .sink(LatencyCountSink(), name="out"))
    started = time.time()
    job = flow.submit()
    sampler = Sampler(job)
    sampler.start()
    scaler = job.autoscale(operators=["count"], latency_budget_ms=args.budget_ms, interval_s=args.interval,
                           target_utilisation=UTILISATION, max_parallelism=8, cooldown_s=2 * args.interval,
                           scale_down_stable_s=5 * args.interval, catch_up_s=20.0)
    while True:
        try:
            job.wait(timeout=5)
            break
        except TimeoutError:
            instances = sampler.rows[-1][1] if sampler.rows else 1
            print(f"  t={time.time() - started:5.1f} s  {instances} instance(s) of the count", flush=True)
    scaler.stop()
    sampler.stop()
    samples, counts = job.result("out")
    up_at, down_at = started + phases[0], started + phases[0] + phases[1]
    events = list(scaler.events)
    for e in events:
        print("  " + e.describe())
    ups, up_s, final_up = converge([e for e in events if e.at < down_at], Action.UP, up_at)
    downs, down_s, final_down = converge(events, Action.DOWN, down_at)
    used = needed = 0.0
    rows = sampler.rows
    for (t_a, p), (t_b, _) in zip(rows, rows[1:]):
        rate = low if t_a - started < phases[0] or t_a - started >= phases[0] + phases[1] else high
        used += p * (t_b - t_a)
        needed += math.ceil(rate / capacity / UTILISATION) * (t_b - t_a)
    up_end = up_at + (up_s or 0) + 2
    down_end = down_at + (down_s or 0) + 2
    max_up, p99_up = window_latency(samples, up_at, up_end)
    max_down, p99_down = window_latency(samples, down_at, down_end)
    steady = np.concatenate([samples[(samples[:, 0] < up_at * 1e9)],
                             samples[(samples[:, 0] >= up_end * 1e9) & (samples[:, 0] < down_at * 1e9)],
                             samples[(samples[:, 0] >= down_end * 1e9)]]) if len(samples) else samples
    max_steady, p99_steady = window_latency(steady, 0, math.inf) if len(steady) else (0.0, 0.0)
    exact = counts == oracle_counts(source)
    if args.png:
        plot(args.png, started, [(t, r) for t, r in schedule], sampler, samples, args.budget_ms)
        print(f"  wrote {args.png}")
    emit({
        "benchmark": "autoscale", "quick": args.quick, "capacity_per_instance": capacity,
        "offered_low": low, "offered_high": high, "phases_s": phases, "budget_ms": args.budget_ms,
        "decisions_up": ups, "decisions_down": downs,
        "time_to_converge_up_s": up_s, "time_to_converge_down_s": down_s,
        "final_parallelism_up": final_up, "oracle_parallelism_up": oracle_up,
        "final_parallelism_down": final_down, "oracle_parallelism_down": oracle_low,
        "max_latency_ms_up": max_up, "p99_latency_ms_up": p99_up,
        "max_latency_ms_down": max_down, "p99_latency_ms_down": p99_down,
        "max_latency_ms_steady": max_steady, "p99_latency_ms_steady": p99_steady,
        "overprovision_ratio": round(used / needed, 3) if needed else None,
        "exact": exact, "records": records,
        "target_decisions_met": ups <= 2 and downs <= 2,
        "target_converge_met": (up_s is not None and up_s <= 30) and (down_s is not None and down_s <= 30),
        "target_latency_met": max_steady <= args.budget_ms,
        "loadavg_1m_at_start": load_start, "loadavg_1m_at_end": loadavg(),
        "wall_s": round(time.time() - started, 1), "png": args.png or None,
    })


if __name__ == "__main__":
    main()
