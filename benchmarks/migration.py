"""migration.py: what a live rescale costs a keyed count, strategy by strategy (Megaphone's Figure 1).

Pipeline (``benchmarks.measure.build``): ``generate`` (2 instances, string
keys, open loop at ``--load`` of the measured capacity, see below) -> ``key_by("key")``
(1024 bins) -> ``agg(count, max(ts), emit="updates")`` (2 instances, the
state holding ``--keys`` keys) -> a latency sink that keeps, per batch, its
arrival time and ``now - ts`` (``ts``: when the source stamped the record).

The state is filled first (an unthrottled run, checkpointed; the measured job
restores it). That run also measures the capacity of both layouts a leg passes
through: 2 count instances, and 3 after rescaling it (on this 2-core machine the
third host process costs more than it adds: the same records take about 40 % more
CPU, in more calls between hosts). The offered rate is ``--load`` of the lower
of the two, so that no layout is saturated and a strategy's latency is the
migration's, not the queue of a layout that cannot carry the load (at 60 % of
the two-instance capacity the three-instance layout alone, with no migration
under way, held p99 180-230 ms). Then, in one job, for each strategy: rescale the count 2 -> 3,
settle, rescale 3 -> 2, settle. Every strategy starts from the job's first bin
table (restored with an unmeasured ``migrate`` when a previous strategy left
another), and every leg is planned by SSM with ``theta=0.05`` (see
``THETA``), so the load stays balanced within 5 % of the mean. Per strategy, over both migrations (and the
max per leg, ``max_latency_ms_per_leg``): the max
and p99 record latency of batches reaching the sink from the first migration
step to half a second after the last, its duration, the longest interval
with no output (``max_gap_ms``), the bytes of state moved, and the peak RSS
of the job's host processes. The setup before the first step (an in-band
``Monitor`` for per-bin load and size, planning, and starting the new host
actor, the same for every strategy) is reported apart: ``setup_s`` and
``setup_max_latency_ms``. Before each strategy the same job runs
``--settle`` seconds (2) without a migration: ``baseline_max_latency_ms`` /
``baseline_p99_latency_ms`` are the floor any strategy is read against (on a
busy 2-core machine its max is tens to a hundred ms). The strategies: all_at_once; batched with 64
and 16 bins a step; fluid; non_disruptive with 16 bins a step, also with replication (each step's
bins copied just before it, then only the keys written since move; ``bytes_replicated`` counts the
copies) and paced (``gap_s``: 100 ms after each 16-bin step, 50 ms after each 8-bin step, Megaphone's
pause that lets queues drain between steps); batched with 16 bins a step paced to the backlog
(``pace=True``: each step waits until the records queued behind the one before have come through). The job keeps one spare host (``spare_hosts=1``),
so a scale-out sets up a started process instead of starting one while the
job runs; the spare is replaced before each strategy. A PNG of latency over time (a row per
strategy, a panel per leg) is written beside the JSON (``--png``).

Targets: the best fine-grained strategy's max latency is at most 1/5 of
all_at_once's (``best_over_all_at_once`` <= 0.2), and no strategy but
all_at_once has an output gap over 250 ms.

Ray's own metrics are off (``--ray-metrics`` keeps them; ``ray_metrics`` in the JSON): every 10 s
Ray's metrics agent aggregates the workers' metrics, 150-250 ms of one of this machine's two cores,
and in five runs with it (8M keys) each leg's highest latencies belonged to records stamped within the
same few hundred ms of that 10 s period, whatever the step: the max measured the agent.

Run: ``python -m benchmarks.migration [--quick | --large] [--keys N] [--load F] [--png PATH] [--theta F]
[--ray-metrics] [--settle S] [--warm-up S] [--wide-window S]``.
``--quick`` (about a minute): 100,000 keys, 256 bins, fewer strategies.
``--large`` (several minutes, about 3 GB): 8,000,000 keys and 4096 bins, where Megaphone's result
lives: all_at_once against batched (plain and paced to the backlog) and the paced non-disruptive
strategies. Targets there:
``best_over_all_at_once`` <= 0.1 and the best fine-grained ``max_latency_ms`` <= 100
(``target_large_met``). ``all_at_once_max_latency_ms`` is all_at_once's own figure, reported apart:
it is the baseline the others are read against.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np
import psutil

from benchmarks.common import stop_ray, emit, start_ray
from benchmarks.control_overhead import TakeLatency
from benchmarks.measure import PARALLELISM, WIDE_S, build, loadavg, warm_up

SETTLE_S = 2.0  # after each leg, and the baseline before each strategy (--settle)
TAIL_S = 0.5
THETA = 0.05
"""The planner's load bound for every leg, by default (``--theta``; SSM: no instance above ``1 + theta``
times the mean load).
With its default 0.2, the fewest bytes moved left 40/40/20 % of the load after 2 -> 3 and 60/40 %
after 3 -> 2: the instance with 60 % saturated during the leg, whatever the strategy."""
VERBOSE = False  # --verbose: print each leg's step log

STRATEGIES: list[tuple[str, str, dict[str, Any]]] = [
    ("all_at_once", "all_at_once", {}),
    ("batched_64", "batched", {"chunk_bins": 64}),
    ("batched_16", "batched", {"chunk_bins": 16}),
    ("fluid", "fluid", {}),
    ("non_disruptive_16", "non_disruptive", {"chunk_bins": 16}),
    ("non_disruptive_16_replicated", "non_disruptive", {"chunk_bins": 16, "replicate": True}),
    ("non_disruptive_16_gap100ms", "non_disruptive", {"chunk_bins": 16, "gap_s": 0.1}),
    ("non_disruptive_8_gap50ms", "non_disruptive", {"chunk_bins": 8, "gap_s": 0.05}),
    ("batched_16_paced", "batched", {"chunk_bins": 16, "pace": True}),
]
QUICK = ("all_at_once", "batched_16", "non_disruptive_16", "non_disruptive_16_replicated")
LARGE = ("all_at_once", "batched_16", "batched_16_paced", "non_disruptive_16_gap100ms", "non_disruptive_8_gap50ms")
LARGE_KEYS, LARGE_BINS = 8_000_000, 4096


class HostRss(threading.Thread):
    """Peak summed RSS of the job's host processes (hosts come and go with the rescale)."""

    def __init__(self, job: Any):
        super().__init__(daemon=True)
        self.job = job
        self.peak = 0
        self._pids: dict[Any, int] = {}
        self._stop = threading.Event()

    def reset(self) -> None:
        self.peak = 0

    def run(self) -> None:
        import ray

        while not self._stop.is_set():
            hosts = list(self.job.topology.hosts())
            total = 0
            for h in hosts:
                key = h._actor_id
                if key not in self._pids:
                    try:
                        self._pids[key] = ray.get(h.pid.remote(), timeout=5)
                    except Exception:
                        continue
                try:
                    total += psutil.Process(self._pids[key]).memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()


def gaps_ms(arrivals_ns: np.ndarray, start_ns: int, end_ns: int) -> float:
    """The longest interval without a batch reaching the sink within [start, end]."""
    inside = np.sort(arrivals_ns[(arrivals_ns >= start_ns) & (arrivals_ns <= end_ns)])
    edges = np.concatenate([[start_ns], inside, [end_ns]])
    return float(np.diff(edges).max() / 1e6) if len(edges) > 1 else 0.0


def weighted_p99(latency_ms: np.ndarray, rows: np.ndarray) -> float:
    if len(latency_ms) == 0:
        return 0.0
    order = np.argsort(latency_ms)
    cum = np.cumsum(rows[order])
    return float(latency_ms[order][np.searchsorted(cum, 0.99 * cum[-1])])


def migrate(job: Any, parallelism: int, strategy: str, knobs: dict[str, Any]) -> dict[str, Any]:
    called = time.time_ns()
    progress = job.rescale("count", parallelism, strategy=strategy, **knobs).result(600)
    end = time.time_ns()
    start = progress["first_step_ns"] or called
    if VERBOSE:
        print(f"    {strategy} -> {parallelism}: {progress['steps']} steps", flush=True)
        for step in progress["step_log"]:
            print("      " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                      for k, v in step.items()), flush=True)
    return {"called_ns": called, "start_ns": start, "end_ns": end, "bytes": progress["bytes_moved"],
            "steps": progress["steps"], "reloaded": progress["bins_reloaded"],
            "replicated": progress["bytes_replicated"]}


def _curve(arrival: np.ndarray, latency_ms: np.ndarray, leg: dict[str, Any],
           nxt: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """One leg's latency over time: from its call to the next leg's call (or the end of the samples)."""
    mine = arrival >= leg["called_ns"]
    if nxt is not None:
        mine &= arrival < nxt["called_ns"]
    return ((arrival[mine] - leg["called_ns"]) / 1e9, latency_ms[mine],
            (leg["start_ns"] - leg["called_ns"]) / 1e9, (leg["end_ns"] - leg["called_ns"]) / 1e9)


def run_strategy(job: Any, rss: HostRss, label: str, strategy: str, knobs: dict[str, Any],
                 table: list[int], settle_s: float = SETTLE_S) -> dict[str, Any]:
    if list(job.plan.bin_tables["count"]) != table:  # every strategy starts from the same bin table
        job.migrate("count", table, strategy="all_at_once").result(600)
        time.sleep(settle_s)
    job.refill_spare_hosts(120)  # replace the spare host the previous scale-out took
    job.run_control(TakeLatency()).result(60)  # drop what came before
    time.sleep(settle_s)  # the same job without a migration: the floor a strategy's latency is read against
    base = job.run_control(TakeLatency()).result(60)
    rss.reset()
    legs = []
    for p in (PARALLELISM + 1, PARALLELISM):
        legs.append(migrate(job, p, strategy, knobs))
        time.sleep(settle_s)  # let the backlog of the migration drain before the next one (pacing)
    samples = job.run_control(TakeLatency()).result(60)
    arrival, latency_ms, rows = samples[:, 0], samples[:, 1] / 1e6, samples[:, 2]
    inside = np.zeros(len(arrival), dtype=bool)
    setup = np.zeros(len(arrival), dtype=bool)
    per_leg = []
    for leg in legs:
        mine = (arrival >= leg["start_ns"]) & (arrival <= leg["end_ns"] + TAIL_S * 1e9)
        per_leg.append(round(float(latency_ms[mine].max()) if mine.any() else 0.0, 1))
        inside |= mine
        setup |= (arrival >= leg["called_ns"]) & (arrival < leg["start_ns"])
    result = {
        "strategy": label,
        "max_latency_ms": round(float(latency_ms[inside].max()) if inside.any() else 0.0, 1),
        "max_latency_ms_per_leg": per_leg,
        "p99_latency_ms": round(weighted_p99(latency_ms[inside], rows[inside]), 1),
        "duration_s": round(sum((leg["end_ns"] - leg["start_ns"]) / 1e9 for leg in legs), 3),
        "max_gap_ms": round(max(gaps_ms(arrival, leg["start_ns"], leg["end_ns"]) for leg in legs), 1),
        "bytes_moved": int(sum(leg["bytes"] for leg in legs)),
        "peak_rss_mb": round(rss.peak / 2**20, 1),
        "steps": [leg["steps"] for leg in legs],
        "bins_reloaded": sum(leg["reloaded"] for leg in legs),
        "bytes_replicated": int(sum(leg["replicated"] for leg in legs)),
        "setup_s": round(sum((leg["start_ns"] - leg["called_ns"]) / 1e9 for leg in legs), 3),
        "setup_max_latency_ms": round(float(latency_ms[setup].max()) if setup.any() else 0.0, 1),
        "baseline_max_latency_ms": round(float(base[:, 1].max() / 1e6) if len(base) else 0.0, 1),
        "baseline_p99_latency_ms": round(weighted_p99(base[:, 1] / 1e6, base[:, 2]), 1),
    }
    result["_curves"] = [_curve(arrival, latency_ms, leg, nxt) for leg, nxt in zip(legs, [*legs[1:], None])]
    print(f"  {label}: max latency {result['max_latency_ms']} ms, p99 {result['p99_latency_ms']} ms, "
          f"{result['duration_s']} s, max gap {result['max_gap_ms']} ms, "
          f"{result['bytes_moved'] / 2**20:.1f} MiB moved (without a migration: max "
          f"{result['baseline_max_latency_ms']} ms, p99 {result['baseline_p99_latency_ms']} ms)", flush=True)
    return result


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 1.9 * len(results)), squeeze=False, sharey="row")
    for row, res in zip(axes, results):
        for ax, (t, lat, begin, end), leg in zip(row, res["_curves"], ("2 -> 3", "3 -> 2")):
            ax.plot(t, lat, ".", markersize=2)
            ax.axvspan(0, begin, color="grey", alpha=0.15)
            ax.axvspan(begin, end, color="orange", alpha=0.25)
            ax.set_yscale("log")
            ax.set_ylabel("ms")
            ax.set_title(f"{res['strategy']}: {leg} (grey: planning and new hosts; orange: migration)",
                         fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the rescale started", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="100,000 keys, 256 bins, four strategies")
    size.add_argument("--large", action="store_true",
                      help=f"{LARGE_KEYS:,} keys, {LARGE_BINS} bins, all_at_once against the paced strategies")
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default 1,000,000)")
    parser.add_argument("--bins", type=int, default=None, help="key bins (default 1024, quick 256)")
    parser.add_argument("--load", type=float, default=0.6, help="offered rate as a fraction of capacity")
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--png", default="migration_latency.png", help="where the latency plot goes")
    parser.add_argument("--strategies", default=None, help="comma-separated labels to run")
    parser.add_argument("--verbose", action="store_true", help="print each leg's step log")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help=f"seconds of settling after each leg, and of baseline before each strategy "
                             f"(default {SETTLE_S})")
    parser.add_argument("--ray-metrics", action="store_true",
                        help="keep Ray's metrics collection on (its agent takes a core for 150-250 ms every 10 s)")
    parser.add_argument("--theta", type=float, default=THETA,
                        help=f"the planner's load bound (default {THETA}; few bins need more)")
    parser.add_argument("--warm-up", type=float, default=None, metavar="S",
                        help="seconds the unthrottled warm-up runs at least, measuring the capacity with two "
                             "count instances (default 5, quick 2; it also runs until 99%% of the keys are held)")
    parser.add_argument("--wide-window", type=float, default=WIDE_S, metavar="S",
                        help=f"seconds over which the warm-up measures the capacity with {PARALLELISM + 1} count "
                             f"instances, after a quarter of that for the rescale's backlog (default {WIDE_S})")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N",
                        help="host processes of each job (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    global VERBOSE
    VERBOSE = args.verbose
    keys = args.keys or (100_000 if args.quick else LARGE_KEYS if args.large else 1_000_000)
    bins = args.bins or (256 if args.quick else LARGE_BINS if args.large else 1024)
    preset = QUICK if args.quick else LARGE if args.large else None
    labels = args.strategies.split(",") if args.strategies else [s[0] for s in STRATEGIES
                                                                  if preset is None or s[0] in preset]
    chosen = [s for s in STRATEGIES if s[0] in labels]
    started, load_at_start = time.perf_counter(), loadavg()
    tmp = tempfile.mkdtemp(prefix="chiray-bench-migration-")
    started_ray = start_ray(num_cpus=4, ray_metrics=args.ray_metrics)  # room for the hosts a scale-out adds

    results = []
    try:
        print(f"warming up: {keys:,} keys, {bins} bins, unthrottled ...", flush=True)
        warm_s = args.warm_up if args.warm_up is not None else 2.0 if args.quick else 5.0
        warm = warm_up(keys, args.batch_size, os.path.join(tmp, "warm"), min_s=warm_s,
                       num_bins=bins, widen_to=PARALLELISM + 1, wide_s=args.wide_window, num_hosts=args.num_hosts)
        capacity = min(warm.capacity, warm.wide_capacity or warm.capacity)
        rate = args.load * capacity
        print(f"  capacity {warm.capacity:,.0f} records/s with {PARALLELISM} count instances, "
              f"{warm.wide_capacity:,.0f} with {PARALLELISM + 1}; offering {rate:,.0f} "
              f"({args.load:.0%} of the lower)", flush=True)
        job = build("migration", rate, keys, args.batch_size, num_bins=bins).submit(
            restore_from=warm.path, checkpoint_dir=os.path.join(tmp, "run"), spare_hosts=1, num_hosts=args.num_hosts)
        rss = HostRss(job)
        rss.start()
        try:
            time.sleep(args.settle)  # settle after the restore
            table = list(job.plan.bin_tables["count"])
            for label, strategy, knobs in chosen:
                results.append(run_strategy(job, rss, label, strategy, {**knobs, "theta": args.theta}, table,
                                            args.settle))
        finally:
            rss.stop()
            job.cancel()
    finally:
        stop_ray(started_ray)
        shutil.rmtree(tmp, ignore_errors=True)
    plot(results, args.png)
    print(f"latency plot: {args.png}", flush=True)
    for res in results:
        del res["_curves"]
    base = next((r for r in results if r["strategy"] == "all_at_once"), None)
    fine = [r for r in results if r["strategy"] != "all_at_once"]
    best = min((r["max_latency_ms"] for r in fine), default=None)
    ratio = round(best / base["max_latency_ms"], 3) if base and best is not None and base["max_latency_ms"] else None
    emit({
        "benchmark": "migration", "quick": args.quick, "large": args.large, "keys": keys, "keys_held": warm.keys_held, "bins": bins,
        "num_hosts": args.num_hosts,
        "capacity_records_per_s": round(warm.capacity),
        f"capacity_{PARALLELISM + 1}_records_per_s": round(warm.wide_capacity or 0),
        "offered_records_per_s": round(rate), "load": args.load,
        "theta": args.theta, "ray_metrics": args.ray_metrics, "strategies": results, "best_over_all_at_once": ratio,
        "all_at_once_max_latency_ms": base["max_latency_ms"] if base else None,
        "best_fine_grained_max_latency_ms": best,
        "target_large_met": ratio is not None and ratio <= 0.1 and best is not None and best <= 100,
        "baseline_max_latency_ms": max((r["baseline_max_latency_ms"] for r in results), default=None),
        "target_best_over_all_at_once_met": ratio is not None and ratio <= 0.2,
        "target_max_gap_met": all(r["max_gap_ms"] <= 250 for r in fine),
        "png": os.path.abspath(args.png),
        "loadavg_1m_at_start": load_at_start, "loadavg_1m_at_end": loadavg(),
        "wall_s": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    main()
