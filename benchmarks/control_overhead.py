"""control_overhead.py: what a stream of NoOp control ops costs a running keyed count (throughput, latency).

Pipeline: ``generate`` source (2 instances, open loop at a fixed offered
rate) -> ``key_by("key")`` -> ``agg(count, max(ts), emit="updates")`` (2
instances, so blocking ops really align two inputs) -> a latency sink (1
instance) that takes ``now - ts`` of every update row it receives; ``ts`` is
the ingestion time the source stamped on the batch (the key's latest, which
is the batch's own for nearly every key), so that is each record's
end-to-end latency. The samples stay in the sink's host and are fetched
in-band by one non-blocking control op after the last window.

First an unthrottled run measures the pipeline's capacity; the measured job
is then offered ``--load`` (default 70 %) of it. In one job, measurement
windows follow each other: 0 ops/s, then ``NoOp`` injected from this driver
at 1, 10 and 100 ops/s, non-blocking then blocking (the driver fires each op
on schedule without waiting for it, then collects every result after the
window), and 0 ops/s again as a drift check. Per window: throughput (records
into the count operator) as a ratio of the first 0 ops/s window, p50/p99
record latency, and p50/p99 op completion time as the controller measured it
(``OpHandle.elapsed_s``: injection to the last sink's return), and the
backlog the window left (seconds of offered input not yet counted at its
end). Before each window the job works off the previous window's backlog,
so that no window is credited with another's catching up.

Targets: at 100 ops/s a throughput ratio >= 0.9 non-blocking and >= 0.8
blocking. Expected on a quiet 2-core machine: capacity 650,000-900,000
records/s (300,000-430,000 on busier days; 130,000-200,000 before hosts sent
one parcel per peer with one call in flight: a Ray call costs about a
millisecond of CPU across the two processes, most of the data plane's cost;
credit going back in halves saves a third of the calls); at every rate a throughput ratio of ~1.0 for both kinds;
record latency p50 ~12-20 ms (~15-35 ms at 100 ops/s); op completion p50
~30-110 ms, p99 under ~180 ms. A NoOp still costs some CPU, mostly Ray's
calls: the driver's ``run_control`` calls reach the controller in batches
(one call in flight, the ops started meanwhile together), ops started while
others run are injected together (``JobConfig.control_batch_s``) and travel
together, one control run per channel hop and one return, and a host's
calls carry everything queued while the last was in flight. A busy machine
moves these figures (see ``loadavg_1m_at_start``).

Run: ``python -m benchmarks.control_overhead [--quick] [--window S] [--load F] [--calibration W,M]
[--warm-up S]``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import stop_ray, emit, start_ray
from chiray.control.op import ControlOp, InstanceHandler
from chiray.operators.logic import InstanceInfo, Sink, SinkWriter

RATES = (1, 10, 100)
NUM_KEYS = 100_000
PARALLELISM = 2

# Per host process: the latency writers living there, so that ``TakeLatency`` can reach them.
_WRITERS: dict[tuple[str, int], "LatencyWriter"] = {}


class LatencyWriter(SinkWriter):
    """Keeps (arrival ns, latency ns, rows) per distinct ``ts`` of each batch; nothing else."""

    def __init__(self, info: InstanceInfo) -> None:
        self.samples: list[tuple[int, int, int]] = []
        _WRITERS[(info.operator, info.index)] = self

    def write(self, batch: pa.RecordBatch) -> None:
        now = time.time_ns()
        ts = batch.column("ts").to_numpy(zero_copy_only=False).view("int64")
        lo, hi = int(ts.min()), int(ts.max())
        if lo == hi:  # the usual case: one input batch, one ingestion time
            self.samples.append((now, now - lo, len(ts)))
            return
        values, counts = np.unique(ts, return_counts=True)
        self.samples.extend((now, now - int(v), int(c)) for v, c in zip(values, counts))

    def take(self) -> np.ndarray:
        out, self.samples = self.samples, []
        return np.array(out, dtype=np.int64).reshape(-1, 3)


class LatencySink(Sink):
    """A sink that only measures latency (its writers are fetched with ``TakeLatency``)."""

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return LatencyWriter(info)


class TakeLatency(ControlOp):
    """Non-blocking op: every latency sink hands over the samples it kept so far."""

    blocking = False

    class Instance(InstanceHandler):
        def on_complete(self, ctx: Any) -> Any:
            writer = _WRITERS.get(ctx.instance) if ctx.kind == "sink" else None
            return None if writer is None else writer.take()

    def on_complete(self, ctx: Any) -> np.ndarray:
        parts = [p for p in self.returned.values() if p is not None]
        return np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)


def build(rate: float | None, batch_size: int) -> Any:
    from chiray.operators import Dataflow, generate

    flow = Dataflow("control_overhead")
    (flow.source(generate(None, rate=rate, batch_size=batch_size, num_keys=NUM_KEYS, key_type="int",
                          num_splits=PARALLELISM), parallelism=PARALLELISM, name="source")
         .key_by("key")
         .agg(count=(None, "count"), ts=("ts", "max"), emit="updates", parallelism=PARALLELISM, name="count")
         .sink(LatencySink(), name="sink", parallelism=1))
    return flow


def counted(job: Any) -> int:
    """Records taken in by the count operator so far."""
    return job.statistics().records_in("count")


def measure_capacity(batch_size: int, warmup_s: float, measure_s: float, timeout_s: float = 60.0,
                     num_hosts: int | None = None) -> float:
    """Records/s of the unthrottled pipeline (source as fast as credit allows), measured from the end of
    the warm-up or the first counted record, whichever comes later."""
    job = build(None, batch_size).submit(num_hosts=num_hosts)
    try:
        time.sleep(warmup_s)
        deadline = time.perf_counter() + timeout_s
        while counted(job) == 0:  # a short warm-up on a busy machine can end before the first record
            if time.perf_counter() > deadline:
                raise TimeoutError(f"control_overhead: no record counted {timeout_s} s after the warm-up")
            time.sleep(0.05)
        n0, t0 = counted(job), time.perf_counter()
        time.sleep(measure_s)
        deadline = time.perf_counter() + timeout_s
        while (n1 := counted(job)) == n0:  # none counted in a short window on a busy machine: go on
            if time.perf_counter() > deadline:
                raise TimeoutError(f"control_overhead: no record counted in {measure_s + timeout_s} s of measuring")
            time.sleep(0.05)
        t1 = time.perf_counter()
    finally:
        job.cancel()
    return (n1 - n0) / (t1 - t0)


def inject(job: Any, rate: int, blocking: bool, window_s: float) -> tuple[int, int, list[Any]]:
    """Fire NoOps at ``rate``/s for ``window_s`` without waiting; returns (start ns, end ns, handles)."""
    from chiray.control.ops.noop import NoOp

    handles = []
    start_ns, t0 = time.time_ns(), time.perf_counter()
    due = t0
    while rate and due < t0 + window_s:
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        handles.append(job.run_control(NoOp(blocking=blocking)))
        due += 1.0 / rate
    remaining = t0 + window_s - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
    return start_ns, time.time_ns(), handles


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """Percentiles ``qs`` (fractions) of ``values``, each counted ``weights`` times."""
    if len(values) == 0:
        return [float("nan")] * len(qs)
    order = np.argsort(values)
    cum = np.cumsum(weights[order]) / weights.sum()
    return [float(values[order][min(np.searchsorted(cum, q), len(values) - 1)]) for q in qs]


class Schedule:
    """Where the open-loop source should be: records due into the count operator by now.

    Anchored after the warm-up, when the job has caught up with its schedule.
    """

    def __init__(self, job: Any, rate: float):
        self.job, self.rate = job, rate
        self.n0, self.t0 = counted(job), time.perf_counter()

    def lag_s(self) -> float:
        """Seconds of offered input not yet taken in by the count operator."""
        due = self.n0 + self.rate * (time.perf_counter() - self.t0)
        return (due - counted(self.job)) / self.rate

    def wait_caught_up(self, max_lag_s: float, timeout_s: float) -> float:
        """Wait until the backlog left by the previous window is gone; returns the seconds waited."""
        t0 = time.perf_counter()
        while self.lag_s() > max_lag_s and time.perf_counter() - t0 < timeout_s:
            time.sleep(0.1)
        return time.perf_counter() - t0


def run_windows(job: Any, schedule: Schedule, window_s: float, max_lag_s: float) -> list[dict[str, Any]]:
    """One window per (rate, blocking); each: throughput, op completion times, time span.

    Before each window the job is given time to work off the backlog the previous one left,
    so that no window is credited with catching up on another's input.
    """
    plan = [(0, False)] + [(r, False) for r in RATES] + [(r, True) for r in RATES] + [(0, False)]
    out = []
    for rate, blocking in plan:
        waited = schedule.wait_caught_up(max_lag_s, timeout_s=4 * window_s)
        n0, t0 = counted(job), time.perf_counter()
        start_ns, end_ns, handles = inject(job, rate, blocking, window_s)
        n1, t1 = counted(job), time.perf_counter()
        elapsed = []
        for h in handles:
            h.result(timeout=60)
            elapsed.append(h.elapsed_s)
        w = {"rate": rate, "blocking": blocking, "records_per_s": (n1 - n0) / (t1 - t0),
             "span": (start_ns, end_ns), "ops": len(handles), "elapsed_ms": np.array(elapsed) * 1e3,
             "lag_s": schedule.lag_s()}
        kind = "blocking" if blocking else "non-blocking"
        print(f"  {rate:>3} ops/s {kind:<12}: {w['records_per_s']:>10,.0f} records/s, {len(handles)} ops, "
              f"backlog at the end {max(w['lag_s'], 0.0):.2f} s (waited {waited:.1f} s before)", flush=True)
        out.append(w)
    return out


def summarise(windows: list[dict[str, Any]], samples: np.ndarray) -> dict[str, Any]:
    """The JSON figures: each window against the first (0 ops/s) one; prints a table."""
    base = windows[0]
    figures: dict[str, Any] = {}
    arrival, latency_ms, rows = samples[:, 0], samples[:, 1] / 1e6, samples[:, 2]
    for w in windows:
        inside = (arrival >= w["span"][0]) & (arrival < w["span"][1])
        w["lat"] = weighted_percentiles(latency_ms[inside], rows[inside].astype(float), (0.5, 0.99))
    b50, b99 = base["lat"]
    figures["baseline_records_per_s"] = round(base["records_per_s"])
    figures["baseline_latency_p50_ms"] = round(b50, 2)
    figures["baseline_latency_p99_ms"] = round(b99, 2)
    print(f"  {'ops/s':>5} {'kind':<12} {'tput ratio':>10} {'lat p50':>8} {'lat p99':>8} "
          f"{'op p50':>8} {'op p99':>8}  (ms)")
    for w in windows[1:]:
        if w is windows[-1]:
            figures["throughput_ratio_baseline_repeat"] = round(w["records_per_s"] / base["records_per_s"], 3)
            figures["latency_p99_ms_baseline_repeat"] = round(w["lat"][1], 2)
            continue
        tag = f"{'blocking' if w['blocking'] else 'nonblocking'}_{w['rate']}"
        ratio = w["records_per_s"] / base["records_per_s"]
        ops_ms = w["elapsed_ms"]
        op50, op99 = np.percentile(ops_ms, [50, 99]) if len(ops_ms) else (np.nan, np.nan)
        figures[f"throughput_ratio_{tag}"] = round(ratio, 3)
        figures[f"latency_p50_ms_{tag}"] = round(w["lat"][0], 2)
        figures[f"latency_p99_ms_{tag}"] = round(w["lat"][1], 2)
        figures[f"latency_p50_ratio_{tag}"] = round(w["lat"][0] / b50, 2) if b50 > 0 else None
        figures[f"latency_p99_ratio_{tag}"] = round(w["lat"][1] / b99, 2) if b99 > 0 else None
        figures[f"completion_p50_ms_{tag}"] = round(float(op50), 2)
        figures[f"completion_p99_ms_{tag}"] = round(float(op99), 2)
        figures[f"backlog_s_{tag}"] = round(max(w["lag_s"], 0.0), 2)
        print(f"  {w['rate']:>5} {tag.split('_')[0]:<12} {ratio:>10.3f} {w['lat'][0]:>8.2f} "
              f"{w['lat'][1]:>8.2f} {op50:>8.2f} {op99:>8.2f}", flush=True)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s windows, short calibration")
    parser.add_argument("--window", type=float, default=None, help="seconds per window (default 10, quick 2)")
    parser.add_argument("--load", type=float, default=0.7, help="offered rate as a fraction of capacity")
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument("--calibration", default=None, metavar="WARM,MEASURE",
                        help="seconds of the unthrottled capacity run: its warm-up, then its measurement "
                             "(default 3,6; quick 1.5,2)")
    parser.add_argument("--warm-up", type=float, default=None, metavar="S",
                        help="seconds the measured job runs before the first window (default 5, quick 2)")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N",
                        help="host processes of each job (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    window_s = args.window or (2.0 if args.quick else 10.0)
    if args.calibration:
        try:
            calibration = tuple(float(x) for x in args.calibration.split(","))
        except ValueError:
            calibration = ()
        if len(calibration) != 2 or min(calibration) < 0 or calibration[1] <= 0:
            parser.error(f"--calibration: expected WARM,MEASURE seconds (MEASURE > 0), got {args.calibration!r}")
    else:
        calibration = (1.5, 2.0) if args.quick else (3.0, 6.0)
    warm_up_s = args.warm_up if args.warm_up is not None else 2.0 if args.quick else 5.0
    started, load = time.perf_counter(), os.getloadavg()[0]
    started_ray = start_ray()

    try:
        print("measuring capacity (unthrottled) ...", flush=True)
        capacity = measure_capacity(args.batch_size, *calibration, num_hosts=args.num_hosts)
        rate = args.load * capacity
        print(f"  capacity {capacity:,.0f} records/s; offering {rate:,.0f} records/s ({args.load:.0%})",
              flush=True)
        job = build(rate, args.batch_size).submit(num_hosts=args.num_hosts)
        try:
            time.sleep(warm_up_s)
            windows = run_windows(job, Schedule(job, rate), window_s, max_lag_s=0.1)
            samples = job.run_control(TakeLatency()).result(timeout=60)
        finally:
            job.cancel()
    finally:
        stop_ray(started_ray)
    figures = summarise(windows, samples)
    nb, bl = figures["throughput_ratio_nonblocking_100"], figures["throughput_ratio_blocking_100"]
    emit({
        "benchmark": "control_overhead", "quick": args.quick, "window_s": window_s,
        "batch_size": args.batch_size, "parallelism": PARALLELISM, "num_hosts": args.num_hosts,
        "capacity_records_per_s": round(capacity), "offered_records_per_s": round(rate), "load": args.load,
        **figures,
        "target_nonblocking_100_met": nb >= 0.9, "target_blocking_100_met": bl >= 0.8,
        "loadavg_1m_at_start": round(load, 1), "wall_s": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    # Run the importable copy of this module, so Ray pickles the sink and op classes by reference
    # and the sink's writers and ``TakeLatency`` share one ``_WRITERS`` in each host process.
    from benchmarks import control_overhead

    control_overhead.main()
