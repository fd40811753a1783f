"""operations.py: operating a detached job on a local multi-process cluster, end to end.

``python -m benchmarks.operations [--quick]`` starts a private head node
(``benchmarks/cluster.py``), submits a detached keyed count (a paced
generated source, ``to_parquet``) from a driver process that then exits, and
times what an operator does to it: attach from a new process, ``chiray
status`` and ``chiray rescale --wait`` (process start included), a job
manager kill until the source's output rate is back at 90% of what it was,
a savepoint, a stop with a savepoint and a restore from it (submit until the
restored job runs). The output of both jobs is checked against pandas
(``exact``). ``metrics_throughput_ratio`` compares unpaced runs of the same
job with the metrics export on and off, on the same cluster: the median of
``--tput-pairs`` runs each, in the order on, off, off, on, ... so that a drift
of the machine's load cancels (each run's rate in ``metrics_throughput_runs``).

The last line is one JSON object with ``driver_exit_survived``, ``attach_s``,
``cli_status_s``, ``cli_rescale_s``, ``manager_failover_s``, ``savepoint_s``,
``restore_s``, ``metrics_throughput_ratio``, ``spark_actor_failover_s`` (``benchmarks/sparkfailover.py``: the
Spark side of a detached Spark-fed job killed; seconds until rows flow again) and ``exact``.

``--hosts 3`` (as root) runs all of it on a cluster of separate hosts
(``benchmarks/netns.py``: a head and two worker nodes in network namespaces
of their own, token authentication on) with every checkpoint, savepoint and
output on its S3 server, and adds two faults (``benchmarks/netfaults.py``):
``partition_recovery_s`` (a node cut off for longer than the health check,
until the job runs again on the others) and ``node_loss_recovery_s`` (a
node's processes killed and its disk deleted); ``exact`` covers those jobs too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

import pandas as pd
import pyarrow.parquet as pq

from benchmarks.cluster import LocalCluster
from benchmarks.common import emit, key_counts
from benchmarks.sparkfailover import spark_actor_failover_s

DRIVER = """
import sys, chiray
keys, records, rate, name, out, chk, p, restore, metrics = sys.argv[1:]
flow = chiray.Dataflow("ops")
src = chiray.generate(int(records), rate=float(rate) or None, batch_size=10_000, num_keys=int(keys), seed=5,
                      num_splits=2)
(flow.source(src, parallelism=2, name="events").key_by("key").count(parallelism=int(p), name="count")
     .sink(chiray.to_parquet(out), name="out"))
chiray.submit(flow, name=name, detached=True, checkpoint_dir=chk, restore_from=restore or None,
              metrics_interval_s=None if metrics == "off" else 1.0)
"""


def _run(env: dict[str, str], *args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def _submit(env: dict[str, str], args: argparse.Namespace, name: str, out: str, chk: str, p: int,
            rate: float, restore: str = "", metrics: str = "on") -> float:
    return _run(env, "-c", DRIVER, str(args.keys), str(args.records), str(rate), name, out, chk, str(p), restore,
                metrics)


def _source_out(job: Any) -> int:
    return job.statistics().records_out("events")


def _rate(job: Any, window: float = 1.0) -> float:
    a, t0 = _source_out(job), time.perf_counter()
    time.sleep(window)
    return (_source_out(job) - a) / (time.perf_counter() - t0)


def _failover(job: Any, env: dict[str, str]) -> float:
    """Kill the manager; seconds until the source emits at 90% of its earlier rate again."""
    import ray

    before = _rate(job, 2.0)
    ray.kill(ray.get_actor(job.name, namespace="chiray"), no_restart=False)
    killed = time.perf_counter()
    while time.perf_counter() - killed < 120:
        try:
            if job.info()["restarts"] >= 1 and _rate(job, 0.5) >= 0.9 * before:
                return time.perf_counter() - killed
        except Exception:  # the new manager is still deploying
            time.sleep(0.1)
    raise TimeoutError("the job did not come back within 120 s")


def _under(root: str, name: str) -> str:
    """``name`` under ``root``, a local directory or a ``pyarrow.fs`` URI (whose query stays last)."""
    from chiray.actors.runtime.storage import child_uri  # imported late: Ray is imported once the env is set

    return child_uri(root, name)


def _read_output(directory: str) -> pd.DataFrame:
    """A Parquet output directory (a local path or a ``pyarrow.fs`` URI) as one frame (empty: none)."""
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(directory) if "://" in directory else (pafs.LocalFileSystem(), directory)
    files = [f.path for f in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
             if f.type == pafs.FileType.File and f.base_name.startswith("part-")]
    return pd.concat([pq.read_table(f, filesystem=fs).to_pandas() for f in files]) if files else pd.DataFrame()


def _oracle(args: argparse.Namespace) -> pd.Series:
    import chiray

    return key_counts(chiray.generate(args.records, batch_size=10_000, num_keys=args.keys, seed=5, num_splits=2))


def _throughput(env: dict[str, str], args: argparse.Namespace, root: str, metrics: str, run: int = 0) -> float:
    """Unpaced: records/s into the count, between the first sample that saw records and the end."""
    import chiray

    name = f"tput-{metrics}-{run}"
    flow = chiray.Dataflow("ops")
    src = chiray.generate(args.tput_records, batch_size=10_000, num_keys=args.keys, seed=5, num_splits=2)
    (flow.source(src, parallelism=2, name="events").key_by("key").count(parallelism=2, name="count")
         .sink(chiray.to_parquet(_under(root, f"{name}-out")), name="out"))
    job = chiray.submit(flow, name=name, detached=True, checkpoint_dir=_under(root, f"{name}-chk"),
                        metrics_interval_s=None if metrics == "off" else 1.0)
    first: tuple[float, int] | None = None
    while True:
        seen, now = job.statistics().records_in("count"), time.perf_counter()
        if first is None and seen > 0:
            first = (now, seen)
        if seen >= args.tput_records:
            break
        time.sleep(0.1)
    job.wait(timeout=600)
    job.forget()
    if first is None or now <= first[0]:
        raise RuntimeError(f"the {name} run ended before it could be timed; raise --tput-records")
    return (seen - first[1]) / (now - first[0])


def _operate(cluster: LocalCluster, args: argparse.Namespace, root: str) -> dict[str, Any]:
    import chiray

    env = cluster.env
    out1, out2, sp = (_under(root, name) for name in ("out1", "out2", "sp"))
    _submit(env, args, "ops", out1, _under(root, "chk1"), 2, args.rate)
    print("  submitted; the driver exited", flush=True)
    attach_s = _run(env, "-c", f"import chiray; chiray.attach('ops', address={cluster.address!r}).status()")
    job = chiray.attach("ops")
    survived = job.info()["state"] == "RUNNING"
    cli_status_s = _run(env, "-m", "chiray", "status", "ops")
    cli_rescale_s = _run(env, "-m", "chiray", "rescale", "ops", "count", "3", "--wait", "--json")
    print(f"  attach {attach_s:.2f} s, status {cli_status_s:.2f} s, rescale {cli_rescale_s:.2f} s", flush=True)
    job.checkpoint()
    failover = _failover(job, env)
    print(f"  manager failover {failover:.2f} s", flush=True)
    savepoint_s = _run(env, "-m", "chiray", "savepoint", "ops")
    job.stop(savepoint=sp)
    restore_s = _submit(env, args, "ops2", out2, _under(root, "chk2"), 1, args.rate, restore=sp)
    chiray.attach("ops2").wait(timeout=600)
    got = pd.concat([_read_output(d) for d in (out1, out2)])
    got = got.groupby("key")["count"].sum().sort_index()
    expected = _oracle(args)
    exact = got.index.tolist() == expected.index.tolist() and got.astype("int64").tolist() == \
        expected.astype("int64").tolist()
    print(f"  savepoint {savepoint_s:.2f} s, restore {restore_s:.2f} s, exact {exact}", flush=True)
    return {"driver_exit_survived": survived, "attach_s": attach_s, "cli_status_s": cli_status_s,
            "cli_rescale_s": cli_rescale_s, "manager_failover_s": failover, "savepoint_s": savepoint_s,
            "restore_s": restore_s, "exact": exact}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, well under a minute of job time")
    parser.add_argument("--keys", type=int, default=None)
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--tput-records", type=int, default=None, help="records of each unpaced run")
    parser.add_argument("--tput-pairs", type=int, default=None,
                        help="unpaced runs with and without metrics (median of each; default 3, quick 2)")
    parser.add_argument("--rate", type=float, default=None, help="records/s offered to the operated job")
    parser.add_argument("--hosts", type=int, default=1,
                        help="nodes; more than 1: a namespace cluster (as root) with S3 storage and network faults")
    args = parser.parse_args(argv)
    args.keys = args.keys or (20_000 if args.quick else 1_000_000)
    args.records = args.records or (600_000 if args.quick else 12_000_000)
    args.tput_records = args.tput_records or (8_000_000 if args.quick else 20_000_000)
    args.rate = args.rate or (20_000 if args.quick else 200_000)
    args.tput_pairs = args.tput_pairs or (2 if args.quick else 3)
    print(f"operations: detached keyed count, {args.keys:,} keys, {args.records:,} records at {args.rate:,.0f}/s",
          flush=True)
    if args.hosts > 1:
        with _hosts_cluster(args.hosts) as (cluster, root), tempfile.TemporaryDirectory(prefix="ops") as local:
            _measure(cluster, args, root, local)
        return
    with LocalCluster(num_cpus=4) as cluster, tempfile.TemporaryDirectory(prefix="ops") as root:
        os.environ["RAY_ADDRESS"] = cluster.address
        os.environ["RAY_AUTH_MODE"] = "disabled"
        import ray

        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        _measure(cluster, args, root, root)


@contextlib.contextmanager
def _hosts_cluster(hosts: int) -> Iterator[tuple[Any, str]]:
    """A namespace cluster of ``hosts`` nodes, this process its driver, and a root URI on its S3 server."""
    from benchmarks.netfaults import connect
    from benchmarks.netns import NetnsCluster

    with NetnsCluster(nodes=hosts) as cluster:
        assert cluster.s3 is not None
        connect(cluster)
        print(f"  on {hosts} hosts in network namespaces, token auth, S3 at {cluster.s3.endpoint}", flush=True)
        yield cluster, cluster.s3.uri(cluster.s3.make_bucket("ops"), "run")


def _measure(cluster: Any, args: argparse.Namespace, root: str, local: str) -> None:
    """Every figure on ``cluster`` (this process is its driver), outputs under ``root``, the Spark side's
    files under the local directory ``local``; the JSON line."""
    import ray

    try:
        figures = _operate(cluster, args, root)
        figures["spark_actor_failover_s"] = spark_actor_failover_s(cluster.env, local)
        print(f"  spark side failover {figures['spark_actor_failover_s']:.2f} s", flush=True)
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for k in range(args.tput_pairs):  # on, off, off, on, ...: a drift of the machine's load cancels
            for metrics in (("on", "off") if k % 2 == 0 else ("off", "on")):
                rates[metrics].append(_throughput(cluster.env, args, root, metrics, k))
        on, off = (sorted(rates[m])[len(rates[m]) // 2] for m in ("on", "off"))
        figures["metrics_throughput_ratio"] = on / off
        figures["metrics_throughput_runs"] = {m: [round(r) for r in rs] for m, rs in rates.items()}
        print(f"  unpaced (median of {args.tput_pairs}): {on:,.0f} records/s with metrics, {off:,.0f} without",
              flush=True)
        if args.hosts > 1:
            figures.update(_network_faults(cluster, args))
            figures["exact"] = figures["exact"] and figures.pop("faults_exact")
    finally:
        ray.shutdown()
    emit(figures)


def _network_faults(cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    """A partition longer than the health check, then a lost node (``benchmarks/netfaults.py``)."""
    from benchmarks.netfaults import run_scenario

    out: dict[str, Any] = {}
    exact = True
    for kind in ("partition", "node_loss"):
        figures = run_scenario(cluster, kind, 100_000 if args.quick else 400_000, 8_000.0 if args.quick else 20_000.0)
        out[f"{kind}_recovery_s"] = figures[f"{kind}_recovery_s"]
        exact = exact and figures[f"{kind}_exact"]
    out["faults_exact"] = exact
    return out


if __name__ == "__main__":
    main()
