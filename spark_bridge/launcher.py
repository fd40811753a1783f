"""launcher.py: the driver-side loop that has Spark compute the units the coordinator asks for.

One thread long-polls the coordinator's ``launch`` (credit permitting,
wanted units first) and hands the launches to a small pool of job threads.
Each runs one Spark job over exactly those partitions
(``SparkContext.runJob`` on the pushing RDD of the unit's epoch, built once
per epoch so that shuffle output upstream is reused across jobs) and reports
how it ended, with the attempts Spark returned a result for: the successful
ones, which the coordinator then commits at their readers, and the units
whose reader was gone. ``from_spark`` runs one job per unit, which lets the
dataflow take each partition as soon as its task is done, not when the
slowest task of a group is; ``from_spark_stream`` pushes the shares of a
kept micro-batch again in one job per epoch. The generation of a launch
travels to the tasks as a Spark local property, so late attempts of an
older launch are told apart.

Lifecycle: ``NEW --start()--> RUNNING --close()--> CLOSED`` (``close`` cancels
the running Spark jobs; idempotent). Only the driver touches a launcher.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .push import GENERATION_PROPERTY
from .units import Unit

__all__ = ["JobLauncher", "lost_units", "spark_error", "successful_attempts"]

log = logging.getLogger(__name__)


def spark_error(e: BaseException, limit: int = 2000) -> str:
    """A readable, bounded description of a failed Spark job (the Python error if there is one)."""
    text = str(e)
    marker = text.find("PythonException")
    if marker >= 0:
        text = text[marker:]
    return f"{type(e).__name__}: {text[:limit]}"


def successful_attempts(rows: Any) -> list[tuple[Unit, int, int, int]]:
    """``(unit, attempt, num_batches, rows)`` of the complete pushes in the summaries Spark returned."""
    return [
        ((int(r["epoch"]), int(r["partition"])), int(r["attempt"]), int(r["batches"]), int(r["rows"]))
        for r in rows
        if r["complete"]
    ]


def lost_units(rows: Any) -> list[Unit]:
    """The units whose pushes found their reader gone, from the summaries Spark returned."""
    return [(int(r["epoch"]), int(r["partition"])) for r in rows if r["lost"]]


def _drain(rows: Any) -> list[Any]:
    return list(rows)


class JobLauncher:
    """Runs Spark jobs for the units one coordinator launches.

    Args:
        spark: the SparkSession.
        rdd_for: the pushing RDD of an epoch's units (``df.mapInArrow(push).rdd``
            or Spark's Arrow RDD), one task per unit.
        coordinator: the coordinator actor's handle.
        name: the source's name (the Spark job group).
        max_jobs: Spark jobs in flight at once.
        job_per_unit: one Spark job per unit (else one per launch).
    """

    def __init__(self, spark: Any, rdd_for: Callable[[int], Any], coordinator: Any, name: str,
                 max_jobs: int = 4, job_per_unit: bool = True) -> None:
        self._sc = spark.sparkContext
        self._rdd_for = rdd_for
        self._coordinator = coordinator
        self._job_per_unit = job_per_unit
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
                launches = ray.get(self._coordinator.launch.remote(0.2))
            except Exception:  # the coordinator is gone: the source was closed
                if not self._stop.is_set():
                    log.exception("spark_bridge %s: the coordinator went away", self._group)
                return
            for generation, units in launches:
                jobs = [[unit] for unit in units] if self._job_per_unit else [units]
                for job in jobs:  # one job per unit: each commits as soon as its one task succeeded
                    if not self._stop.is_set():
                        self._pool.submit(self._run, generation, job)

    def _run(self, generation: int, units: Sequence[Unit]) -> None:
        import ray

        error, succeeded, lost = None, [], []
        self._sc.setLocalProperty(GENERATION_PROPERTY, str(generation))
        self._sc.setJobGroup(
            self._group, f"chiray {self._group}: units {list(units)}", interruptOnCancel=True
        )
        try:
            rows = self._sc.runJob(self._rdd_for(units[0][0]), _drain, [p for _, p in units])
            succeeded, lost = successful_attempts(rows), lost_units(rows)
        except Exception as e:  # reaches the source instances (and so Job.wait) through the coordinator
            error = spark_error(e)
        if self._stop.is_set():
            return
        try:
            ray.get(self._coordinator.job_done.remote(generation, list(units), error, succeeded, lost))
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
