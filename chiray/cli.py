"""cli.py: the ``chiray`` command line (also ``python -m chiray``): ``chiray demo`` runs the main job on an embedded Ray.

The verbs that operate detached jobs on a cluster (``list``, ``status``,
``metrics``, ``rescale``, ``rescales``, ``checkpoint``, ``savepoint``,
``savepoints``, ``stop``, ``cancel``, ``logs``, ``forget``, ...) are in
``chiray/cli_jobs.py``. ``chiray --version`` prints the versions of chiray,
Ray, pyarrow and Python (``--version --json``: as one JSON document).

``demo`` is the full pipeline (``chiray.spark_bridge.demo``): Spark reads and
preprocesses real text files, its executors push the words into a keyed
count on Ray, which is rescaled live and checkpointed mid-run, and the result
is checked against Spark SQL.

``demo --generated`` is the Ray-only job: it counts records per key (and sums
a value) over a generated, deterministic stream (paced at ``--rate``), shows
a progress bar with the rate, rescales the count live from ``--parallelism``
to one more instance, takes an aligned checkpoint mid-run, and checks the
result against pandas over the same records.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import platform
import os
import sys
import time
from typing import Sequence

from chiray.cli_jobs import VERBS, add_job_verbs, run_verb
from chiray.progress import Progress

__all__ = ["build_parser", "main"]


def _progress(done: int, total: int, rate: float, width: int = 30) -> tuple[str, str]:
    """The demo's bar and its state, each tenth of the records (a log gets a line per tenth)."""
    filled = int(width * done / total) if total else width
    return (f"  [{'#' * filled}{'.' * (width - filled)}] {done:>12,}/{total:,} records"
            f"  {rate / 1e6:6.2f} M records/s"), f"{10 * done // max(total, 1)}/10"


def _oracle(source, num_records: int):
    """The same records read straight from the source's splits, aggregated by pandas."""
    import pyarrow as pa

    tables = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:
            tables.append(pa.Table.from_batches([batch]).select(["key", "value"]))
    df = pa.concat_tables(tables).to_pandas()
    assert len(df) == num_records, f"bug in demo: oracle saw {len(df)} records"
    return df.groupby("key").agg(count=("value", "size"), total=("value", "sum"))


def demo(args: argparse.Namespace) -> int:
    import ray

    from chiray.operators import Dataflow, collect, generate

    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    print(f"chiray demo: keyed count + sum over {args.records:,} generated records, "
          f"{args.keys:,} keys ({args.dist}), parallelism {args.parallelism}")
    if not ray.is_initialized():
        # An embedded Ray gets room for the host that the live rescale adds (hosts ask for 0.5 CPU).
        num_cpus = max(4, os.cpu_count() or 1) if args.address is None else None
        ray.init(address=args.address, num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR)
    source = generate(args.records, num_keys=args.keys, dist=args.dist, batch_size=50_000,
                      seed=args.seed, num_splits=args.parallelism, rate=args.rate)
    flow = Dataflow("demo")
    (flow.source(source, parallelism=args.parallelism, name="events")
         .key_by("key")
         .agg(count=(None, "count"), total=("value", "sum"), parallelism=args.parallelism, name="count")
         .sink(collect(), name="out"))
    start = time.perf_counter()
    job = flow.submit(spare_hosts=1)  # the live rescale takes a host started with the job
    print(f"  deployed in {time.perf_counter() - start:.1f} s; running")
    t0 = time.perf_counter()
    checkpointed = None
    rescale = None
    shown = Progress()
    while True:
        try:
            job.wait(timeout=0.5)
            break
        except TimeoutError:
            done = job.statistics().records_in("count")
            shown.update(*_progress(done, args.records, done / (time.perf_counter() - t0)))
            if rescale is None and done > args.records // 10:  # live, no record lost or counted twice
                rescale = job.rescale("count", args.parallelism + 1, strategy="non_disruptive", chunk_bins=64)
            if checkpointed is None and rescale is not None and rescale.done() and done > args.records // 3:
                c0 = time.perf_counter()
                checkpointed = (job.checkpoint(timeout=60), time.perf_counter() - c0)  # in-band, aligned
    elapsed = time.perf_counter() - t0
    shown.end(*_progress(args.records, args.records, args.records / elapsed))
    result = job.result().to_pandas().set_index("key").sort_index()
    expected = _oracle(source, args.records).sort_index()
    ok = result[["count", "total"]].astype("int64").equals(expected.astype("int64"))
    top = result.sort_values("count", ascending=False).head(5)
    print(f"  {len(result):,} keys, {args.records / elapsed / 1e6:.2f} M records/s end to end")
    if rescale is not None:
        try:
            moved = rescale.result(0)
            print(f"  rescaled 'count' live from {args.parallelism} to {args.parallelism + 1} instances "
                  f"({moved['strategy']}): {moved['bins_moved']} bins, {moved['bytes_moved'] / 2**20:.1f} MiB "
                  f"moved in {moved['elapsed_s']:.1f} s")
        except Exception as exc:  # e.g. the input ended first; the result is still checked below
            print(f"  rescale did not complete: {exc}")
    if checkpointed is not None:
        print(f"  checkpoint {checkpointed[0]} taken mid-run, without stopping the job, "
              f"in {checkpointed[1] * 1000:.0f} ms")
    print("  top keys:\n" + "\n".join(f"    {k:>10}  {int(r['count']):>8,}" for k, r in top.iterrows()))
    print(f"  check against pandas: {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def versions() -> dict[str, str]:
    """The versions of chiray and of what it runs on (read from the installed distributions, nothing imported)."""
    from chiray import __version__

    found = {"chiray": __version__}
    for dist in ("ray", "pyarrow"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return {**found, "python": platform.python_version()}


def build_parser() -> argparse.ArgumentParser:
    """The ``chiray`` command line's parser: ``demo`` and the job verbs (the docs' CLI reference is made from it)."""
    parser = argparse.ArgumentParser(prog="chiray", description="Stream processing on Ray.")
    parser.add_argument("--version", action="store_true", help="print the versions of chiray, Ray, pyarrow and "
                                                               "Python, and exit")
    parser.add_argument("--json", dest="version_json", action="store_true",
                        help="with --version: print them as one JSON document")
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("demo", help="run the demo job on a local (or given) Ray and check it")
    d.add_argument("--records", type=int, default=5_000_000)
    d.add_argument("--keys", type=int, default=100_000)
    d.add_argument("--dist", choices=["uniform", "zipf"], default="zipf")
    d.add_argument("--parallelism", type=int, default=2)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--rate", type=float, default=600_000, help="records/s offered (paced, so the rescale happens mid-run)")
    d.add_argument("--address", default=None, help="Ray address (default: start an embedded Ray)")
    d.add_argument("--generated", action="store_true",
                   help="generated records on Ray only (default: the full pipeline, Spark preprocessing real "
                        "text files)")
    add_job_verbs(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``chiray`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        found = versions()
        print(json.dumps(found) if args.version_json else "\n".join(f"{k} {v}" for k, v in found.items()))
        return 0
    if args.command is None:
        parser.error("a command is required (or --version)")
    if args.command in VERBS:
        return run_verb(args)
    if args.command == "demo" and not args.generated:
        from chiray.spark_bridge import demo as spark_demo  # the facade sits above every layer

        return int(spark_demo.run(args))
    if args.command == "demo":
        return demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
