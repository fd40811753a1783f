"""source.py: ``from_spark``: a batch DataFrame as a dataflow source, pushed by Spark's executors.

Data path: each Spark task pushes its partition's Arrow batches straight to
the host actor process that runs the source instance which will read that
partition (a *unit*; ``push.py``, ``readers.py``); a small coordinator actor
(``coordinator.py``) only keeps the directory of where each unit goes, the
credit, and the commit decisions. No row passes through the Spark driver or
the coordinator, so on a multi-node deployment the data goes from Spark's
executors to the source instances' nodes, wherever those are. A source
instance opens the readers of its next ``max_units`` splits early, so that
Spark can compute them ahead of the one it reads.

Offsets: split ``p`` is partition ``p`` of the DataFrame; its offset is 0
(not taken) or 1 (taken). A checkpoint therefore never holds part of a
partition, and a replay after a dataflow failure has Spark recompute whole
partitions from the DataFrame's lineage (so the plan must be deterministic,
or use ``staged=True``). A unit committed to a reader whose host then died
is recomputed the same way, for the reader that takes its place: data a
reader held is not kept elsewhere, because Spark can always compute it again.

Example:
    >>> src = from_spark(spark.range(1000).selectExpr("id % 7 AS k"))   # doctest: +SKIP
    >>> flow.source(src, parallelism=2).key_by("k").count()              # doctest: +SKIP
    >>> job = flow.submit(); job.wait(); src.close()                     # doctest: +SKIP
"""

from __future__ import annotations

import functools
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from .staged import StagedSource

from chiray.operators import Source, SourceSplit, SplitReader

from .env import gcs_address, require_pyspark, worker_env
from .push import SUMMARY_SCHEMA, PushTarget, push_ipc_partition, push_partition
from .coordinator import NAMESPACE
from .owned import Owned, OwnedStagedSource, check_build, push_target
from .readers import CoordinatorLink, UnitReader
from .schema import to_arrow_schema
from .sparkconfig import SparkConfig
from .sparkside import SideKind, SideSpec
from .units import BufferStatistics

__all__ = ["OwnedBatchSource", "SparkSource", "from_spark", "release_warm_coordinators"]


class _Driver:
    """The driver-only half of a :class:`SparkSource`: the DataFrame, the coordinator, the launcher."""

    def __init__(
        self,
        df: Any,
        rdd: Any,
        target: PushTarget,
        max_units: int,
        max_jobs: int,
        warm: Any,
        keep_warm: bool,
    ) -> None:
        self.df, self.rdd, self.target = df, rdd, target
        self.max_units, self.max_jobs = max_units, max_jobs
        self.warm, self.keep_warm = warm, keep_warm
        self.coordinator: Any = None
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
    ``close()`` stops Spark jobs and kills the coordinator actor (idempotent);
    call it after the job ended.
    """

    def __init__(
        self,
        df: Any,
        schema: pa.Schema,
        target: PushTarget,
        name: str,
        max_units: int,
        max_jobs: int,
        warm: Any = None,
        keep_warm: bool = False,
    ) -> None:
        self._schema = schema
        self._name = name
        self._coordinator = target.coordinator
        self._namespace = target.namespace
        self._read_ahead = max_units
        rdd = _spark_arrow_rdd(df, target)
        if rdd is None:
            rdd = df.mapInArrow(functools.partial(push_partition, target), SUMMARY_SCHEMA).rdd
        self._num_partitions = int(rdd.getNumPartitions())
        self._driver: _Driver | None = _Driver(df, rdd, target, max_units, max_jobs, warm, keep_warm)

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

    def read_ahead(self) -> int:
        """An instance opens its next ``max_units`` splits early: their readers register where to push."""
        return self._read_ahead

    def _start(self) -> None:
        """Create the coordinator and start launching Spark jobs (once; on the driver)."""
        from .coordinator import UnitCoordinator
        from .launcher import JobLauncher

        driver = self._driver
        if driver is None:
            raise RuntimeError(
                f"{self._name}: splits() needs the driver-side source (it was pickled or closed)"
            )
        if driver.coordinator is not None:
            return
        units = [(0, p) for p in range(self._num_partitions)]
        if driver.warm is not None:
            driver.coordinator, driver.warm = driver.warm, None
            driver.coordinator.configure.remote(units, driver.max_units)
        else:
            driver.coordinator = UnitCoordinator.options(  # type: ignore[attr-defined]
                name=self._coordinator, namespace=self._namespace
            ).remote(units, driver.max_units)
        rdd = driver.rdd
        driver.launcher = JobLauncher(
            driver.df.sparkSession, lambda epoch: rdd, driver.coordinator, self._name, driver.max_jobs
        )
        driver.launcher.start()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        if offset not in (None, 0, 1):
            raise ValueError(
                f"{self._name}: offset of split {split.split_id!r} must be 0 or 1, got {offset!r}"
            )
        link = CoordinatorLink(self._coordinator, self._namespace)
        return UnitReader(link, self._schema, tuple(split.payload), bool(offset))  # type: ignore[arg-type]

    def statistics(self) -> BufferStatistics:
        """The hand-off's counters (driver only, after ``submit``)."""
        import ray

        if self._driver is None or self._driver.coordinator is None:
            raise RuntimeError(
                f"{self._name}: statistics() is available on the driver once the job was submitted"
            )
        return ray.get(self._driver.coordinator.statistics.remote())

    def close(self) -> None:
        """Cancel Spark jobs and kill the coordinator actor. Idempotent."""
        from .coordinator import kill, start_warm_coordinator

        driver, self._driver = self._driver, None
        if driver is None:
            return
        if driver.launcher is not None:
            driver.launcher.close()
        for coordinator in (driver.coordinator, driver.warm):
            if coordinator is not None:
                kill(coordinator)
        if driver.keep_warm:
            start_warm_coordinator()

    def __enter__(self) -> SparkSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fed_from_outside(self) -> bool:
        return True  # Spark's tasks push to the readers

    def bounded(self) -> bool:
        return True  # a batch DataFrame

    def driver_bound(self) -> str | None:
        """Spark's executors push through the bridge's driver half, which lives in the submitting process."""
        return ("from_spark(df) pushes through the SparkSession of the submitting process, which a detached "
                "job outlives; stage the DataFrame instead (from_spark(df, staged=True, path=...)) or "
                "submit without detached=True and keep the driver running")

    def describe(self) -> str:
        return self._name


class OwnedBatchSource(Owned, SparkSource):
    """``from_spark(build, spark=...)``: a batch DataFrame that its job's Spark side pushes (``owned.py``)."""

    def __init__(self, build: Any, spark: SparkConfig, name: str, options: dict[str, Any]) -> None:
        self._own(SideKind.BATCH, build, spark, options, _start_batch)
        self._schema: pa.Schema | None = None  # type: ignore[assignment]
        self._name, self._coordinator, self._namespace = name, name, NAMESPACE
        self._read_ahead = int(options["max_units"])
        self._num_partitions = 0
        self._driver = None

    def schema(self) -> pa.Schema | None:
        return self._schema

    def splits(self) -> list[SourceSplit]:
        self._schema, splits = self._start_side()
        self._num_partitions = len(splits)
        return list(splits)

    def statistics(self) -> BufferStatistics:
        return CoordinatorLink(self._coordinator, self._namespace).ask("statistics")


def _start_batch(spec: SideSpec, df: Any) -> tuple[SparkSource, pa.Schema]:
    """In the Spark side: the driver-side source over ``df`` (Spark jobs start at its ``splits()``)."""
    schema = to_arrow_schema(df.schema)
    target = push_target(spec, schema, stream=False)
    return SparkSource(df, schema, target, spec.name, spec.option("max_units"), spec.option("max_jobs")), schema


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
    spark: Any = None,
) -> SparkSource | StagedSource | OwnedStagedSource:
    """A source over a Spark DataFrame, fed by Spark's executors.

    Given a DataFrame, its driver side (coordinator, Spark jobs; or the
    staging) runs in this process. Given a function that builds the DataFrame
    from a session, the source lives with its job: the job's submit (a
    detached job's manager) starts an actor that makes the session from
    ``spark`` and runs the driver side there (staged mode: stages the data
    once, then stops it; a restarted job reads what was staged).

    Push mode (default): Spark computes partitions on demand, at most
    ``max_units`` ahead of the dataflow; each task pushes its Arrow batches to
    the source (``window`` pushes in flight); the first complete attempt of a
    partition is the one the dataflow sees (task retries and speculative
    attempts are dropped). Each task pushes straight to the host of the
    source instance that reads its partition. Replay recomputes whole
    partitions from lineage.

    Staged mode (``staged=True``): Spark's executors write one Arrow IPC file
    per partition under ``path`` (a directory or ``pyarrow.fs`` URI) when the
    job is submitted; source instances read the files with exact batch
    offsets, even after Spark is gone (see :func:`staged.from_staged`).

    Args:
        df: a batch ``pyspark.sql.DataFrame`` (for streaming ones use
            :func:`streaming.from_spark_stream`), or a function ``SparkSession -> DataFrame``.
        staged: stage to files instead of pushing.
        path: where staged files go (required with ``staged=True``).
        max_units: push mode's credit, in partitions computed ahead.
        window: push mode's pushes in flight per Spark task.
        batch_bytes: Arrow batches are re-chunked to about this size.
        max_jobs: push mode's Spark jobs in flight (one per partition; Spark
            runs as many of them at once as it has task slots).
        name: the source's name (default: a unique one).
        keep_warm: push mode: ``close()`` starts a bare coordinator actor for
            the next ``from_spark`` of this driver (any ``from_spark`` takes a
            warm one if there is one), so that it does not wait for a process
            to start; ``spark_bridge.release_warm_coordinators()`` stops it.
        spark: with a build function, how to make its session (a :class:`SparkConfig`; default
            ``SparkConfig()``, a local master).

    Returns:
        A :class:`SparkSource` (push) or a staged source; close it after the job.

    Raises:
        UnsupportedSparkType: a column's type has no Arrow mapping (named).
        TypeError: ``df`` is neither a batch DataFrame nor a function; ``spark`` with a DataFrame.
        RuntimeError: Ray is not running in this process.

    Example:
        >>> src = from_spark(spark.read.parquet("events/").where("v > 0"))  # doctest: +SKIP
    """
    require_pyspark()
    from pyspark.sql import DataFrame

    for arg, value in (
        ("max_units", max_units),
        ("window", window),
        ("batch_bytes", batch_bytes),
        ("max_jobs", max_jobs),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"from_spark: {arg} must be a positive integer, got {value!r}")
    if staged and path is None:
        raise ValueError("from_spark: staged=True needs path= (a directory or a pyarrow.fs URI)")
    if not isinstance(df, DataFrame) and callable(df):
        return _owned(df, spark, staged, path, max_units, window, batch_bytes, max_jobs, name)
    if spark is not None:
        raise TypeError("from_spark: spark= goes with a build function; a DataFrame has its session already")
    if not isinstance(df, DataFrame):
        raise TypeError(f"from_spark: expected a pyspark.sql.DataFrame, got {type(df).__name__}")
    if df.isStreaming:
        raise TypeError("from_spark: this DataFrame is a streaming one; use from_spark_stream")
    if not isinstance(keep_warm, bool):
        raise TypeError(f"from_spark: keep_warm must be a bool, got {keep_warm!r}")
    schema = to_arrow_schema(df.schema)
    name = name or f"from_spark-{uuid.uuid4().hex[:8]}"
    if staged:
        from .staged import stage

        return stage(df, schema, str(path), name=name, batch_bytes=batch_bytes)
    from .coordinator import take_warm_coordinator

    warm = take_warm_coordinator()
    coordinator_name, warm_handle = warm if warm is not None else (name, None)
    target = PushTarget(gcs_address(), NAMESPACE, coordinator_name, schema, window, batch_bytes, worker_env())
    return SparkSource(df, schema, target, name, max_units, max_jobs, warm_handle, keep_warm)


def _owned(build: Any, spark: Any, staged: bool, path: str | None, max_units: int, window: int, batch_bytes: int,
           max_jobs: int, name: str | None) -> SparkSource | OwnedStagedSource:
    """``from_spark(build, ...)``: a source whose Spark side the job starts and owns (``owned.py``)."""
    config = check_build("from_spark", build, spark)
    name = name or f"from_spark-{uuid.uuid4().hex[:8]}"
    if staged:
        return OwnedStagedSource(build, config, name, {"path": path, "batch_bytes": batch_bytes})
    options = {"max_units": max_units, "window": window, "batch_bytes": batch_bytes, "max_jobs": max_jobs}
    return OwnedBatchSource(build, config, name, options)


def release_warm_coordinators() -> int:
    """Stop the warm coordinator actor this driver keeps (``from_spark(keep_warm=True)``); returns how many."""
    from .coordinator import release_warm_coordinators as release

    return release()


"""The earlier name of :func:`release_warm_coordinators`."""
