"""checkpoint.py: what a checkpoint every second costs a keyed count holding a million keys.

Pipeline (``benchmarks.measure.build``): ``generate`` (2 instances, string
keys, open loop at a fixed offered rate) -> ``key_by("key")`` ->
``agg(count, max(ts), emit="updates")`` (2 instances) -> a latency sink (1
instance) that keeps, per batch, its arrival time and ``now - ts`` (``ts``:
the ingestion time the source stamped), fetched in-band after the windows by
``control_overhead.TakeLatency``.

First the state is filled: the dataflow runs unthrottled until it has seen
4.6 x ``--keys`` records (99 % of the keys), which also measures its
capacity; a checkpoint of it seeds the measured job (``restore_from``), which
is offered ``--load`` (default 65 %) of that capacity. In that one job: a
window without checkpoints, then a window in which this driver calls
``job.checkpoint()`` every second (the next one starts on schedule, or at
once when one took longer than a second), then a drift-check window without
again. The window of checkpoints is measured once checkpoints have run for
``--lead-in`` seconds (default 3), one a second, so that its first checkpoint
covers one second of changes, as every later one does, not the whole window
without checkpoints before it (``lead_in_*`` in the JSON: those first
checkpoints' durations and bytes, and the latency p99 while they ran).
Before the first window the job settles: the checkpoint it takes of
its own after the restore is durable and it has caught up with the offered
rate (``settle_s``); before each later window, it works off any backlog the
previous one left, until the sink's batches are again within 100 ms of
their ingestion time. Per window: throughput (records into the count operator), p50/p99
record latency, and the longest gap between two batches reaching the sink
(``max_stall_ms``: how long a checkpoint holds the output up). Per
checkpoint: the duration of the ``job.checkpoint()`` call (barrier injection
to committed manifest) and the bytes of the state files it wrote
(``bytes_per_checkpoint``, p50); beside them ``full_bytes``, the state files of
one full copy (the warm-up's checkpoint, the first of its job), and
``changed_rows_per_interval`` (p50), the keys that changed between two
checkpoints: the expected distinct keys among the records counted in between,
``K (1 - exp(-n / K))`` for ``K`` uniform keys. An incremental checkpoint
writes about the changed rows; a full one the whole state. Each instance copies
its bins whole in turn, every few checkpoints (``checkpoint_max_deltas``), so
the window holds checkpoints of both kinds; the JSON splits its latency by
them: ``latency_p99_ms_checkpoint_1s_full_copies``, of the records ingested
while a checkpoint that wrote full copies ran (one that wrote over
``FULL_COPY_FACTOR`` times the window's median bytes; ``checkpoints_full`` of
them, running ``full_copy_s`` in all), and ``..._changes``, of the others.

Recovery (after the job is cancelled and its host processes have exited,
``exit_before_recovery_s`` after the cancel): ``recovery_s``, the time from
``submit(restore_from=...)`` of the window's last checkpoint (each bin a full
copy and the changes written after it) until the restored count takes in
records again: its hosts start, and each loads only the bins it owns, from
the files that hold them, in parallel with the other hosts;
``recovery_submit_s``, until ``submit()`` returned; ``recovered_keys``, the
keys the restored count holds (at least the keys held after the warm-up).

Memory (after the windows): ``state_bytes_per_key``, what the count's state
holds in memory (its columns with their spare capacity and its key index:
``memory_nbytes``) over the keys it holds; ``job_rss_mb``, the summed RSS of
the job's host processes, and ``rss_mb_per_million_keys``, that over the
millions of keys held (it includes each host's fixed cost, ~150 MB: a figure
for sizing at millions of keys, dominated by that cost at the quick size).
Measured at ``--quick`` (200,000 keys over 2 instances, a busy 2-core
machine): 119 bytes per key (a count and a max per string key, the columns'
spare capacity included; a state filled in one batch holds a count and a sum
in 77), 493 MB of host RSS, so 2,464 MB per million keys at that size.

Targets (``targets_met`` names each): throughput ratio (checkpoint window /
first window) >= 0.95; latency p99 with checkpoints <= 2x the larger of the
windows without; ``bytes_per_checkpoint`` <= 1.5x the encoded size of the rows
that changed (``changed_rows_per_interval`` x ``full_bytes`` / keys held);
``recovery_s`` <= 5.
Expected on a 2-core machine, 5,000-record batches: capacity
~300,000-450,000 records/s (it varies with the machine's load). Checkpoints
are incremental (``JobConfig.checkpoint_max_deltas``): at a million keys a
full copy is ~36 MB (``full_bytes``), and a checkpoint a second writes the
~60,000 rows that changed, ~3.6 MB (``bytes_per_checkpoint``, ~60 bytes a
row: 1,024 bins each an IPC stream of its own), each bin whole again after 8
changes. Measured on a busy 2-core machine (capacity ~100,000 records/s):
throughput ratio 1.0 (0.8 with full copies at every checkpoint), latency p99
0.4 s (4 s), longest stall 0.4 s (1 s).

Run: ``python -m benchmarks.checkpoint [--quick] [--keys N] [--window S] [--load F] [--warm-up S]
[--settle S] [--lead-in S]``.
``--quick`` (under a minute): 200,000 keys and 4 s windows (the JSON says so).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from typing import Any, Callable

import numpy as np

from benchmarks.common import stop_ray, emit, start_ray
from benchmarks.control_overhead import Schedule, TakeLatency, weighted_percentiles
from benchmarks.measure import PARALLELISM, build, counted, loadavg, state_bytes, warm_up


def checkpoint_window(job: Any, root: str, window_s: float, interval_s: float) -> dict[str, Any]:
    """Call ``job.checkpoint()`` every ``interval_s`` for ``window_s``; durations and bytes per checkpoint, and
    the records counted when each was called."""
    durations, sizes, counts, spans, checkpoint_id = [], [], [], [], 0
    t0 = time.perf_counter()
    due = t0
    while due < t0 + window_s:
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        counts.append(counted(job))
        c0, called_ns = time.perf_counter(), time.time_ns()
        checkpoint_id = job.checkpoint(timeout=60)
        durations.append(time.perf_counter() - c0)
        spans.append((called_ns, time.time_ns()))
        sizes.append(state_bytes(root, checkpoint_id))  # now, before retention deletes it
        due = max(due + interval_s, time.perf_counter())
    print("  checkpoints took " + ", ".join(f"{d * 1e3:.0f}" for d in durations) + " ms, wrote "
          + ", ".join(f"{n / 1e6:.1f}" for n in sizes) + " MB", flush=True)
    remaining = t0 + window_s - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
    return {"durations_ms": np.array(durations) * 1e3, "bytes": sizes, "counted": counts, "spans": spans,
            "last_id": checkpoint_id}


def changed_rows(counts: list[int | None], keys: int) -> list[float]:
    """Per interval between two checkpoint calls, the distinct keys expected among the records counted
    then (``keys`` uniform keys): the rows an incremental checkpoint has to write.

    Example:
        >>> [round(n) for n in changed_rows([0, 1000, None, 3000], 1000)]
        [632]
    """
    return [keys * -math.expm1(-(b - a) / keys) for a, b in zip(counts, counts[1:])
            if a is not None and b is not None]


LEAD_IN_S = 3.0
"""Seconds of checkpoints, one a second, before the window of checkpoints is measured (``--lead-in``)."""


def run_windows(job: Any, schedule: Schedule, root: str, window_s: float,
                steady: Callable[[], float] = lambda: 0.0, lead_in_s: float = LEAD_IN_S) -> list[dict[str, Any]]:
    """Windows: no checkpoints, a checkpoint a second, none again; each after the backlog is gone (and, after
    the first, once ``steady()`` has returned).

    The window of checkpoints is measured once they have run for ``lead_in_s``, a second apart: its first
    checkpoint covers the second before it, as every later one does. Without the lead-in, the window's first
    checkpoint wrote every row changed since the job's previous one, before the window without checkpoints
    (at 8M keys, 65 % load: about 15 s of changes, two thirds of the keys, most of a full copy, 0.9-1.3 s),
    which is not what a job checkpointing every second pays. The lead-in's figures are in the JSON beside
    the window's (``lead_in``)."""
    out = []
    for kind in ("none", "1s", "none_repeat"):
        waited = schedule.wait_caught_up(0.1, timeout_s=4 * window_s) + (steady() if out else 0.0)
        lead = checkpoint_window(job, root, lead_in_s, 1.0) if kind == "1s" and lead_in_s > 0 else None
        n0, t0, start_ns = schedule.job.statistics().records_in("count"), time.perf_counter(), time.time_ns()
        extra: dict[str, Any] = {}
        if kind == "1s":
            extra = checkpoint_window(job, root, window_s, 1.0)
            if lead is not None:
                extra["lead_in"] = {**lead, "span": (start_ns - int(lead_in_s * 1e9), start_ns)}
        else:
            time.sleep(window_s)
        n1, t1, end_ns = schedule.job.statistics().records_in("count"), time.perf_counter(), time.time_ns()
        w = {"kind": kind, "records_per_s": (n1 - n0) / (t1 - t0), "span": (start_ns, end_ns),
             "lag_s": max(schedule.lag_s(), 0.0), **extra}
        print(f"  checkpoints {kind:<12}: {w['records_per_s']:>10,.0f} records/s over {t1 - t0:.1f} s, "
              f"backlog at the end {w['lag_s']:.2f} s (waited {waited:.1f} s before)", flush=True)
        out.append(w)
    return out


def arrived_in(w: dict[str, Any], samples: np.ndarray) -> np.ndarray:
    """The sink's samples that arrived within window ``w``."""
    start, end = w["span"]
    return samples[(samples[:, 0] >= start) & (samples[:, 0] < end)]


def sink_figures(w: dict[str, Any], samples: np.ndarray) -> tuple[float, float, float]:
    """(latency p50 ms, latency p99 ms, longest gap between sink batches ms) inside window ``w``."""
    start, end = w["span"]
    inside = arrived_in(w, samples)
    p50, p99 = weighted_percentiles(inside[:, 1] / 1e6, inside[:, 2].astype(float), (0.5, 0.99))
    edges = np.concatenate([[start], np.unique(inside[:, 0]), [end]])
    return p50, p99, float(np.diff(edges).max()) / 1e6


FULL_COPY_FACTOR = 4.0
"""A checkpoint of the window that wrote more than this many times the window's median bytes wrote full copies
(an instance's turn to copy its bins whole: ``control.ops.chains.lead``)."""


def full_copy_spans(w: dict[str, Any]) -> list[tuple[int, int]]:
    """The (called, returned) ns of the checkpoints of window ``w`` that wrote full copies.

    Example:
        >>> full_copy_spans({"bytes": [8, 9, 160, 8], "spans": [(0, 1), (2, 3), (4, 9), (10, 11)]})
        [(4, 9)]
    """
    median = float(np.median(w["bytes"])) if w["bytes"] else 0.0
    return [span for span, n in zip(w["spans"], w["bytes"]) if n > FULL_COPY_FACTOR * median]


def split_by_full_copies(w: dict[str, Any], samples: np.ndarray) -> dict[str, Any]:
    """Within window ``w``: the latency p99 of the records ingested while a checkpoint that wrote full copies
    ran, and of the others (those around checkpoints of changes alone); how long full copies ran."""
    spans = full_copy_spans(w)
    inside = arrived_in(w, samples)
    ingested = inside[:, 0] - inside[:, 1]
    during = np.zeros(len(inside), dtype=bool)
    for lo, hi in spans:
        during |= (ingested >= lo) & (ingested < hi)
    out: dict[str, Any] = {"checkpoints_full": len(spans),
                           "full_copy_s": round(sum(hi - lo for lo, hi in spans) / 1e9, 2)}
    for tag, sel in (("full_copies", during), ("changes", ~during)):
        p99 = weighted_percentiles(inside[sel, 1] / 1e6, inside[sel, 2].astype(float), (0.99,))[0]
        out[f"latency_p99_ms_checkpoint_1s_{tag}"] = round(p99, 2) if sel.any() else None
    return out


def summarise(windows: list[dict[str, Any]], samples: np.ndarray, keys: int) -> dict[str, Any]:
    base, chk, repeat = windows
    figures: dict[str, Any] = {}
    for w, tag in ((base, "no_checkpoint"), (chk, "checkpoint_1s"), (repeat, "no_checkpoint_repeat")):
        p50, p99, stall = sink_figures(w, samples)
        figures[f"records_per_s_{tag}"] = round(w["records_per_s"])
        figures[f"latency_p50_ms_{tag}"] = round(p50, 2)
        figures[f"latency_p99_ms_{tag}"] = round(p99, 2)
        figures[f"max_stall_ms_{tag}"] = round(stall, 1)
        figures[f"backlog_s_{tag}"] = round(w["lag_s"], 2)
    figures["settle_s"] = base.get("settle_s")
    durations = chk["durations_ms"]
    figures["throughput_ratio_checkpoint_1s"] = round(chk["records_per_s"] / base["records_per_s"], 3)
    figures["throughput_ratio_repeat"] = round(repeat["records_per_s"] / base["records_per_s"], 3)
    figures["checkpoints"] = len(durations)
    figures["checkpoint_p50_ms"] = round(float(np.percentile(durations, 50)), 1)
    figures["checkpoint_p99_ms"] = round(float(np.percentile(durations, 99)), 1)
    figures["max_stall_ms"] = figures["max_stall_ms_checkpoint_1s"]
    figures["bytes_written"] = int(np.median(chk["bytes"]))
    figures["bytes_per_checkpoint"] = figures["bytes_written"]
    figures.update(split_by_full_copies(chk, samples))
    changed = changed_rows(chk["counted"], keys)
    figures["changed_rows_per_interval"] = round(float(np.median(changed))) if changed else None
    lead = chk.get("lead_in")
    if lead is not None:  # what the window leaves out: the first checkpoints, the first of them a catch-up
        _, p99, _ = sink_figures(lead, samples)
        figures["lead_in_s"] = round((lead["span"][1] - lead["span"][0]) / 1e9, 1)
        figures["lead_in_checkpoint_ms"] = [round(float(d), 1) for d in lead["durations_ms"]]
        figures["lead_in_bytes"] = [int(n) for n in lead["bytes"]]
        figures["latency_p99_ms_lead_in"] = round(p99, 2)
    return figures


def run(keys: int, args: argparse.Namespace, window_s: float,
        tmp: str) -> tuple[Any, float, Any, np.ndarray, int]:
    """Warm up, then run the windows; returns (warm state, offered rate, windows, sink samples, bytes of the
    warm-up's full checkpoint)."""
    print(f"warming up: {keys:,} keys, unthrottled ...", flush=True)
    warm_s = args.warm_up if args.warm_up is not None else 2.0 if args.quick else 5.0
    warm = warm_up(keys, args.batch_size, os.path.join(tmp, "warm"), min_s=warm_s, num_hosts=args.num_hosts)
    rate = args.load * warm.capacity
    full_bytes = state_bytes(os.path.dirname(warm.path), int(os.path.basename(warm.path).split("-")[1]))
    print(f"  {warm.keys_held:,} keys held after {warm.seconds:.1f} s; capacity {warm.capacity:,.0f} "
          f"records/s; offering {rate:,.0f} records/s ({args.load:.0%})", flush=True)
    root = os.path.join(tmp, "run")
    job = build("checkpoint", rate, keys, args.batch_size).submit(restore_from=warm.path, checkpoint_dir=root,
                                                                  num_hosts=args.num_hosts)
    try:
        kept: list[np.ndarray] = []  # the sink's samples that the waits took
        settled_s = settle(job, kept, args.settle if args.settle is not None else 2.0 if args.quick else 4.0,
                           lambda: durable_in(root))
        lead_in_s = args.lead_in if args.lead_in is not None else 2.0 if args.quick else LEAD_IN_S
        windows = run_windows(job, Schedule(job, rate), root, window_s, lambda: settle(job, kept, 0.0), lead_in_s)
        windows[0]["settle_s"] = round(settled_s, 1)
        samples = np.concatenate(kept + [job.run_control(TakeLatency()).result(timeout=60)])
        windows[-1]["memory"] = memory_figures(job)
        pids = host_pids(job)
    finally:
        job.cancel()
    exited_s = wait_exited(pids)
    windows[-1]["recovery"] = {**recovery(os.path.join(root, f"chk-{windows[1]['last_id']:06d}"), rate, keys, args,
                                          tmp), "exit_before_recovery_s": round(exited_s, 2)}
    return warm, rate, windows, samples, full_bytes


CAUGHT_UP_MS = 100.0
"""The restored job is caught up once no batch of the last ``PROBE_S`` reached the sink later than this."""

PROBE_S = 0.5


def durable_in(root: str) -> bool:
    """Whether a checkpoint in ``root`` is durable (its manifest is written)."""
    return any(os.path.exists(os.path.join(root, name, "_MANIFEST.json"))
               for name in (os.listdir(root) if os.path.isdir(root) else ()))


def settle(job: Any, kept: list[np.ndarray], min_s: float, ready: Callable[[], bool] = lambda: True,
           timeout_s: float = 60.0) -> float:
    """Wait until the job is steady, so that a window without checkpoints measures a quiet job: at least
    ``min_s``, then until ``ready()`` and two probes in a row find every batch of the last ``PROBE_S`` at the
    sink within ``CAUGHT_UP_MS`` of its ingestion time. The probes take the sink's samples; they go to
    ``kept``. Returns the seconds waited.

    Before the first window, ``ready`` waits for the checkpoint that a restore takes of its own (every bin
    whole). At 8M keys a fixed 4 s was too short: the first window worked off the backlog that loading the
    state left, 2-3 % above the offered rate, with a latency p99 of 150-470 ms. Before the later windows, the
    backlog check alone (``Schedule.wait_caught_up``, 0.1 s) let the repeat window start with up to 0.1 s of
    backlog: 1 % above the offered rate, with a latency p99 of 74-175 ms."""
    started = time.perf_counter()
    time.sleep(min_s)
    steady = 0
    while steady < 2 and time.perf_counter() - started < min_s + timeout_s:
        time.sleep(PROBE_S)
        samples = job.run_control(TakeLatency()).result(timeout=60)
        kept.append(samples)
        recent = samples[samples[:, 0] >= time.time_ns() - int(PROBE_S * 1e9)] if len(samples) else samples
        caught_up = len(recent) > 0 and recent[:, 1].max() <= CAUGHT_UP_MS * 1e6
        steady = steady + 1 if caught_up and ready() else 0
    waited = time.perf_counter() - started
    print(f"  steady after {waited:.1f} s" + ("" if steady >= 2 else " (gave up waiting: not caught up)"),
          flush=True)
    return waited


def recovery(checkpoint: str, rate: float, keys: int, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """Restore the last checkpoint of the window of checkpoints (per bin a full copy and its changes since)
    into a new job, as a recovery does: ``recovery_s`` from ``submit()`` until the count takes in records
    again (its hosts started, each loading the bins it owns, in parallel), and the keys it then holds."""
    print(f"recovering from {os.path.basename(checkpoint)} ...", flush=True)
    started = time.perf_counter()
    job = build("checkpoint-recovery", rate, keys, args.batch_size).submit(
        restore_from=checkpoint, checkpoint_dir=os.path.join(tmp, "recovered"), num_hosts=args.num_hosts)
    try:
        submitted = time.perf_counter() - started
        deadline = started + 300
        while not counted(job) and time.perf_counter() < deadline:
            time.sleep(0.02)
        recovered = time.perf_counter() - started
        held = int(job.metrics().operators["count"].get("keys", 0))
    finally:
        job.cancel()
    print(f"  running again after {recovered:.2f} s (submit() returned after {submitted:.2f} s), "
          f"{held:,} keys held", flush=True)
    return {"recovery_s": round(recovered, 2), "recovery_submit_s": round(submitted, 2), "recovered_keys": held}


def targets(figures: dict[str, Any], full_bytes: int, keys_held: int, recovered: dict[str, Any]) -> dict[str, bool]:
    """Which of the targets in the module's docstring the figures meet."""
    quiet = max(figures["latency_p99_ms_no_checkpoint"], figures["latency_p99_ms_no_checkpoint_repeat"])
    changed = figures["changed_rows_per_interval"] or 0
    return {"throughput": figures["throughput_ratio_checkpoint_1s"] >= 0.95,
            "latency_p99": figures["latency_p99_ms_checkpoint_1s"] <= 2 * quiet,
            "bytes": figures["bytes_per_checkpoint"] <= 1.5 * changed * full_bytes / max(keys_held, 1),
            "recovery": recovered["recovery_s"] <= 5 and recovered["recovered_keys"] >= keys_held}


def host_pids(job: Any) -> list[int]:
    """The process ids of the job's hosts."""
    import ray

    return ray.get([h.pid.remote() for h in job.topology.hosts()])


def wait_exited(pids: list[int], timeout_s: float = 30.0) -> float:
    """Wait until the processes ``pids`` (a cancelled job's hosts) have exited; returns the seconds waited.

    ``cancel()`` returns once it has asked Ray to kill them. A host holding 8M keys took 0.1-1 s more to
    exit here, and a restore started at once shared the two cores with those exits: its ``recovery_s``
    measured 0.5 s more (5.45-5.75 s against 4.90-5.05 s)."""
    import psutil

    started = time.perf_counter()
    while any(psutil.pid_exists(p) for p in pids) and time.perf_counter() - started < timeout_s:
        time.sleep(0.01)
    return time.perf_counter() - started


def memory_figures(job: Any) -> dict[str, Any]:
    """The count's state bytes per key held, and the job's host processes' RSS (in all, per million keys)."""
    import psutil

    count = job.metrics().operators["count"]
    held = max(int(count.get("keys", 0)), 1)
    rss = 0
    for pid in host_pids(job):
        try:
            rss += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return {"state_bytes_per_key": round(count.get("state_memory_bytes", 0) / held, 1),
            "job_rss_mb": round(rss / 2**20, 1), "rss_mb_per_million_keys": round(rss / 2**20 / (held / 1e6), 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 keys (unless --keys), 4 s windows")
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default 1,000,000)")
    parser.add_argument("--window", type=float, default=None, help="seconds per window (default 10, quick 4)")
    parser.add_argument("--load", type=float, default=0.65, help="offered rate as a fraction of capacity")
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--warm-up", type=float, default=None, metavar="S",
                        help="seconds the unthrottled warm-up runs at least, measuring the capacity "
                             "(default 5, quick 2; it also runs until 99%% of the keys are held)")
    parser.add_argument("--settle", type=float, default=None, metavar="S",
                        help="seconds the restored job runs before the first window (default 4, quick 2)")
    parser.add_argument("--lead-in", type=float, default=None, metavar="S",
                        help="seconds of checkpoints, one a second, before the window of checkpoints is "
                             "measured (default 3, quick 2; 0: none)")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N",
                        help="host processes of each job (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    keys = args.keys or (200_000 if args.quick else 1_000_000)
    window_s = args.window or (4.0 if args.quick else 10.0)
    started, load_at_start = time.perf_counter(), loadavg()
    tmp = tempfile.mkdtemp(prefix="chiray-bench-checkpoint-")
    started_ray = start_ray()

    try:
        warm, rate, windows, samples, full_bytes = run(keys, args, window_s, tmp)
    finally:
        stop_ray(started_ray)
        shutil.rmtree(tmp, ignore_errors=True)
    figures = summarise(windows, samples, keys)
    emit({
        "benchmark": "checkpoint", "quick": args.quick, "keys": keys, "keys_held": warm.keys_held,
        "window_s": window_s, "batch_size": args.batch_size, "parallelism": PARALLELISM,
        "num_hosts": args.num_hosts,
        "capacity_records_per_s": round(warm.capacity), "offered_records_per_s": round(rate),
        "load": args.load, **figures, "full_bytes": full_bytes, **windows[-1]["memory"], **windows[-1]["recovery"],
        "targets_met": targets(figures, full_bytes, warm.keys_held, windows[-1]["recovery"]),
        "loadavg_1m_at_start": load_at_start, "loadavg_1m_at_end": loadavg(),
        "wall_s": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    main()
