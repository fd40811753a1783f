"""recovery.py: how long a keyed count takes to recover from the loss of a stateful host, and what it replays.

Pipeline (``benchmarks.measure.build``): ``generate`` (2 instances, string
keys, open loop at a fixed offered rate, ``--rate``, default 200,000
records/s: 40-65 % of this pipeline's capacity on a 2-core machine) ->
``key_by("key")`` -> ``agg(count, max(ts), emit="updates")`` (2 instances;
instance ``i`` on host ``i``) -> one sink. For each state size (100,000 and
1,000,000 keys) the job checkpoints every second
(``checkpoint_interval_s=1``) and checks its hosts every 0.2 s
(``poll_interval_s``). It runs at the offered rate until its state holds
~99 % of the keys (4.6 x keys records), it has committed a checkpoint and
a few seconds have passed; then its steady rate is measured and host 0
(count instance 0) is killed (``ray.kill(..., no_restart=True)``). The
supervisor rolls the whole job back: kills every host, starts new ones,
restores the last checkpoint's state and seeks the sources to its offsets.
The state is filled by the measured job itself, not restored from a warm-up
checkpoint: a job that was itself restored reports stale offsets for splits
its instances do not read, which a second restore applies (see
``records_replayed_per_split``).

Measured, polling ``job.statistics()`` every 0.25 s (it raises while hosts
are dead; counters restart with the new hosts): the time from the kill to
the end of the first window in which the count operator takes in >= 90 % of
the pre-kill steady rate (``recovery_s_<size>``; the rate measured over the
last seconds before the kill, capped at the offered rate, since a job still
working off its start-up backlog runs above it); its breakdown from the job's
events, ``detect_s`` (kill to the "recovering" event, seen by polling
every 0.05 s), ``restart_s`` (the supervisor's own figure: killing,
starting and restoring the hosts) and ``resume_s`` (the rest: hosts running
again until the rate is back); and ``records_replayed``: records the sources
had emitted at the kill minus those covered by the restored checkpoint's
source offsets as the restore reads them (``generate`` offsets count
batches per split), and ``records_replayed_per_split``, the same against each
split's largest offset in the manifest (equal unless stale offsets are
restored). The sources' pacing restarts when they reopen, so recovery does
not catch up on the input offered while the job was down.

Targets: <= 5 s at 100,000 keys and <= 10 s at 1,000,000 keys. Expected on a
2-core machine: detection 0.05-0.25 s (a peer's failed call or the 0.2 s
ping); restart 3-4 s at 100,000 keys and ~5.5 s at 1,000,000, mostly Ray
starting four new host processes (2-3.5 s alone on a loaded machine), plus
reading and installing the state (~3 MB and ~36 MB); then ~0.3-0.8 s until
a full window at the offered rate: recovery ~3.5-4.5 s and ~6.5 s. Replay:
the input since the restored checkpoint's barrier, 60,000-100,000 records
at 100,000 keys and ~235,000 at 1,000,000 (a checkpoint there takes ~1 s,
so the last committed one is older).

Run: ``python -m benchmarks.recovery [--quick] [--sizes 100000,1000000] [--rate R] [--fill S]
[--steady-window S]``.
``--quick`` (under a minute): 100,000 keys only (the JSON says what it skipped).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import tempfile
import time
from typing import Any

import ray

from chiray.actors.runtime.storage import MANIFEST, CheckpointStorage
from benchmarks.common import stop_ray, emit, start_ray
from benchmarks.measure import build, counted, loadavg, size_label, source_records

SIZES = (100_000, 1_000_000)
POLL_S = 0.25  # rate windows
EVENTS_POLL_S = 0.05  # job events, until the recovery is seen
RECOVERED = re.compile(r"recovered from checkpoint (\d+) in ([0-9.]+) s")


def committed(root: str) -> bool:
    """Whether a checkpoint under the local directory ``root`` has its manifest (quietly, unlike storage)."""
    names = os.listdir(root) if os.path.isdir(root) else []
    return any(os.path.exists(os.path.join(root, n, MANIFEST)) for n in names if n.startswith("chk-"))


def wait_steady(job: Any, root: str, keys: int, min_s: float, measure_s: float,
                timeout_s: float = 300.0) -> float:
    """Wait ``min_s``, until the state holds ~99 % of ``keys`` and a checkpoint is committed; return the rate.

    The rate (records/s into the count operator) is measured over a further ``measure_s``.
    """
    needed = math.ceil(-keys * math.log(0.01))  # uniform keys: 99 % of them seen
    t0 = time.perf_counter()
    while (time.perf_counter() - t0 < min_s or (counted(job) or 0) < needed or not committed(root)):
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"recovery: no steady state with {keys:,} keys after {timeout_s} s")
        time.sleep(0.25)
    n0, t0 = job.statistics().records_in("count"), time.perf_counter()
    time.sleep(measure_s)
    return (job.statistics().records_in("count") - n0) / (time.perf_counter() - t0)


class Watch:
    """Polls a job after the kill: per-window rate into the count operator and the recovery events."""

    def __init__(self, job: Any, root: str, t_kill: float):
        self.job, self.storage, self.t_kill = job, CheckpointStorage(root), t_kill
        self.host0 = job.actors[0]
        self.prev: tuple[float, int] | None = None  # (time, count) of the last good poll
        self.last_poll = t_kill
        self.detect_s: float | None = None
        self.restored: tuple[int, float] | None = None  # (checkpoint id, restart seconds)
        self.manifest: dict[str, Any] | None = None

    def poll_events(self, now: float) -> None:
        try:
            events = self.job.status().events
        except Exception:
            return
        if self.detect_s is None and any(e.startswith("recovering") for e in events):
            self.detect_s = now - self.t_kill
        if self.restored is None:
            match = next((m for e in events if (m := RECOVERED.search(e))), None)
            if match:
                self.restored = (int(match.group(1)), float(match.group(2)))
                self.manifest = self.storage.load(self.restored[0])  # before retention deletes it

    def window_rate(self, now: float) -> float | None:
        """Records/s since the last poll; None when unknown (hosts dead, or this is the first sample)."""
        host0, last_poll, self.last_poll = self.job.actors[0], self.last_poll, now
        n = counted(self.job)
        if n is None:
            return None
        if host0 is not self.host0:  # new hosts: their counters started at 0, after the last poll
            self.host0 = host0
            self.prev = (last_poll, 0)
        rate = None if self.prev is None else (n - self.prev[1]) / (now - self.prev[0])
        self.prev = (now, n)
        return rate


def kill_and_watch(job: Any, root: str, reference: float, batch_size: int,
                   timeout_s: float) -> dict[str, Any]:
    """Kill host 0; return the recovery time (rate back at >= 90 % of ``reference``) and the rest."""
    emitted = job.statistics().records_out("source")
    t_kill = time.perf_counter()
    ray.kill(job.actors[0], no_restart=True)
    watch = Watch(job, root, t_kill)
    recovery_s = None
    next_rate = t_kill + POLL_S
    while time.perf_counter() - t_kill < timeout_s:
        time.sleep(EVENTS_POLL_S)
        now = time.perf_counter()
        if watch.restored is None:
            watch.poll_events(now)
        if now < next_rate:
            continue
        next_rate = now + POLL_S
        rate = watch.window_rate(now)
        if rate is not None and watch.restored is not None and rate >= 0.9 * reference:
            recovery_s = now - t_kill
            break
    out: dict[str, Any] = {"recovery_s": recovery_s, "detect_s": watch.detect_s,
                           "restart_s": watch.restored[1] if watch.restored else None,
                           "restored_checkpoint": watch.restored[0] if watch.restored else None,
                           "records_replayed": None, "records_replayed_per_split": None}
    if watch.manifest is not None:
        restored, per_split = source_records(watch.manifest, batch_size)
        out["records_replayed"], out["records_replayed_per_split"] = emitted - restored, emitted - per_split
    if recovery_s is not None and watch.detect_s is not None and watch.restored is not None:
        out["resume_s"] = recovery_s - watch.detect_s - watch.restored[1]
    return out


def run_size(keys: int, rate: float, batch_size: int, tmp: str, min_s: float, measure_s: float,
             num_hosts: int | None = None) -> dict[str, Any]:
    """One state size: warm up at the offered rate, kill host 0, watch the recovery."""
    print(f"{keys:,} keys at {rate:,.0f} records/s: filling the state ...", flush=True)
    root = os.path.join(tmp, f"run-{keys}")
    job = build("recovery", rate, keys, batch_size).submit(
        checkpoint_dir=root, checkpoint_interval_s=1.0, poll_interval_s=0.2, checkpoints_to_keep=10,
        num_hosts=num_hosts)
    try:
        t0 = time.perf_counter()
        steady = wait_steady(job, root, keys, min_s=min_s, measure_s=measure_s)
        keys_held = int(job.metrics().operators["count"]["keys"])
        print(f"  after {time.perf_counter() - t0:.1f} s: {keys_held:,} keys held, steady {steady:,.0f} "
              f"records/s; killing host 0 ...", flush=True)
        # A job still working off its start-up backlog runs above the offered rate: cap the reference there.
        result = kill_and_watch(job, root, min(steady, rate), batch_size, timeout_s=60.0)
        events = job.status().events
    finally:
        job.cancel()
    print(f"  back at >= 90 % after {result['recovery_s']} s; events: {list(events)}", flush=True)
    return {"keys_held": keys_held, "steady": steady, **result}


def summarise(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The JSON figures: per size recovery time against its target, breakdown, records replayed."""
    figures: dict[str, Any] = {
        "benchmark": "recovery", "quick": args.quick, "sizes": list(results),
        "skipped_sizes": [s for s in SIZES if s not in results], "batch_size": args.batch_size,
        "offered_records_per_s": round(args.rate), "poll_interval_s": 0.2, "checkpoint_interval_s": 1.0,
        "num_hosts": args.num_hosts}
    for keys, target_s in ((100_000, 5.0), (1_000_000, 10.0)):
        r, label = results.get(keys), size_label(keys)
        seconds = None if r is None else r["recovery_s"]
        figures[f"recovery_s_{label}"] = None if seconds is None else round(seconds, 2)
        if r is not None:
            figures[f"target_{label}_met"] = seconds is not None and seconds <= target_s
    figures["records_replayed"] = {size_label(k): r["records_replayed"] for k, r in results.items()}
    figures["records_replayed_per_split"] = {size_label(k): r["records_replayed_per_split"]
                                             for k, r in results.items()}
    for keys, r in results.items():
        label = size_label(keys)
        for name in ("detect_s", "restart_s", "resume_s"):
            value = r.get(name)
            figures[f"{name}_{label}"] = None if value is None else round(value, 2)
        figures[f"restored_checkpoint_{label}"] = r["restored_checkpoint"]
        figures[f"keys_held_{label}"] = r["keys_held"]
        figures[f"steady_records_per_s_{label}"] = round(r["steady"])
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 keys only")
    parser.add_argument("--sizes", default=None, help="comma-separated key counts (default 100000,1000000)")
    parser.add_argument("--rate", type=float, default=200_000, help="offered records/s (default 200,000)")
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--fill", type=float, default=None, metavar="S",
                        help="seconds the job runs at least before its steady rate is measured (default 5, "
                             "quick 3; it also runs until 99%% of the keys are held and a checkpoint is committed)")
    parser.add_argument("--steady-window", type=float, default=None, metavar="S",
                        help="seconds over which the steady rate before the kill is measured (default 5, quick 3)")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N",
                        help="host processes of each job (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    default = SIZES[:1] if args.quick else SIZES
    fill_s = args.fill if args.fill is not None else 3.0 if args.quick else 5.0
    window_s = args.steady_window if args.steady_window is not None else 3.0 if args.quick else 5.0
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(default)
    started, load_at_start = time.perf_counter(), loadavg()
    tmp = tempfile.mkdtemp(prefix="chiray-bench-recovery-")
    started_ray = start_ray()
    results = {}
    try:
        for keys in sizes:
            results[keys] = run_size(keys, args.rate, args.batch_size, tmp, fill_s, window_s, args.num_hosts)
    finally:
        stop_ray(started_ray)
        shutil.rmtree(tmp, ignore_errors=True)
    emit({**summarise(results, args), "loadavg_1m_at_start": load_at_start, "loadavg_1m_at_end": loadavg(),
          "wall_s": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
