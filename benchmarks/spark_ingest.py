"""spark_ingest.py: how fast Spark's executors push a preprocessed DataFrame into a keyed count.

Pipeline: ``spark.range(N)`` -> Spark adds a string key (100,000 distinct),
an int and a timestamp, filters (drops 1 row in 13) and projects ->
``from_spark`` (executor push, credit window) -> ``key_by("key")`` ->
``count`` (2 instances) -> ``collect``. The result is checked against Spark
SQL's own ``GROUP BY`` over the same DataFrame.

Measured: ``bridge_rows_per_s`` (rows into the dataflow / seconds from
``submit()`` to the end of the job, Spark's computation included);
``to_arrow_rows_per_s``: Spark's own ``df.toArrow()`` of the same DataFrame
in the same run (the second call: the first warms the JVM's Arrow
conversion, as the bridge's earlier runs warm it for the bridge), the
driver-funnel reference; ``ratio`` = bridge / toArrow (target >= 0.7);
``driver_rss_mb_1m`` / ``driver_rss_mb_5m``: the peak RSS of the driver (this
Python process plus Spark's JVM) during a bridge run of the small and the
large size, also given apart (``driver_python_rss_mb_*``,
``driver_jvm_rss_mb_*``): it must stay flat as the rows grow, because no
row passes through the driver. The Python driver's does (about 200 MB at
1M and at 5M rows). The JVM's peak moves by 40-170 MB between runs: its heap
grows when it likes and never shrinks (in local mode it also runs the
executors; with ``--master local-cluster[2,1,1024]``, where it does not, it
grew as much). So each run's own growth is reported too:
``driver_rss_growth_mb_1m`` / ``_5m`` (peak minus the RSS at the run's
start), and ``to_arrow_driver_rss_growth_mb_5m`` for ``toArrow()``, which
does funnel every row through the driver (measured: a 5M-row bridged run
+18 MB, ``toArrow()`` +189 MB). ``submit_s_5m``: how long ``submit()`` took
(Spark already computes meanwhile).

The job runs on ``NUM_HOSTS`` = 2 host actors, one per core (``--num-hosts``).
Like Spark's executors for ``toArrow()``, the dataflow's processes are warm:
each run keeps its hosts, controller and the bridge's coordinator started for
the next (``JobConfig.warm_hosts``, ``from_spark(keep_warm=True)``; the last
run that would take them keeps none), and a run starts once they are up. A
cold submit costs a process start per host (seconds on a busy 2-core machine).

Where the CPU goes (5M rows, 2 cores, per-process CPU seconds, measured
during the run): ``toArrow()`` about 2 (the JVM 1.7); the bridge about 3-4:
the JVM 1.2-2 (executor-side Arrow conversion plus a Spark job per partition
and the Python runner), the hosts 0.7-1.1 (take the pushed batches, decode,
route and count 4.6M string keys), Spark's Python workers 0.7-0.9, the
coordinator under 0.1 (about 50 small calls: it never sees a row), the driver
under 0.1 (the executors push straight to the hosts of the source
instances, each byte crossing Ray's object store once). Both compete for the
same two cores, so the ratio is bounded by the CPU ratio; on a machine with
cores to spare for the dataflow the bound is Spark.
The dataflow's own part, in one process without Ray, is 0.6 CPU s (half of
it hashing the string keys); the rest of the hosts' share is Ray's calls
and serialisation between processes.

``naive_rows_per_s``: what a user would write instead of the bridge,
``from_arrow(df.toArrow())`` into the same dataflow (same hosts, same run), timed from
``toArrow()`` to the job's end; ``ratio_to_naive`` = bridge / naive (target >= 1.0 at 5M
rows); ``driver_rss_mb_naive_5m`` and its growth: the whole table passes the driver.

Each path runs ``--repeat`` times at full size (default 2), in the order bridge, naive, naive,
bridge, ..., and the best run of each is compared (every run's rate is in the JSON). The JVM
compiles the code of a path on its first full-size run: its compiler threads measured 1.2-1.5 CPU
seconds in the first 5M-row bridged run against 0.4-0.6 in later ones, on a 2.5-3.5 s run, so one
run of each would compare a cold path with a warm one. The driver's RSS at full size is the first
bridged run's, which comes before any naive run: the naive table's memory stays in the driver's
allocator after it is freed, and a later run would start with it.

``bridge_cpu_us_per_row``: the bridge's own CPU per row, everything but Spark's plan and the
operators. The CPU time of every process of the run (this driver and its descendants: Spark's
JVM and Python workers, Ray's processes and the hosts) over the large bridged run, less the same
over Spark running the same plan alone into a no-op sink (``df.write.format("noop")``), less the
busy time of the operators after the source (the key_by's count and the collect, from the job's
statistics), divided by the rows. What is left: Arrow conversion in the JVM and the Python runner,
pushing, Ray's calls, decoding in the source instances and the coordinator.

Run: ``python -m benchmarks.spark_ingest [--quick] [--rows N] [--small-rows N] [--master M] [--num-hosts N]``.
``--quick`` (under a minute): 1,000,000 and 200,000 rows (the JSON's
``rows`` / ``small_rows`` say which sizes the two RSS figures are for).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import psutil

from benchmarks.common import RssSampler, emit, spark_for_benchmark, start_ray

MASTER = "local"
"""Spark's master (``--master``): ``local`` is ``local[2]``, the executors inside the driver's JVM;
``local-cluster[2,1,1024]`` gives them JVMs of their own, as on a cluster, so that the driver JVM's RSS is
the driver's alone (measured: the same growth from 1M to 5M rows, about 50 MB, and a lower bridge rate,
1.5 against 2.3 M rows/s: two more JVMs on two cores)."""

PATHS = {"bridge": "bridge", "naive": "from_arrow(df.toArrow()) into the same dataflow"}

NUM_HOSTS = 2
"""Host actors: one per core here, each with a source and a count instance, so half of the routed batches
stay on their host (the default rule would start 4, every batch crossing processes). Kept warm between
runs (``JobConfig.warm_hosts``)."""


def dataframe(spark: Any, rows: int, partitions: int) -> Any:
    """The preprocessed input: a filter and a projection in Spark."""
    return (
        spark.range(rows, numPartitions=partitions)
        .selectExpr(
            "concat('k', cast(id % 100000 AS string)) AS key",
            "cast(id % 13 AS int) AS v",
            "timestamp_seconds(1700000000 + id) AS ts",
            "id",
        )
        .where("v <> 5")
        .select("key", "v", "ts")
    )


def driver_pids() -> tuple[int, list[int]]:
    """This process, and the driver's JVM (its child; in ``local`` mode that JVM runs the executors too,
    with ``local-cluster`` they are JVMs of their own, the driver JVM's children, and not counted)."""
    me = psutil.Process()
    return me.pid, [c.pid for c in me.children(recursive=False) if "java" in c.name()]


def cpu_seconds() -> dict[int, float]:
    """User plus system CPU seconds of this process and every descendant, by pid."""
    me = psutil.Process()
    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            out[proc.pid] = times.user + times.system
        except psutil.Error:
            continue
    return out


def cpu_spent(before: dict[int, float]) -> float:
    """CPU seconds spent since ``before`` by the processes alive now (a process started since counts whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in cpu_seconds().items())


def spark_plan_cpu_s(spark: Any, rows: int, partitions: int) -> float:
    """CPU seconds of Spark running the bridge's plan alone, into a sink that drops every row."""
    df = dataframe(spark, rows, partitions)
    df.write.format("noop").mode("overwrite").save()  # warm, as the bridge's runs are
    before = cpu_seconds()
    df.write.format("noop").mode("overwrite").save()
    return cpu_spent(before)


def run_bridge(spark: Any, rows: int, partitions: int, num_hosts: int = NUM_HOSTS, keep_hosts: bool = True,
               keep_coordinator: bool = True) -> dict[str, Any]:
    """One bridged keyed count (checked against Spark SQL): rows/s, submit time and peak driver RSS.

    ``keep_hosts`` / ``keep_coordinator``: its end starts warm hosts / a warm coordinator for a later run
    (the last run that would take them leaves none)."""
    from chiray.actors import wait_warm_actors
    from chiray.operators import Dataflow
    from chiray.spark_bridge import from_spark

    df = dataframe(spark, rows, partitions)
    wait_warm_actors(120)  # the previous run's end started them; Spark's executors are warm too
    me, jvm = driver_pids()
    with RssSampler([me]) as py_rss, RssSampler(jvm) as jvm_rss, \
            from_spark(df, max_units=4, keep_warm=keep_coordinator) as src:
        flow = Dataflow(f"spark-ingest-{rows}")
        flow.source(src, parallelism=2, name="src").key_by("key").count(parallelism=2, name="count").collect(
            name="out"
        )
        cpu_before = cpu_seconds()
        t0 = time.perf_counter()
        job = flow.submit(num_hosts=num_hosts, warm_hosts=num_hosts if keep_hosts else 0)
        submitted = time.perf_counter() - t0
        try:
            job.wait(timeout=1800)
        finally:
            job.cancel()
        elapsed = time.perf_counter() - t0
        cpu = cpu_spent(cpu_before)
        delivered = src.statistics().delivered_rows
    operators_busy = sum(s.busy_s for s in job.statistics().instances if s.operator != "src")
    got = {r["key"]: r["count"] for r in job.result("out").to_pylist()}
    df.createOrReplaceTempView("ingest_oracle")
    expected = {
        r["key"]: r["n"]
        for r in spark.sql("SELECT key, count(*) AS n FROM ingest_oracle GROUP BY key").collect()
    }
    if got != expected:
        raise SystemExit(
            f"spark_ingest: the dataflow's counts differ from Spark SQL's ({len(got)} vs "
            f"{len(expected)} keys)"
        )
    return {
        "rows_per_s": delivered / elapsed,
        "submit_s": round(submitted, 3),
        "rows": delivered,
        "rss_mb": round(py_rss.peak_mb + jvm_rss.peak_mb, 1),
        "python_rss_mb": py_rss.peak_mb,
        "jvm_rss_mb": jvm_rss.peak_mb,
        "rss_growth_mb": round(py_rss.growth_mb + jvm_rss.growth_mb, 1),
        "cpu_s": cpu,
        "operators_busy_s": operators_busy,
    }


def run_naive(spark: Any, rows: int, partitions: int, num_hosts: int = NUM_HOSTS,
              keep_hosts: bool = True) -> dict[str, Any]:
    """What a user would do instead of the bridge: ``from_arrow(df.toArrow())`` into the same dataflow
    (the whole table through the driver), timed from ``toArrow()`` to the end of the job. ``keep_hosts``:
    its end starts warm hosts for a later run."""
    from chiray.actors import wait_warm_actors
    from chiray.operators import Dataflow, from_arrow

    df = dataframe(spark, rows, partitions)
    wait_warm_actors(120)
    me, jvm = driver_pids()
    with RssSampler([me]) as py_rss, RssSampler(jvm) as jvm_rss:
        t0 = time.perf_counter()
        table = df.toArrow()
        flow = Dataflow(f"spark-naive-{rows}")
        flow.source(from_arrow(table, num_splits=2), parallelism=2, name="src").key_by("key").count(
            parallelism=2, name="count").collect(name="out")
        job = flow.submit(num_hosts=num_hosts, warm_hosts=num_hosts if keep_hosts else 0)
        try:
            job.wait(timeout=1800)
        finally:
            job.cancel()
        elapsed = time.perf_counter() - t0
    delivered = table.num_rows
    expected = {r["key"]: r["n"] for r in table.group_by("key").aggregate([("key", "count")])
                .rename_columns(["key", "n"]).to_pylist()}
    got = {r["key"]: r["count"] for r in job.result("out").to_pylist()}
    if got != expected:
        raise SystemExit("spark_ingest: the naive run's counts differ from its own table's")
    del table
    return {"rows_per_s": delivered / elapsed, "rows": delivered,
            "rss_mb": round(py_rss.peak_mb + jvm_rss.peak_mb, 1),
            "rss_growth_mb": round(py_rss.growth_mb + jvm_rss.growth_mb, 1)}


def measure(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The runs of ``main`` on one SparkSession: the bridge, the naive path and ``toArrow()``."""
    spark.sparkContext.setLogLevel("ERROR")
    if args.small_rows >= 100_000:  # tiny runs (CI) skip the warm-up
        print("spark_ingest: warming up Spark and the bridge", flush=True)
        run_bridge(spark, 100_000, 2, args.num_hosts)
    print(f"spark_ingest: bridge, {args.small_rows:,} rows", flush=True)
    small = run_bridge(spark, args.small_rows, args.partitions, args.num_hosts)
    print(f"  peak driver RSS {small['rss_mb']} MB", flush=True)
    runs: list[tuple[str, dict[str, Any]]] = []
    order = [path for attempt in range(args.repeat)  # bridge, naive, naive, bridge, ...: neither always meets
             for path in (("bridge", "naive") if attempt % 2 == 0 else ("naive", "bridge"))]  # the warmer JVM
    for i, path in enumerate(order):
        print(f"spark_ingest: {PATHS[path]}, {args.rows:,} rows (run {i // 2 + 1} of {args.repeat})", flush=True)
        later = order[i + 1:]
        if path == "bridge":
            run = run_bridge(spark, args.rows, args.partitions, args.num_hosts, keep_hosts=bool(later),
                             keep_coordinator="bridge" in later)
        else:
            run = run_naive(spark, args.rows, args.partitions, args.num_hosts, keep_hosts=bool(later))
        runs.append((path, run))
        print(f"  {run['rows_per_s'] / 1e6:.2f} M rows/s, peak driver RSS {run['rss_mb']} MB "
              f"(+{run['rss_growth_mb']} MB)", flush=True)
    bridge_runs = [run for path, run in runs if path == "bridge"]
    naive_runs = [run for path, run in runs if path == "naive"]
    large = max(bridge_runs, key=lambda run: run["rows_per_s"])
    naive = max(naive_runs, key=lambda run: run["rows_per_s"])
    bridge, delivered = large["rows_per_s"], large["rows"]
    first = bridge_runs[0]  # before any naive run: a later one starts with the memory the naive table left
    plan_cpu = spark_plan_cpu_s(spark, args.rows, args.partitions)
    bridge_cpu = large["cpu_s"] - plan_cpu - large["operators_busy_s"]
    print(f"  CPU: {large['cpu_s']:.2f} s in all, Spark's plan alone {plan_cpu:.2f} s, the operators "
          f"{large['operators_busy_s']:.2f} s: the bridge {bridge_cpu / delivered * 1e6:.2f} us a row", flush=True)
    print(f"spark_ingest: toArrow() of the same {args.rows:,}-row DataFrame", flush=True)
    df = dataframe(spark, args.rows, args.partitions)
    df.toArrow()  # warm, like the bridge's runs: the JVM compiles its Arrow conversion on the first call
    me, jvm = driver_pids()
    with RssSampler([me]) as py_rss, RssSampler(jvm) as jvm_rss:
        t0 = time.perf_counter()
        table = df.toArrow()
        to_arrow = table.num_rows / (time.perf_counter() - t0)
    to_arrow_growth = round(py_rss.growth_mb + jvm_rss.growth_mb, 1)
    assert table.num_rows == delivered, (
        f"bug in spark_ingest: toArrow saw {table.num_rows}, the bridge {delivered}"
    )
    del table
    print(f"  {to_arrow / 1e6:.2f} M rows/s", flush=True)
    return {
        "bridge_rows_per_s": round(bridge),
        "to_arrow_rows_per_s": round(to_arrow),
        "ratio": round(bridge / to_arrow, 3),
        "naive_rows_per_s": round(naive["rows_per_s"]),
        "bridge_rows_per_s_runs": [round(run["rows_per_s"]) for run in bridge_runs],
        "naive_rows_per_s_runs": [round(run["rows_per_s"]) for run in naive_runs],
        "ratio_to_naive": round(bridge / naive["rows_per_s"], 3),
        "driver_rss_mb_naive_5m": max(run["rss_mb"] for run in naive_runs),
        "driver_rss_growth_mb_naive_5m": max(run["rss_growth_mb"] for run in naive_runs),
        "driver_rss_mb_1m": small["rss_mb"],
        "driver_rss_mb_5m": first["rss_mb"],
        "driver_python_rss_mb_1m": small["python_rss_mb"],
        "driver_python_rss_mb_5m": first["python_rss_mb"],
        "driver_jvm_rss_mb_1m": small["jvm_rss_mb"],
        "driver_jvm_rss_mb_5m": first["jvm_rss_mb"],
        "driver_rss_growth_mb_1m": small["rss_growth_mb"],
        "driver_rss_growth_mb_5m": max(run["rss_growth_mb"] for run in bridge_runs),
        "to_arrow_driver_rss_growth_mb_5m": to_arrow_growth,
        "bridge_cpu_us_per_row": round(bridge_cpu / delivered * 1e6, 3),
        "run_cpu_s_5m": round(large["cpu_s"], 2),
        "spark_plan_cpu_s_5m": round(plan_cpu, 2),
        "operators_busy_s_5m": round(large["operators_busy_s"], 2),
        "submit_s_5m": large["submit_s"],
        "master": args.master,
        "num_hosts": args.num_hosts,
        "rows": args.rows,
        "repeat": args.repeat,
        "small_rows": args.small_rows,
        "quick": args.quick,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--small-rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2,
                        help="full-size runs of each path, alternating; the best of each is compared (default 2)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--master", default=MASTER,
                        help=f"Spark's master (default {MASTER}: local[2]; or e.g. local-cluster[2,1,1024])")
    parser.add_argument("--num-hosts", type=int, default=NUM_HOSTS, metavar="N",
                        help=f"host processes of each job, kept warm between runs (default {NUM_HOSTS}: one per core)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.small_rows = 1_000_000, 200_000
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.num_hosts < 1:
        parser.error("--num-hosts must be at least 1")
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    start_ray(num_cpus=4)
    from chiray.actors import release_warm_actors
    from chiray.spark_bridge import release_warm_coordinators

    with spark_for_benchmark(2, "spark_ingest", {"spark.sql.shuffle.partitions": "4"},
                             None if args.master == "local" else args.master) as spark:
        figures = measure(spark, args)
    release_warm_actors()
    release_warm_coordinators()
    emit(figures)


if __name__ == "__main__":
    main()
