"""source.py: ``from_spark``: a batch DataFrame as a dataflow source, pushed by Spark's executors.

Data path: each Spark task pushes its partition's Arrow batches straight to
the source's inbox actor (``push.py``); a source instance takes a partition
(a *unit*) once one attempt has committed it, as one batch. Nothing passes
through the Spark driver.

Offsets: split ``p`` is partition ``p`` of the DataFrame; its offset is 0
(not taken) or 1 (taken). A checkpoint therefore never holds part of a
partition, and a replay after a dataflow failure has Spark recompute whole
partitions from the DataFrame's lineage (so the plan must be deterministic,
or use ``staged=True``).

Example:
    >>> src = from_spark(spark.range(1000).selectExpr("id % 7 AS k"))   # doctest: +SKIP
    >>> flow.source(src, parallelism=2).key_by("k").count()              # doctest: +SKIP
    >>> job = flow.submit(); job.wait(); src.close()                     # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from typing import Any

import pyarrow as pa

from operators import Source, SourceSplit, SplitReader

from .env import gcs_address, require_pyspark, worker_env
from .push import SUMMARY_SCHEMA, PushTarget, decode, push_ipc_partition, push_partition
from .schema import to_arrow_schema
from .staged import StagedSource
from .units import BufferStatistics

__all__ = ["POLL_S", "SparkSource", "from_spark", "release_warm_inboxes"]

POLL_S = 0.005  # how often an idle source instance checks whether its unit has arrived

_handles: dict[tuple[str, str], Any] = {}


def _inbox_handle(name: str, namespace: str) -> Any:
    import ray

    key = (name, namespace)
    if key not in _handles:
        _handles[key] = ray.get_actor(name, namespace=namespace)
    return _handles[key]


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    """A batch with no rows: "nothing yet" to the host (it emits no empty batch); ``None`` means "done"."""
    return pa.RecordBatch.from_pylist([], schema=schema)


class ReadyPoll:
    """Whether a pending Ray call has returned, as ``SplitReader.ready_at`` must report it.

    The host asks ``ready_at`` twice in a row (is it due? when to wake?); the
    answer may only change at the wake-up time it gave, or a call that returns
    between the two questions would leave the source with no timer at all.
    """

    def __init__(self) -> None:
        self._ref: Any = None
        self._ready = False
        self._next_check = 0.0

    def watch(self, ref: Any) -> None:
        self._ref, self._ready, self._next_check = ref, False, 0.0

    def ready_at(self) -> float | None:
        """``None`` once the call returned (and from then on), else the next time to look."""
        import ray

        if self._ready or self._ref is None:
            return None
        now = time.monotonic()
        if now < self._next_check:
            return self._next_check
        if ray.wait([self._ref], timeout=0)[0]:
            self._ready = True
            return None
        self._next_check = now + POLL_S
        return self._next_check

    def result(self) -> Any:
        """The call's value; only after ``ready_at()`` answered ``None``, so it never waits."""
        import ray

        # Readers run inside the host's asyncio loop, where Ray warns of every get; this one cannot block.
        os.environ.setdefault("RAY_WARN_BLOCKING_GET_INSIDE_ASYNC", "0")
        return ray.get(self._ref)


class _UnitReader(SplitReader):
    """Takes one unit from the inbox without blocking the host's loop; offset 0 or 1.

    ``read`` returns an empty batch while the unit is not there yet (the host emits nothing for it).
    """

    def __init__(self, source: SparkSource, unit: tuple[int, int], taken: bool) -> None:
        self._schema = source._schema
        self._taken = taken
        self._pending = None if taken else _inbox_handle(source._inbox, source._namespace).take.remote(unit)
        self._poll = ReadyPoll()
        self._poll.watch(self._pending)

    def ready_at(self) -> float | None:
        return self._poll.ready_at()

    def read(self) -> pa.RecordBatch | None:
        if self._pending is None:
            return None
        if self._poll.ready_at() is not None:  # not yet: an empty batch (never emitted) instead of blocking the host
            return _empty(self._schema)
        data = self._poll.result()
        self._pending, self._taken = None, True
        batches = [b for chunk in data for b in decode(chunk)]
        if not batches:
            return None
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

    def offset(self) -> int:
        return int(self._taken)

    def close(self) -> None:
        self._pending = None


class _Driver:
    """The driver-only half of a :class:`SparkSource`: the DataFrame, the inbox, the launcher."""

    def __init__(
        self,
        df: Any,
        rdd: Any,
        target: PushTarget,
        max_units: int,
        max_jobs: int,
        warm_inbox: Any,
        keep_warm: bool,
    ) -> None:
        self.df, self.rdd, self.target = df, rdd, target
        self.max_units, self.max_jobs = max_units, max_jobs
        self.warm_inbox, self.keep_warm = warm_inbox, keep_warm
        self.inbox: Any = None
        self.launcher: Any = None


def _spark_arrow_rdd(df: Any, target: PushTarget) -> Any:
    """The pushing RDD over Spark's own executor-side Arrow conversion, or ``None`` where there is none.

    ``Dataset.toArrowBatchRdd`` (a JVM method PySpark does not wrap; ``toArrow()``
    uses the same conversion) turns each partition's rows into Arrow
    record-batch messages on the executors; a Python RDD over it hands them to
    ``push_ipc_partition`` as bytes. Measured here on 5M rows, 2 cores: about
    half the CPU of ``mapInArrow``, whose Python-UDF runner costs the JVM more
    than the conversion itself. The messages carry no schema: it is derived
    from the Spark schema with the session's time zone and large-type setting,
    as the JVM does, read when the RDD is built (and each batch is validated
    against it). Spark Connect DataFrames (no JVM handle) and Sparks without the
    method get ``None``, and the caller falls back to ``mapInArrow``.
    """
    try:
        from pyspark.rdd import RDD
        from pyspark.serializers import NoOpSerializer
        from pyspark.sql.pandas.types import to_arrow_schema as spark_arrow_schema

        jrdd = df._jdf.toArrowBatchRdd().toJavaRDD()
        time_zone, large = df.sparkSession._jconf.getConfs(
            ["spark.sql.session.timeZone", "spark.sql.execution.arrow.useLargeVarTypes"]
        )
        spark_schema = spark_arrow_schema(
            df.schema, timezone=str(time_zone), prefers_large_types=str(large) == "true"
        )
    except Exception:  # no JVM handle (Spark Connect) or no such method: mapInArrow it is
        return None
    messages = RDD(jrdd, df.sparkSession.sparkContext, NoOpSerializer())
    return messages.mapPartitions(functools.partial(push_ipc_partition, target, spark_schema))


class SparkSource(Source):
    """A batch DataFrame pushed into the dataflow by Spark's executors (see :func:`from_spark`).

    The object is pickled into the source instances without its driver half.
    ``close()`` stops Spark jobs and kills the inbox actor (idempotent); call it
    after the job ended.
    """

    def __init__(
        self,
        df: Any,
        schema: pa.Schema,
        target: PushTarget,
        name: str,
        max_units: int,
        max_jobs: int,
        warm_inbox: Any = None,
        keep_warm: bool = False,
    ) -> None:
        self._schema = schema
        self._name = name
        self._inbox = target.inbox
        self._namespace = target.namespace
        rdd = _spark_arrow_rdd(df, target)
        if rdd is None:
            rdd = df.mapInArrow(functools.partial(push_partition, target), SUMMARY_SCHEMA).rdd
        self._num_partitions = int(rdd.getNumPartitions())
        self._driver: _Driver | None = _Driver(df, rdd, target, max_units, max_jobs, warm_inbox, keep_warm)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver"] = None
        return state

    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def splits(self) -> list[SourceSplit]:
        self._start()
        return [SourceSplit(f"{self._name}-p{p}", (0, p)) for p in range(self._num_partitions)]

    def _start(self) -> None:
        """Create the inbox and start launching Spark jobs (once; on the driver)."""
        from .inbox import SparkInbox
        from .launcher import JobLauncher

        driver = self._driver
        if driver is None:
            raise RuntimeError(
                f"{self._name}: splits() needs the driver-side source (it was pickled or closed)"
            )
        if driver.inbox is not None:
            return
        units = [(0, p) for p in range(self._num_partitions)]
        if driver.warm_inbox is not None:
            driver.inbox, driver.warm_inbox = driver.warm_inbox, None
            driver.inbox.configure.remote(units, driver.max_units)
        else:
            driver.inbox = SparkInbox.options(  # type: ignore[attr-defined]
                name=self._inbox, namespace=self._namespace
            ).remote(units, driver.max_units)
        driver.launcher = JobLauncher(
            driver.df.sparkSession, driver.rdd, driver.inbox, self._name, driver.max_jobs
        )
        driver.launcher.start()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        if offset not in (None, 0, 1):
            raise ValueError(
                f"{self._name}: offset of split {split.split_id!r} must be 0 or 1, got {offset!r}"
            )
        return _UnitReader(self, tuple(split.payload), bool(offset))  # type: ignore[arg-type]

    def statistics(self) -> BufferStatistics:
        """The hand-off buffer's counters (driver only, after ``submit``)."""
        import ray

        if self._driver is None or self._driver.inbox is None:
            raise RuntimeError(
                f"{self._name}: statistics() is available on the driver once the job was submitted"
            )
        return ray.get(self._driver.inbox.statistics.remote())

    def close(self) -> None:
        """Cancel Spark jobs and kill the inbox actor. Idempotent."""
        import ray

        driver, self._driver = self._driver, None
        if driver is None:
            return
        if driver.launcher is not None:
            driver.launcher.close()
        for inbox in (driver.inbox, driver.warm_inbox):
            if inbox is not None:
                ray.kill(inbox, no_restart=True)
        if driver.keep_warm:
            from .inbox import start_warm_inbox

            start_warm_inbox()

    def __enter__(self) -> SparkSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        return self._name


def from_spark(
    df: Any,
    *,
    staged: bool = False,
    path: str | None = None,
    max_units: int = 4,
    window: int = 4,
    batch_bytes: int = 4 << 20,
    max_jobs: int = 4,
    name: str | None = None,
    keep_warm: bool = False,
) -> SparkSource | StagedSource:
    """A source over a Spark DataFrame, fed by Spark's executors.

    Push mode (default): Spark computes partitions on demand, at most
    ``max_units`` ahead of the dataflow; each task pushes its Arrow batches to
    the source (``window`` pushes in flight); the first complete attempt of a
    partition is the one the dataflow sees (task retries and speculative
    attempts are dropped). Replay recomputes whole partitions from lineage.

    Staged mode (``staged=True``): Spark's executors write one Arrow IPC file
    per partition under ``path`` (a directory or ``pyarrow.fs`` URI) when the
    job is submitted; source instances read the files with exact batch
    offsets, even after Spark is gone (see :func:`staged.from_staged`).

    Args:
        df: a batch ``pyspark.sql.DataFrame`` (for streaming ones use
            :func:`streaming.from_spark_stream`).
        staged: stage to files instead of pushing.
        path: where staged files go (required with ``staged=True``).
        max_units: push mode's credit, in partitions computed ahead.
        window: push mode's pushes in flight per Spark task.
        batch_bytes: Arrow batches are re-chunked to about this size.
        max_jobs: push mode's Spark jobs in flight (one per partition; Spark
            runs as many of them at once as it has task slots).
        name: the source's name (default: a unique one).
        keep_warm: push mode: ``close()`` starts a bare inbox actor for the
            next ``from_spark`` of this driver (any ``from_spark`` takes a
            warm one if there is one), so that it does not wait for a process
            to start; ``spark_bridge.release_warm_inboxes()`` stops it.

    Returns:
        A :class:`SparkSource` (push) or a staged source; close it after the job.

    Raises:
        UnsupportedSparkType: a column's type has no Arrow mapping (named).
        TypeError: ``df`` is not a batch DataFrame.
        RuntimeError: Ray is not running in this process.

    Example:
        >>> src = from_spark(spark.read.parquet("events/").where("v > 0"))  # doctest: +SKIP
    """
    require_pyspark()
    from pyspark.sql import DataFrame

    if not isinstance(df, DataFrame):
        raise TypeError(f"from_spark: expected a pyspark.sql.DataFrame, got {type(df).__name__}")
    if df.isStreaming:
        raise TypeError("from_spark: this DataFrame is a streaming one; use from_spark_stream")
    if not isinstance(keep_warm, bool):
        raise TypeError(f"from_spark: keep_warm must be a bool, got {keep_warm!r}")
    for arg, value in (
        ("max_units", max_units),
        ("window", window),
        ("batch_bytes", batch_bytes),
        ("max_jobs", max_jobs),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"from_spark: {arg} must be a positive integer, got {value!r}")
    schema = to_arrow_schema(df.schema)
    name = name or f"from_spark-{uuid.uuid4().hex[:8]}"
    if staged:
        from .staged import stage

        if path is None:
            raise ValueError("from_spark: staged=True needs path= (a directory or a pyarrow.fs URI)")
        return stage(df, schema, path, name=name, batch_bytes=batch_bytes)
    from .inbox import NAMESPACE, take_warm_inbox

    warm = take_warm_inbox()
    inbox_name, warm_inbox = warm if warm is not None else (name, None)
    target = PushTarget(gcs_address(), NAMESPACE, inbox_name, schema, window, batch_bytes, worker_env())
    return SparkSource(df, schema, target, name, max_units, max_jobs, warm_inbox, keep_warm)


def release_warm_inboxes() -> int:
    """Stop the warm inbox actor this driver keeps (``from_spark(keep_warm=True)``); returns how many."""
    from .inbox import kill_warm_inboxes

    return kill_warm_inboxes()
