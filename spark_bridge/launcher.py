"""launcher.py: the driver-side loop that has Spark compute the units the inbox asks for.

One thread long-polls the inbox's ``launch`` (credit permitting, wanted units
first) and hands each unit of the answer to a small pool of job threads. Each
runs one Spark job over exactly that partition (``SparkContext.runJob`` on the
pushing RDD, built once so that shuffle output upstream is reused across
jobs) and reports how it ended, with the attempt Spark returned a result for:
the successful one, which the inbox then commits. One job per unit lets the
dataflow take each partition as soon as its task is done, not when the
slowest task of a group is. The generation of a launch travels to the tasks
as a Spark local property, so late attempts of an older launch are told apart.

Lifecycle: ``NEW --start()--> RUNNING --close()--> CLOSED`` (``close`` cancels
the running Spark jobs; idempotent). Only the driver touches a launcher.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Sequence
from typing import Any

from .push import GENERATION_PROPERTY
from .units import Unit

__all__ = ["JobLauncher", "spark_error", "successful_attempts"]

log = logging.getLogger(__name__)


def spark_error(e: BaseException, limit: int = 2000) -> str:
    """A readable, bounded description of a failed Spark job (the Python error if there is one)."""
    text = str(e)
    marker = text.find("PythonException")
    if marker >= 0:
        text = text[marker:]
    return f"{type(e).__name__}: {text[:limit]}"


def successful_attempts(rows: Any) -> list[tuple[Unit, int, int]]:
    """``(unit, attempt, num_batches)`` from the summaries Spark returned (successful tasks only)."""
    return [
        ((int(r["epoch"]), int(r["partition"])), int(r["attempt"]), int(r["batches"]))
        for r in rows
        if r["complete"]
    ]


def _drain(rows: Any) -> list[Any]:
    return list(rows)


class JobLauncher:
    """Runs Spark jobs for the units one inbox launches.

    Args:
        spark: the SparkSession.
        rdd: the pushing RDD (``df.mapInArrow(push).rdd``), one task per unit.
        inbox: the inbox actor's handle.
        name: the source's name (the Spark job group).
        max_jobs: Spark jobs (so partitions) in flight at once.
    """

    def __init__(self, spark: Any, rdd: Any, inbox: Any, name: str, max_jobs: int = 4) -> None:
        self._sc = spark.sparkContext
        self._rdd = rdd
        self._inbox = inbox
        self._group = name
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_jobs, thread_name_prefix=f"{name}-job"
        )
        self._thread = threading.Thread(target=self._loop, name=f"{name}-launcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                generation, units = ray.get(self._inbox.launch.remote(0.2))
            except Exception:  # the inbox is gone: the source was closed
                if not self._stop.is_set():
                    log.exception("spark_bridge %s: the inbox went away", self._group)
                return
            for unit in units:  # one job per unit: each commits as soon as its one task succeeded
                if not self._stop.is_set():
                    self._pool.submit(self._run, generation, [unit])

    def _run(self, generation: int, units: Sequence[Unit]) -> None:
        import ray

        error, succeeded = None, []
        self._sc.setLocalProperty(GENERATION_PROPERTY, str(generation))
        self._sc.setJobGroup(
            self._group, f"chiray {self._group}: partitions {[p for _, p in units]}", interruptOnCancel=True
        )
        try:
            rows = self._sc.runJob(self._rdd, _drain, [p for _, p in units])
            succeeded = successful_attempts(rows)
        except Exception as e:  # reaches the source instances (and so Job.wait) through the inbox
            error = spark_error(e)
        if self._stop.is_set():
            return
        try:
            ray.get(self._inbox.job_done.remote(generation, list(units), error, succeeded))
        except Exception:
            log.exception("spark_bridge %s: could not report a finished Spark job", self._group)

    def close(self) -> None:
        """Stop launching, cancel running Spark jobs, wait for the threads. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self._sc.cancelJobGroup(self._group)
        except Exception:
            log.debug("spark_bridge %s: cancelJobGroup failed (Spark stopped?)", self._group, exc_info=True)
        if self._thread.ident is not None:
            self._thread.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)
