"""sparkfailover.py: ``spark_actor_failover_s``: kill the Spark side of a detached Spark-fed job; seconds until rows flow.

Used by ``benchmarks.operations``. A detached job reads a Structured Streaming
JSON file source whose Spark side lives with the job
(``from_spark_stream(build, spark=SparkConfig(...))``); a file is written
every half second. Once rows flow, the side's warm standby is up (the
manager starts one once the query ran a micro-batch: a session and Spark's
Python workers) and a checkpoint is taken, the Spark side's actor is killed
(``ray.kill``): the job's manager restarts the job from that checkpoint, its
new Spark side on the standby (no JVM start: that took most of a minute on
a busy small machine). The figure is the time from the kill until the
source emits rows again; expect 10-15 s on a 2-core machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

DRIVER = """
import sys, chiray
from chiray.spark_bridge import SparkConfig, from_spark_stream
root = sys.argv[1]
def build(spark):
    return spark.readStream.schema("k long, v long").json(root + "/in")
src = from_spark_stream(build, checkpoint_location=root + "/query", name="events",
                        spark=SparkConfig(conf={"spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "2"}))
flow = chiray.Dataflow("spark-failover")
flow.source(src, name="events").key_by("k").count(name="count", emit="updates").sink(chiray.collect(), name="out")
chiray.submit(flow, name="spark-failover", detached=True, checkpoint_dir=root + "/chk")
"""


class _Writer(threading.Thread):
    """Writes a small JSON file into ``in/`` every ``interval_s`` until stopped; remembers when each was written."""

    def __init__(self, root: pathlib.Path, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root, self.interval_s = root, interval_s
        self.stopped = threading.Event()
        self.written = 0

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            rows = "\n".join(json.dumps({"k": i % 7, "v": self.written}) for i in range(50))
            tmp = self.root / "in" / f".{self.written}.tmp"
            tmp.write_text(rows)
            tmp.rename(self.root / "in" / f"f{self.written:06d}.json")
            self.written += 1


def _emitted(job: Any) -> int:
    try:
        return int(job.statistics().records_out("events"))
    except Exception:  # the run is being replaced
        return -1


def _spark_actor(suffix: str) -> Any:
    """The job's Spark side (``-spark``) or its standby (``-standby``), or ``None``."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == "chiray-spark" and a["name"].endswith(suffix)]
    return ray.get_actor(names[0], namespace="chiray-spark") if names else None


def _standby_warm(asked: list[Any]) -> bool:
    """Whether the job's standby is warm (its ``warm()`` returns once it is; asked once, in ``asked``)."""
    import ray

    if not asked:
        standby = _spark_actor("-standby")
        if standby is None:
            return False
        asked.append(standby.warm.remote())
    return bool(ray.wait(asked, timeout=0)[0])


def spark_actor_failover_s(env: dict[str, str], root: str, timeout_s: float = 300.0) -> float:
    """Run the job, kill its Spark side once rows flow and its standby is warm; seconds until rows flow again."""
    import ray

    import chiray

    base = pathlib.Path(root) / "spark-failover"
    (base / "in").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", DRIVER, str(base)], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"submitting the Spark-fed job failed: {done.stderr.strip().splitlines()[-1:]}")
    job = chiray.attach("spark-failover")
    writer = _Writer(base)
    writer.start()
    try:
        _wait(lambda: _emitted(job) > 0, timeout_s, "rows to flow")
        asked: list[Any] = []
        _wait(lambda: _standby_warm(asked), timeout_s, "a warm standby")
        job.checkpoint()
        ray.kill(_spark_actor("-spark"))
        killed = time.perf_counter()
        _wait(lambda: "Spark side" in " ".join(job.status().events), timeout_s, "the recovery to start")
        _wait(lambda: _emitted(job) > 0, timeout_s, "rows to flow again")
        return time.perf_counter() - killed
    finally:
        writer.stopped.set()
        job.cancel()
        job.forget()


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"spark_actor_failover_s: no {what} within {timeout_s:.0f} s")
        time.sleep(0.1)
