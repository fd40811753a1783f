"""Run by test_node_failure: a head and two worker nodes; remove the node of a stateful host mid-stream.

Prints ``RESULT <json>`` and exits 0 when the job recovered on the remaining
nodes with an exact result. Starts and stops its own simulated cluster.
"""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster

from chiray.operators import Dataflow, generate
from tests.oracles import key_counts, output_counts
from tests.waiting import wait_for

N = 80_000


def main() -> int:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0,  # the head holds the controller only; hosts need a CPU share
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    })
    workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
    try:
        ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
        src = generate(N, rate=20_000, batch_size=1000, num_keys=200, num_splits=2, seed=5)
        flow = Dataflow("node-failure")
        (flow.source(src, parallelism=2, name="src")
             .key_by("key").count(parallelism=2, name="count").collect(name="out"))
        job = flow.submit(checkpoint_interval_s=0.5, poll_interval_s=0.2, host_num_cpus=0.5,
                          host_options={"scheduling_strategy": "SPREAD"})
        wait_for(lambda: job.statistics().records_out("src") >= N * 0.3, 120, "30 % of the input emitted")
        victim = ray.get(job.actors[0].node_id.remote())  # the node of keyed instance count[0]
        node = next(w for w in workers if w.node_id == victim)
        cluster.remove_node(node, allow_graceful=False)
        job.wait(timeout=240)
        got, expected = output_counts(job.result()), key_counts(src)
        events = list(job.status().events)
        print("RESULT " + json.dumps({"exact": got == expected, "events": events}), flush=True)
        return 0 if got == expected and any(e.startswith("recovered") for e in events) else 1
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
