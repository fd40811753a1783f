"""control_scale.py: NoOp completion time against the number of sources, with control trees and flat.

Pipeline: ``generate`` source of N instances (N = 8, 64, 512, 2048; one split
each, almost idle: one record at start, then one per 100 s) -> ``key_by`` ->
``count(emit="updates")`` (2 instances) -> ``collect`` (1 instance), on 4
host actors (``--num-hosts``). So the data plane is idle and what is measured is the control
plane: a ``NoOp`` injected at N sources, forwarded to the count instances
(each aligns N inputs) and returned by the sink. Completion time is
``OpHandle.elapsed_s`` (at the controller, injection to the sink's return),
median of several ops run one after the other after a warm-up; blocking and
non-blocking ops alternate. Each N runs with broadcast trees
(``control_fanout``, default 8: the controller talks to at most 8 relays) and
flat (``control_fanout=None``: the controller injects at every source itself).

Target: tree completion at 2048 sources <= 3x that at 8. Expected on a
2-core machine: 15-25 ms at 8 sources, tree and flat alike; 50-75 ms at 2048
(about 3x; it was 100-170 ms, 4-6x, before control runs). A host now sends
one op from all its sources to each downstream instance as one message (a
``ControlRun``: one pickle, one Ray call, counted in one step there), its
sources take an injected op in one sweep and send it unwrapped on every
channel with nothing waiting for credit. Measured per op at 2048 sources:
13-23 ms of CPU per host, down from 29-56 ms. What remains per source is
small but not nothing: its injection, one control-processor step and one
run entry on each output (~10-15 us); and the re-checks of 2048 idle paced
sources (every 50 ms each, ~6 % of a core per host). On a shared machine
the figures move a lot with the load (``loadavg_1m_at_start``).

``--quick`` (about a minute) runs 8, 64 and 512 sources and says in the JSON
that it skipped 2048 (each 2048-source configuration must start and stop
2048 instances, which takes longer than its ops).

Run: ``python -m benchmarks.control_scale [--quick] [--sizes 8,64,...] [--fanout K] [--num-hosts N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from benchmarks.common import stop_ray, emit, start_ray

NUM_HOSTS = 4
SIZES = (8, 64, 512, 2048)


def build(num_sources: int) -> Any:
    from chiray.operators import Dataflow, generate

    flow = Dataflow(f"control_scale_{num_sources}")
    idle = generate(None, rate=0.01 * num_sources, batch_size=1, num_keys=64, key_type="int",
                    num_splits=num_sources)
    (flow.source(idle, parallelism=num_sources, name="source")
         .key_by("key")
         .count(parallelism=2, emit="updates", name="count")
         .collect(name="sink"))
    return flow


def measure(num_sources: int, fanout: int | None, warmup: int, ops: int,
            num_hosts: int = NUM_HOSTS) -> dict[str, Any]:
    """Median completion (ms) of blocking and non-blocking NoOps on a fresh job."""
    from chiray.actors import JobConfig
    from chiray.control.ops.noop import NoOp

    config = JobConfig(num_hosts=num_hosts, control_fanout=fanout, host_num_cpus=0.25)
    t0 = time.perf_counter()
    job = build(num_sources).submit(config=config)
    submit_s = time.perf_counter() - t0
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for i in range(warmup + 2 * ops):
            blocking = i % 2 == 0
            handle = job.run_control(NoOp(blocking=blocking))
            if handle.result(timeout=120) != 1:
                raise SystemExit(f"control_scale: NoOp returned by {handle.result()} sinks, expected 1")
            if i >= warmup:
                times[blocking].append(handle.elapsed_s * 1e3)
    finally:
        job.cancel()
    return {"submit_s": submit_s, "blocking_ms": statistics.median(times[True]),
            "nonblocking_ms": statistics.median(times[False]),
            "blocking_max_ms": max(times[True])}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer ops per configuration")
    parser.add_argument("--sizes", default=None, help="numbers of sources, comma-separated "
                        "(default 8,64,512,2048; quick 8,64,512)")
    parser.add_argument("--fanout", type=int, default=8, help="control tree fan-out")
    parser.add_argument("--ops", type=int, default=None, help="measured ops per kind (default 9, quick 3)")
    parser.add_argument("--num-hosts", type=int, default=NUM_HOSTS, metavar="N",
                        help=f"host actors of each job (default {NUM_HOSTS}; each is a process to start)")
    args = parser.parse_args(argv)
    if args.num_hosts < 1:
        parser.error("--num-hosts must be at least 1")
    default = SIZES[:-1] if args.quick else SIZES
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(default)
    skipped = [n for n in SIZES if n not in sizes]
    ops = args.ops or (3 if args.quick else 9)
    warmup = 1 if args.quick else 2
    started = time.perf_counter()
    load = os.getloadavg()[0]
    started_ray = start_ray()

    figures: dict[str, Any] = {}
    print(f"{'sources':>7} {'tree':>6} {'blocking ms':>12} {'non-blocking ms':>16} {'max ms':>8} "
          f"{'submit s':>9}")
    try:
        for n in sizes:
            for label, fanout in (("tree", args.fanout), ("flat", None)):
                r = measure(n, fanout, warmup, ops, args.num_hosts)
                print(f"{n:>7} {label:>6} {r['blocking_ms']:>12.1f} {r['nonblocking_ms']:>16.1f} "
                      f"{r['blocking_max_ms']:>8.1f} {r['submit_s']:>9.1f}", flush=True)
                figures[f"{label}_completion_ms_{n}"] = round(r["blocking_ms"], 2)
                figures[f"{label}_nonblocking_completion_ms_{n}"] = round(r["nonblocking_ms"], 2)
                figures[f"{label}_submit_s_{n}"] = round(r["submit_s"], 2)
    finally:
        stop_ray(started_ray)
    for n in skipped:
        for label in ("tree", "flat"):
            figures[f"{label}_completion_ms_{n}"] = None
    lo, hi = min(sizes), max(sizes)
    ratios = {f"{label}_{n}_over_{lo}": round(figures[f"{label}_completion_ms_{n}"]
                                               / figures[f"{label}_completion_ms_{lo}"], 2)
              if figures.get(f"{label}_completion_ms_{n}") else None
              for n in sorted({hi, *SIZES} - {lo}) for label in ("tree", "flat")}
    target = ratios.get(f"tree_2048_over_{lo}")
    emit({
        "benchmark": "control_scale", "quick": args.quick, "sizes": sizes, "skipped_sizes": skipped,
        "skipped_why": None if not skipped else (
            "quick: a 2048-source configuration alone takes over a minute"
            if args.quick and not args.sizes else "not in --sizes"),
        "fanout": args.fanout, "num_hosts": args.num_hosts, "ops_per_kind": ops,
        "completion": "median blocking NoOp, ms (non-blocking: *_nonblocking_*)",
        **figures, **ratios,
        "target_tree_ratio_met": None if target is None else target <= 3.0,
        "loadavg_1m_at_start": round(load, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    main()
