"""demo.py: the full pipeline behind ``chiray demo``: Spark preprocesses, the dataflow counts, rescaled live.

Spark reads real text files that ship with every Python installation (the
standard library's own ``*.py`` sources, so it works offline), splits them
into lower-case words and drops short ones; the executors push the words
into a keyed count on Ray. While Spark is still pushing, the count is
rescaled live to one more instance (non-disruptive: bins move while the
stream runs) and then takes an aligned checkpoint; the result is checked
against the same query run as Spark SQL.

Run by ``chiray.cli`` (the facade, which sits above every layer).
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
import sysconfig
import time
import warnings

__all__ = ["run"]


def _words(spark, files: list[str], partitions: int):
    """Spark's preprocessing: lines -> lower-case words of 3+ letters."""
    from pyspark.sql import functions as F

    lines = spark.read.text(files).repartition(partitions)
    words = lines.select(F.explode(F.split(F.lower("value"), "[^a-z_]+")).alias("word"))
    return words.where(F.length("word") >= 3)


def _standard_library() -> list[str]:
    """The standard library's own sources, packages included, without tests and installed packages."""
    root = sysconfig.get_paths()["stdlib"]
    return sorted(
        f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
        if not any(part in ("test", "tests", "site-packages", "dist-packages")
                   for part in os.path.relpath(f, root).split(os.sep))
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when the dataflow's result equals Spark SQL's."""
    import ray

    from chiray.operators import Dataflow

    from . import SparkSource, from_spark, spark_session

    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    files = _standard_library()
    print(
        f"chiray demo: word count over {len(files)} Python standard library files, "
        f"preprocessed in Spark, counted on Ray at parallelism {args.parallelism}"
    )
    if not ray.is_initialized():
        # An embedded Ray gets room for the host that the live rescale adds (hosts ask for 0.5 CPU).
        num_cpus = max(4, os.cpu_count() or 1) if args.address is None else None
        ray.init(address=args.address, num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR)
    spark = spark_session(cores=2, app_name="chiray-demo", conf={"spark.sql.shuffle.partitions": "8",
                                                                "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    try:
        words = _words(spark, files, partitions=48)
        with from_spark(words, max_units=1) as src:  # Spark computes on demand, one partition ahead
            assert isinstance(src, SparkSource), "bug in demo: push mode expected"
            flow = Dataflow("spark-demo")
            (
                flow.source(src, parallelism=args.parallelism, name="words")
                .key_by("word")
                .count(parallelism=args.parallelism, name="count")
                .collect(name="out")
            )
            t0 = time.perf_counter()
            job = flow.submit(spare_hosts=1)  # the live rescale takes a host started with the job
            checkpointed: int | Exception | None = None  # a checkpoint's id, or why there is none
            rescale = None
            while True:
                try:
                    job.wait(timeout=0.25)
                    break
                except TimeoutError:
                    done = job.statistics().records_out("words")
                    if sys.stdout.isatty():  # redrawn in place; a log gets only the summary below
                        print(f"\r  {done:>12,} words into the dataflow", end="", flush=True)
                    if rescale is None:  # live, while Spark pushes: no word lost or counted twice
                        rescale = job.rescale("count", args.parallelism + 1, strategy="non_disruptive", chunks=3)
                    if checkpointed is None and rescale is not None and rescale.done():
                        try:
                            checkpointed = job.checkpoint(timeout=120)  # in-band, aligned, while Spark pushes
                        except Exception as exc:  # the input ended first (a short run): nothing lost
                            checkpointed = exc
            elapsed = time.perf_counter() - t0
            stats = src.statistics()
        got = {r["word"]: r["count"] for r in job.result("out").to_pylist()}
        words.createOrReplaceTempView("demo_words")
        expected = {
            r["word"]: r["n"]
            for r in spark.sql("SELECT word, count(*) AS n FROM demo_words GROUP BY word").collect()
        }
    finally:
        spark.stop()
    total = sum(got.values())
    redraw = "\r" if sys.stdout.isatty() else ""  # ends the counter's line on a terminal
    print(
        f"{redraw}  {total:,} words, {len(got):,} distinct, in {elapsed:.1f} s "
        f"({stats.committed_units} Spark partitions pushed by the executors)"
    )
    if rescale is not None:
        try:
            moved = rescale.result(0)
            print(f"  rescaled 'count' live from {args.parallelism} to {args.parallelism + 1} instances "
                  f"({moved['strategy']}): {moved['bins_moved']} bins, {moved['bytes_moved'] / 2**10:.0f} KiB "
                  f"moved in {moved['elapsed_s']:.2f} s")
        except Exception as exc:  # e.g. the input ended first; the result is still checked below
            print(f"  rescale did not complete: {exc}")
    if isinstance(checkpointed, Exception):
        print(f"  checkpoint did not complete: {checkpointed}")
    elif checkpointed is not None:
        print(f"  checkpoint {checkpointed} taken mid-run, after the rescale")
    top = sorted(got.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    print("  top words:\n" + "\n".join(f"    {w:>12}  {n:>8,}" for w, n in top))
    ok = got == expected
    print(f"  check against Spark SQL: {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1
