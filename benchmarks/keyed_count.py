"""keyed_count.py: throughput of a keyed count + sum, against a single-process pyarrow group-by and Bytewax.

Pipeline: ``from_arrow`` source (parallelism 1) -> ``key_by("key")`` ->
``agg(count, sum)`` (parallelism 2) -> ``collect``. ``--op`` computes the count and sum another way
(``benchmarks/peers/ops.py``): a Python ``process`` function per key, ``process_batch`` over whole
batches, a per-record ``reduce``, or per-record ``map_records`` and ``filter_records`` before the
``agg``. ``--peers`` also runs the same records through Bytewax 0.21's ``stateful_map`` in the same run
(in a virtualenv of its own, made on first use: ``benchmarks/peers/__init__.py``) and reports
``bytewax_records_per_s`` and ``ratio_to_bytewax``. The records are generated
before timing (100,000 distinct string keys by default, uniform or Zipf) and
shipped with the job, so the timed part is the dataflow from the moment its
hosts are running until the result is final. The same batches are then
aggregated by ``pyarrow.Table.group_by`` in this process as the reference,
and the result is checked against pandas.

Expected on a 2-core machine: a few million records/s, ratio >= 0.12.

Run: ``python -m benchmarks.keyed_count [--quick] [--dist uniform|zipf] [--records N]
[--op agg|process|process_batch|reduce|map_records] [--peers]``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import pyarrow as pa

from benchmarks.common import RssSampler, emit, start_ray
from benchmarks.peers.ops import OPS, final_counts


def make_batches(records: int, keys: int, dist: str, batch_size: int, seed: int) -> list[pa.RecordBatch]:
    from chiray.operators import generate

    source = generate(records, num_keys=keys, dist=dist, batch_size=batch_size, seed=seed)
    out = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:
            out.append(batch.select(["key", "value"]))
    return out


def reference(batches: list[pa.RecordBatch], repeats: int = 3) -> float:
    """Best of ``repeats`` single-threaded pyarrow group-bys over the same batches (seconds)."""
    table = pa.Table.from_batches(batches)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        # One thread: the single-core figure the targets were set against.
        table.group_by("key", use_threads=False).aggregate([("value", "count"), ("value", "sum")])
        best = min(best, time.perf_counter() - t0)
    return best


def run_job(batches: list[pa.RecordBatch], parallelism: int, num_hosts: int | None = None,
            op: str = "agg") -> tuple[pa.Table, float, dict[str, Any]]:
    """Run the job; returns its result, the seconds it ran and its memory: ``peak_rss_mb`` (hosts),
    ``job_rss_mb`` (the job's own processes: hosts, and the controller where it has a process of its
    own), ``hosts`` and ``processes``."""
    import ray

    from benchmarks.peers.ops import count_flow

    job = count_flow(batches, parallelism, op).submit(num_hosts=num_hosts)
    hosts = ray.get([h.pid.remote() for h in job.topology.hosts()])
    processes = ray.get([a.pid.remote() for a in job.actors])  # hosts, and a controller of its own if any
    with RssSampler(hosts) as rss, RssSampler(processes) as job_rss:
        t0 = time.perf_counter()
        job.wait()
        elapsed = time.perf_counter() - t0
    for s in job.statistics().instances:
        print(f"    {s.operator}[{s.index}] on host {s.host}: busy {s.busy_s:.2f} s, "
              f"back-pressured {s.backpressured_s:.2f} s, {s.records_in:,} records in")
    return final_counts(job.result(), op), elapsed, {"peak_rss_mb": rss.peak_mb, "job_rss_mb": job_rss.peak_mb,
                                   "hosts": len(hosts), "processes": len(processes)}


def state_bytes_per_key(keys: int) -> dict[str, float]:
    """Bytes per key the count-and-sum state holds in memory (columns with spare capacity, key index),
    for ``keys`` string keys (as the job's) and as many integer keys, measured in this process."""
    import numpy as np

    from chiray.operators.keyed import AggregateLogic, AggSpec

    out = {}
    for kind, column in (("string", pa.array([f"key-{i}" for i in range(keys)])),
                         ("int64", pa.array(np.arange(keys, dtype=np.int64) * 7919))):
        logic = AggregateLogic("key", [AggSpec("count", "count"), AggSpec("total", "sum", "value")], 1024)
        logic.process(pa.record_batch({"key": column, "value": np.ones(keys, dtype=np.int64)}), 0)
        out[kind] = round(logic.state.memory_nbytes() / keys, 1)
    return out


def check(result: pa.Table, batches: list[pa.RecordBatch]) -> None:
    df = pa.Table.from_batches(batches).to_pandas()
    expected = df.groupby("key")["value"].agg(count="size", total="sum").sort_index()
    got = result.to_pandas().set_index("key").sort_index()
    if not (got.index.equals(expected.index) and (got.values == expected.values).all()):
        raise SystemExit("keyed_count: result differs from pandas")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--dist", choices=["uniform", "zipf"], default="uniform")
    parser.add_argument("--batch-size", type=int, default=200_000,
                        help="rows per source batch (each of the 2 routed parts is then ~2 MB)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="1,000,000 records")
    parser.add_argument("--op", default="agg",
                        help=f"how the count and sum are computed: one of {', '.join(OPS)}, or several comma-separated "
                             "(each runs in turn; ops_per_s in the JSON gives each one's records/s)")
    parser.add_argument("--peers", action="store_true",
                        help="also run Bytewax's stateful_map on the same records (same run)")
    parser.add_argument("--bytewax-processes", default="1,2",
                        help="Bytewax layouts to run with --peers (processes, comma-separated; the best counts)")
    parser.add_argument("--num-hosts", type=int, default=None,
                        help="host processes (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    ops = args.op.split(",")
    if any(op not in OPS for op in ops):
        parser.error(f"--op takes {', '.join(OPS)} (comma-separated), got {args.op!r}")
    load = os.getloadavg()[0]  # the machine is shared: what else ran as this run started
    records = 1_000_000 if args.quick else args.records
    print(f"generating {records:,} records, {args.keys:,} keys ({args.dist}) ...", flush=True)
    batches = make_batches(records, args.keys, args.dist, args.batch_size, seed=1)
    ref_elapsed = reference(batches)  # before Ray starts, so nothing else competes for the cores
    print(f"  reference pyarrow group_by (1 thread, best of 3): {records / ref_elapsed / 1e6:.2f} M records/s",
          flush=True)
    peers: dict[str, Any] = {}
    if args.peers:
        from benchmarks.peers import run_bytewax

        layouts = [int(p) for p in args.bytewax_processes.split(",")]
        peers = run_bytewax(batches, layouts, lambda result: check(result, batches), args.batch_size)
    start_ray()
    rates: dict[str, int] = {}
    for op in ops:
        print(f"running the dataflow ({op}) ...", flush=True)
        result, elapsed, memory = run_job(batches, args.parallelism, args.num_hosts, op)
        print(f"  {records / elapsed / 1e6:.2f} M records/s ({elapsed:.2f} s)", flush=True)
        check(result, batches)
        print("  result matches pandas", flush=True)
        rates[op] = round(records / elapsed)
        if peers:
            print(f"  {rates[op] / peers['bytewax_records_per_s']:.2f}x Bytewax's best", flush=True)
    if peers:
        peers["ratio_to_bytewax"] = {op: round(rate / peers["bytewax_records_per_s"], 2) for op, rate in rates.items()}
    emit({
        "benchmark": "keyed_count", "op": args.op, "ops_per_s": rates, "records": records, "keys": args.keys, "dist": args.dist,
        "parallelism": args.parallelism, "load_average_1m": round(load, 2), "records_per_s": round(records / elapsed),
        "reference_records_per_s": round(records / ref_elapsed),
        "ratio": round(ref_elapsed / elapsed, 3), "reference_threads": 1, **memory,
        "state_bytes_per_key": state_bytes_per_key(args.keys), **peers,
    })


if __name__ == "__main__":
    main()
