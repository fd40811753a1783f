"""netfaults.py: a keyed count on a namespace cluster through a lost node and network partitions, exact or not.

``python -m benchmarks.netfaults [--quick]`` (as root) starts a
``NetnsCluster`` (a head and two worker nodes in namespaces of their own,
token authentication on, a health-check timeout of about 2 s) with its S3
server as the job's storage, and runs one paced keyed count per fault, each
with its committed output checked against pandas (every key's count exact,
no key twice):

- ``short_partition``: a worker's link is cut for a fraction of the health
  check and healed: the job rides it out (no recovery expected);
  ``short_partition_stall_s`` is how long the source's output stood still.
- ``partition``: the node of the job's host 0 (which runs the job
  controller) is cut off for longer than the health check, then healed: Ray
  declares the node dead, the job recovers on the other nodes (the cut-off
  side commits nothing: ``control.fencing``), and once healed the node's
  stale processes are gone (Ray retires a node it declared dead); then a
  fresh node takes its place.
- ``node_loss``: a worker node's processes are killed and its disk deleted.

First, a job whose ``checkpoint_dir`` is a local directory (each node has its
own) must be refused at submit (``local_dir_refused``).

A recovery time runs from the fault until the job recovered and its source
emits again. Expected on two cores: a few seconds each (health check plus
the usual recovery), 15 s at most. The last line is one JSON object with
``node_loss_recovery_s``, ``partition_recovery_s``, ``short_partition_stall_s``,
``stale_retired_s``, ``restarts`` per scenario and ``exact``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

from benchmarks.common import emit, key_counts
from benchmarks.netns import NetnsCluster

SCENARIOS = ("short_partition", "partition", "node_loss")


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> float:
    """Poll ``condition`` until true; returns the seconds it took (a deadline, never a bare sleep)."""
    start = time.perf_counter()
    while not condition():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(every)
    return time.perf_counter() - start


def submit_count(name: str, checkpoint_dir: str, records: int, rate: float) -> tuple[Any, Any]:
    """A paced keyed count (two source and two count instances spread over the nodes); the job and its source."""
    import chiray

    src = chiray.generate(records, rate=rate or None, batch_size=1000, num_keys=300, num_splits=2, seed=11)
    flow = chiray.Dataflow(name)
    (flow.source(src, parallelism=2, name="src").key_by("key").count(parallelism=2, name="count")
         .collect(name="out"))
    job = chiray.submit(flow, checkpoint_dir=checkpoint_dir, checkpoint_interval_s=1.0, poll_interval_s=0.2,
                        host_num_cpus=0.25, host_options={"scheduling_strategy": "SPREAD"})
    return job, src


def exact(job: Any, src: Any) -> bool:
    """The committed output equals pandas' count of the input: every key once, with its exact count."""
    out = job.result().to_pandas()
    if out["key"].duplicated().any():
        return False
    got = out.set_index("key")["count"].sort_index()
    expected = key_counts(src)
    return got.index.tolist() == expected.index.tolist() and got.astype("int64").tolist() == \
        expected.astype("int64").tolist()


def _node_of(cluster: NetnsCluster, host: Any) -> int:
    import ray

    node_id = ray.get(host.node_id.remote(), timeout=30)
    ip = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)
    return cluster.node_index(ip)


def victim(cluster: NetnsCluster, job: Any) -> int:
    """The worker node of host 0 (where the job controller runs), else of the first host on a worker."""
    from chiray.actors.runtime.controller import controller_host

    snap = job.topology.snapshot()
    hosts = dict(zip(snap.host_ids, snap.hosts))
    first = controller_host(snap.controller)
    order = ([hosts[first]] if first in hosts else []) + list(snap.hosts)
    for host in order:
        node = _node_of(cluster, host)
        if node >= 1:
            return node
    raise RuntimeError("no host of the job runs on a worker node (SPREAD placed them all on the head)")


def _recoveries(job: Any) -> int:
    return sum(e.startswith("recovered") for e in job.status().events)


def _emitted(job: Any) -> int:
    return job.statistics().records_out("src")


def run_scenario(cluster: NetnsCluster, kind: str, records: int, rate: float) -> dict[str, Any]:
    """One job through one fault; its figures (seconds, restarts, exact)."""
    assert cluster.s3 is not None
    bucket = cluster.s3.make_bucket(f"{kind.replace('_', '-')}-{os.getpid()}")
    job, src = submit_count(kind, cluster.s3.uri(bucket, "chk"), records, rate)
    figures: dict[str, Any] = {}
    try:
        wait_for(lambda: _emitted(job) >= records * 0.3, 120, f"{kind}: 30% of the input emitted")
        node = victim(cluster, job)
        start = time.perf_counter()
        if kind == "short_partition":
            cluster.partition(node, seconds=cluster.health_check_s / 4)
            seen = _emitted(job)  # (read once the partitioned host answers: after the heal)
            # it emits again, unless it had read all its input already (a source behind its pace catches up)
            wait_for(lambda: seen >= records or _emitted(job) > seen, 60, f"{kind}: the source emits after the heal")
            figures["short_partition_stall_s"] = time.perf_counter() - start
        else:
            if kind == "node_loss":
                cluster.lose_node(node)
            else:
                cluster.partition(node, seconds=cluster.health_check_s + 4.0)
            wait_for(lambda: _recoveries(job) >= 1, 90, f"{kind}: the job recovered")
            seen = _emitted(job)
            wait_for(lambda: _emitted(job) > seen, 60, f"{kind}: the source emits after the recovery")
            figures[f"{kind}_recovery_s"] = time.perf_counter() - start
            if kind == "partition":
                figures["stale_retired_s"] = _retire_stale(cluster, node, start)
        job.wait(timeout=300)
    except BaseException:
        print(f"  {kind}: failed; the job then: {describe(job)}", flush=True)
        job.cancel()
        raise
    figures[f"{kind}_restarts"] = _recoveries(job)
    figures[f"{kind}_exact"] = exact(job, src)
    print(f"  {kind} on node {node}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in figures.items()), flush=True)
    return figures


def describe(job: Any) -> str:
    """For a failed scenario's report: the job's state, its last events, and per instance its host, records in
    and out, queued batches, output waiting for credit, control ops completed and time back-pressured."""
    try:
        status, stats = job.status(), job.statistics()
    except Exception as exc:  # a job that cannot answer says something too
        return f"(it did not answer: {exc!r})"
    instances = "; ".join(
        f"{i.operator}/{i.index}@host{i.host} in {i.records_in} out {i.records_out} queued {i.queued_batches} "
        f"pending_out {i.pending_out} ops {i.control_completed} backpressured {i.backpressured_s:.1f} s"
        for i in stats.instances)
    return f"state {status.state.value}; last events {list(status.events[-8:])}; instances: {instances}"


def _retire_stale(cluster: NetnsCluster, node: int, start: float) -> float:
    """Once healed, the node that Ray declared dead has no process left (its raylet exits when told, its
    workers with it); seconds from the partition. A fresh node then takes its place."""
    wait_for(lambda: node not in cluster._heals, 60, "the partition healed")
    wait_for(lambda: not cluster.pids(node), 60, f"node {node}'s stale processes retired after the heal")
    retired = time.perf_counter() - start
    cluster.restart_node(node)
    return retired


def local_dir_refused(cluster: NetnsCluster) -> bool:
    """Whether a submit with a local ``checkpoint_dir`` (``data_dir``: each node has its own) is refused."""
    from chiray.actors.jobs.shareddir import UnsharedStorageError

    try:
        job, _ = submit_count("local-dir", os.path.join(cluster.data_dir, "chk"), 1_000, 0.0)
    except UnsharedStorageError as exc:
        print(f"  a local checkpoint_dir is refused: {str(exc).splitlines()[0][:160]}", flush=True)
        return True
    job.cancel()
    return False


def run_all(cluster: NetnsCluster, records: int, rate: float, scenarios: tuple[str, ...] = SCENARIOS
            ) -> dict[str, Any]:
    figures: dict[str, Any] = {"local_dir_refused": local_dir_refused(cluster)}
    for kind in scenarios:
        figures.update(run_scenario(cluster, kind, records, rate))
    figures["exact"] = all(figures[f"{kind}_exact"] for kind in scenarios)
    return figures


def connect(cluster: NetnsCluster) -> None:
    """This process becomes a driver of ``cluster`` (its address and token; Ray not yet imported here)."""
    os.environ.update({k: cluster.env[k] for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")})
    import ray

    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs (about a minute of job time)")
    parser.add_argument("--records", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None, help="records/s each job's source offers")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args(argv)
    rate = args.rate or 8_000.0
    records = args.records or (80_000 if args.quick else 200_000)
    scenarios = tuple(s for s in args.scenarios.split(",") if s)
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    started = time.perf_counter()
    with NetnsCluster(nodes=3) as cluster:
        print(f"netfaults: cluster up in {time.perf_counter() - started:.1f} s ({cluster.address}, "
              f"token auth, S3 at {cluster.s3.endpoint if cluster.s3 else None}); {records:,} records "
              f"at {rate:,.0f}/s per job", flush=True)
        connect(cluster)
        import ray

        try:
            figures = run_all(cluster, records, rate, scenarios)
        finally:
            ray.shutdown()
    figures["wall_s"] = time.perf_counter() - started
    emit(figures)


if __name__ == "__main__":
    main()
