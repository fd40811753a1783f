"""common.py: helpers shared by benchmarks: argument parsing, Ray start, memory sampling, the JSON line."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, Iterable, Iterator

import psutil

__all__ = ["start_ray", "stop_ray", "spark_for_benchmark", "RssSampler", "emit", "key_counts"]


def start_ray(num_cpus: int | None = None, ray_metrics: bool = True) -> bool:
    """A private local Ray (never attaches to another cluster on the machine); True if this call started it.

    A process that has Ray already (the test suite runs every benchmark at a tiny size, in its own
    process, on its session's Ray) keeps it as it is: ``num_cpus`` and ``ray_metrics`` then do nothing,
    and ``stop_ray`` leaves it running.

    ``ray_metrics=False``: Ray collects no metrics (``RAY_enable_metrics_collection=0``, for the
    processes this Ray starts). Every 10 s Ray's metrics agent aggregates the workers' metrics: on
    this 2-core machine 150-250 ms of one core, and each time the job's record latency jumped by up to
    a hundred ms (a benchmark of max latency measured that agent, not the job). A job's own metrics
    (``JobConfig.metrics_interval_s``) go through Ray's and are off with it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    if not ray_metrics:
        os.environ["RAY_enable_metrics_collection"] = "0"  # the processes ray.init starts inherit it
    # A process that may not write bytecode (PYTHONDONTWRITEBYTECODE) compiles chiray's modules again
    # whenever it starts: each host process of a job took 0.9 s instead of 0.3 s to import them here, in
    # every start, restore and recovery a benchmark times. Its Ray's processes write and read __pycache__
    # (ignored by git), as those of an installed package do (the Makefile's tests do the same).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    # "local": a new instance even while a ray.cluster_utils.Cluster of another process is alive (ray.init()
    # would connect to the one named in /tmp/ray/ray_current_cluster).
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR")
    return True


def stop_ray(started: bool) -> None:
    """Stop the Ray that ``start_ray`` started (``started``), and no other."""
    if started:
        import ray

        ray.shutdown()


@contextlib.contextmanager
def spark_for_benchmark(cores: int, app_name: str, conf: dict[str, str], master: str | None = None) -> Iterator[Any]:
    """A SparkSession for one benchmark: this process's active one if it has one (left running), else a new
    one, stopped at the end."""
    from pyspark.sql import SparkSession

    from chiray.spark_bridge import spark_session

    active = SparkSession.getActiveSession()
    spark = active or spark_session(cores, app_name=app_name, conf=conf, master=master)
    try:
        yield spark
    finally:
        if active is None:
            spark.stop()


class RssSampler:
    """Samples the summed RSS of some processes every ``interval`` seconds; ``peak_mb`` is the maximum,
    ``growth_mb`` how far it rose above the first sample."""

    def __init__(self, pids: Iterable[int], interval: float = 0.05):
        self.procs = [psutil.Process(p) for p in pids]
        self.interval = interval
        self.peak = 0
        self.first: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for proc in self.procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            if self.first is None:
                self.first = total
            time.sleep(self.interval)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return round(self.peak / 2**20, 1)

    @property
    def growth_mb(self) -> float:
        return round((self.peak - (self.first or self.peak)) / 2**20, 1)


def emit(figures: dict[str, Any]) -> None:
    """Print the benchmark's one closing JSON line."""
    print(json.dumps(figures, sort_keys=False))


def key_counts(source: Any, column: str = "key") -> Any:
    """Records per key of a replayable source, read straight from its splits (an oracle): a pandas Series."""
    import pyarrow as pa

    tables = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:  # pacing is advisory: read at once
            tables.append(pa.Table.from_batches([batch]).select([column]))
    return pa.concat_tables(tables).to_pandas().groupby(column).size().sort_index()
