"""python -m benchmarks.nexmark: NEXMark queries on chiray (Ray) against DuckDB on the same events.

Per query: events/s at parallelism 2 on a private local Ray (the generator inside the timed
pipeline, as any source; the time runs from submit() to the last result), DuckDB's rate on the
same events read from Parquet (batch, one thread), and whether chiray's output equals DuckDB's.
Like Spark's executors and DuckDB's process, the dataflow's processes are up before the clock
starts: each query takes its hosts from the warm pool that the previous run refilled
(``JobConfig.warm_hosts``; an untimed tiny run fills it first). A cold submit adds about a second
of process starts on this 2-core machine, which at 1,000,000 events is most of a fast query's time.
Spark Structured Streaming's rate on the same events (after chiray's runs, for the queries it
runs: ``spark.py``; ``--no-spark`` skips it). Progress lines for a person go to stderr; one
JSON line ends the run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import emit, spark_for_benchmark, start_ray

from .generator import NexmarkConfig
from .oracle import run_sql, same_rows
from .queries import Events, all_queries
from .source import write_parquet


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_query(name: str, events: Events, paths: dict[str, str], parallelism: int,
              last: bool = False) -> dict[str, Any]:
    """One query on Ray and on DuckDB: rates and exactness. The ``last`` run leaves no warm hosts behind
    (no run would take them)."""
    from chiray.actors import wait_warm_actors

    flow = all_queries()[name](events, parallelism)
    wait_warm_actors(120)  # the previous run's end refilled the pool
    started = time.perf_counter()
    job = flow.submit(warm_hosts=0 if last else parallelism)  # it takes the warm hosts either way
    job.wait(timeout=600)
    elapsed = time.perf_counter() - started
    got = job.result("out").to_pandas()
    started = time.perf_counter()
    expected = run_sql(name, paths, threads=1)
    duck = time.perf_counter() - started
    difference = same_rows(got, expected)
    if difference is not None:
        _say(f"  {name}: output differs from DuckDB's: {difference[:300]}")
    return {"query": name, "events": events.num_events, "events_per_s": round(events.num_events / elapsed),
            "duckdb_events_per_s": round(events.num_events / duck), "spark_events_per_s": None,
            "exact": difference is None, "output_rows": len(got)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events (unless --events), no Spark runs")
    parser.add_argument("--queries", default=",".join(all_queries()), help="comma-separated, e.g. q0,q1")
    parser.add_argument("--events", type=int, default=None, help="events per query (default 1,000,000)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--batch-events", type=int, default=50_000)
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark Structured Streaming runs")
    parser.add_argument("--migration", action="store_true",
                        help="Megaphone's experiment: rescale each stateful query live, per strategy")
    parser.add_argument("--load", type=float, default=0.6, help="the migration runs' pace, of capacity")
    parser.add_argument("--migration-seconds", type=float, default=20.0, help="event time per migration run")
    parser.add_argument("--png", default=None, help="write the migration runs' latency over time here")
    args = parser.parse_args(argv)
    names = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in names if q not in all_queries()]
    if unknown:
        parser.error(f"unknown queries {unknown}; expected some of {sorted(all_queries())}")
    num_events = args.events or (100_000 if args.quick else 1_000_000)
    events = Events(num_events, NexmarkConfig(), args.batch_events)
    start_ray(num_cpus=max(4, 2 * args.parallelism + 2))
    with tempfile.TemporaryDirectory() as directory:
        _say(f"writing {num_events:,} events as Parquet for DuckDB")
        paths = write_parquet(directory, num_events, events.config)
        _say("warming up: a tiny run starts the pool of hosts the timed runs take")
        warm_events = min(10_000, num_events)  # its size does not matter: it only starts the hosts
        all_queries()["q0"](Events(warm_events, events.config, min(5_000, args.batch_events)),
                            args.parallelism).submit(warm_hosts=args.parallelism).wait(timeout=120)
        results = []
        for i, name in enumerate(names):
            result = run_query(name, events, paths, args.parallelism, last=i == len(names) - 1)
            _say(f"{name}: {result['events_per_s']:,} events/s on chiray (parallelism {args.parallelism}), "
                 f"{result['duckdb_events_per_s']:,} on DuckDB (1 thread), exact={result['exact']}")
            results.append(result)
        from chiray.actors import release_warm_actors

        release_warm_actors()
        if not (args.no_spark or args.quick):  # --quick stays under a minute: no Spark session
            _spark_rates(results, paths, num_events)
    migration = None
    if args.migration:
        from .migration import experiment, plot, public

        capacities = {r["query"]: r["events_per_s"] for r in results}
        _say(f"migration: each stateful query at {args.load:.0%} of its capacity, rescaled 2 -> 3 -> 2 live")
        runs = experiment(capacities, args.load, args.migration_seconds, _say)
        if args.png:
            plot(runs, args.png)
            _say(f"latency over time: {args.png}")
        migration = public(runs)
    emit({"queries": results, "migration": migration, "parallelism": args.parallelism})


def _spark_rates(results: list[dict[str, Any]], paths: dict[str, str], num_events: int) -> None:
    """Spark Structured Streaming's rate on the same events, for the queries it runs (after chiray's runs)."""
    from .spark import SPARK_SQL, spark_rate, stream_folders

    wanted = [r for r in results if r["query"] in SPARK_SQL]
    if not wanted:
        return
    _say("starting Spark (local[2]) for Structured Streaming runs of the same events")
    folders = stream_folders(paths)
    with spark_for_benchmark(2, "nexmark", {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}) \
            as spark:
        for result in wanted:
            rate = spark_rate(spark, result["query"], folders, num_events)
            result["spark_events_per_s"] = None if rate is None else round(rate)
            result["over_spark"] = None if not rate else round(result["events_per_s"] / rate, 2)
            _say(f"{result['query']}: {result['spark_events_per_s']:,} events/s on Spark Structured Streaming "
                 f"(chiray {result['over_spark']}x)")


if __name__ == "__main__":
    main()
