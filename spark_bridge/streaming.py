"""streaming.py: ``from_spark_stream``: a Structured Streaming DataFrame as a dataflow source.

Each micro-batch is an epoch (epoch = Spark's batch id). The driver's
``foreachBatch`` waits for credit (at most ``max_epochs`` committed epochs
not yet taken) and for a reader of every lane, has the executors push the
batch straight to the lanes' hosts (``push.py``; nothing goes through the
driver or the coordinator), and commits the epoch with the task attempts
Spark reported successful. Spark logs ``offsets/N`` before a batch and
``commits/N`` after it, so a query restarted from its checkpoint re-runs a
batch whose commit was not logged; the coordinator has the epoch already and
ignores it: the dataflow sees every epoch once.

Splits are *lanes*: lane ``l`` gets partition ``q`` of every epoch with
``q % lanes == l``; its offset is the next epoch it needs.

Replay after a dataflow failure: the lanes' data lives in the hosts, which a
failure may kill, so a copy is kept outside them, by Spark: the driver
persists each micro-batch (``DataFrame.persist``, memory and disk, filled by
the push itself) until every lane took it and a dataflow checkpoint covers
it (``Source.checkpoint_complete``), at most ``retain_epochs`` taken ones.
A restored lane registers with its checkpointed offset, and the driver's job
launcher has Spark push that lane's share of each kept epoch again, from the
persisted copy: the same partitions, the same rows, in the same lanes (a
batch Spark re-ran could be partitioned differently, and Ray has no way left
to keep an object alive beyond the process that made it, so neither the
query's offsets nor the hosts can be the copy). Spark's own offset log covers
the other side: a Spark driver restarted from the query's checkpoint re-runs
its last batch, which the coordinator ignores if committed.

Example:
    >>> src = from_spark_stream(spark.readStream.parquet("in/"), checkpoint_location="chk/")  # doctest: +SKIP
    >>> flow.source(src).key_by("key").count(); job = flow.submit(); job.wait()              # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import uuid
from typing import Any

import pyarrow as pa
import ray

from chiray.operators import Source, SourceSplit, SplitReader

from .coordinator import NAMESPACE, StreamCoordinator, kill
from .env import gcs_address, require_pyspark, worker_env
from .epochs import EpochStatistics
from .launcher import JobLauncher
from .push import SUMMARY_SCHEMA, PushTarget, push_partition
from .owned import Owned, check_build, push_target
from .querylog import rollback
from .sparkconfig import SparkConfig
from .sparkside import SideKind, SideSpec
from .readers import CoordinatorLink, LaneReader
from .schema import to_arrow_schema

__all__ = ["OwnedStreamSource", "SparkStreamSource", "ends_by_itself", "from_spark_stream"]

REPUSH_JOBS = 2
"""Spark jobs that push kept epochs again at once (after a restore)."""


def ends_by_itself(trigger: dict[str, Any] | None, until_terminated: bool) -> bool:
    """Whether the source ends when its query does: an ``availableNow`` or ``once`` trigger stops it."""
    return until_terminated and bool(trigger) and any(trigger.get(k) for k in ("availableNow", "once"))  # type: ignore[union-attr]


class _StreamDriver:
    """The driver-only half of a :class:`SparkStreamSource`: the query, the coordinator, the kept copies."""

    def __init__(self, sdf: Any, target: PushTarget, max_epochs: int, retain_epochs: int,
                 checkpoint: str, trigger: dict[str, Any] | None, until_terminated: bool, resume: bool) -> None:
        self.sdf, self.target, self.resume = sdf, target, resume
        self.max_epochs, self.retain_epochs = max_epochs, retain_epochs
        self.checkpoint, self.trigger, self.until_terminated = checkpoint, trigger, until_terminated
        self.coordinator: Any = None
        self.launcher: JobLauncher | None = None
        self.query: Any = None
        self.closing = False
        self.kept: dict[int, Any] = {}  # epoch -> its persisted micro-batch
        self.lock = threading.Lock()

    def free_released(self) -> None:
        """Unpersist the micro-batches no replay can need any more."""
        for epoch in ray.get(self.coordinator.take_released.remote()):
            with self.lock:
                kept = self.kept.pop(epoch, None)
            if kept is not None:
                kept.unpersist()

    def kept_rdd(self, epoch: int) -> Any:
        """The pushing RDD over the kept copy of ``epoch`` (for the job launcher)."""
        with self.lock:
            kept = self.kept.get(epoch)
        if kept is None:
            raise RuntimeError(f"bug in spark_bridge: no kept copy of epoch {epoch} to push again")
        target = dataclasses.replace(self.target, epoch=epoch, generation=None)
        return kept.mapInArrow(functools.partial(push_partition, target), SUMMARY_SCHEMA).rdd


class SparkStreamSource(Source):
    """A streaming DataFrame pushed into the dataflow epoch by epoch (see :func:`from_spark_stream`).

    Driver-side lifecycle: ``splits()`` (at submit) starts the query;
    ``await_termination()``, ``restart()`` (from the same checkpoint),
    ``end()`` (the lanes finish after the last committed epoch) and
    ``close()`` (stop the query, free the kept micro-batches, kill the
    coordinator; idempotent).

    With ``resume`` (the Spark side of a job-owned source, ``sparkside.py``)
    the query starts only once every lane's reader registered, after its logs
    were rolled back to the first epoch those readers need
    (``querylog.rollback``): the dataflow restored from its checkpoint and the
    query restarted from its own meet at that epoch.
    """

    def __init__(self, sdf: Any, target: PushTarget, name: str, lanes: int, max_epochs: int,
                 retain_epochs: int, checkpoint_location: str, trigger: dict[str, Any] | None,
                 until_terminated: bool, resume: bool = False) -> None:
        self._schema, self._name, self._lanes = target.schema, name, lanes
        self._ends = ends_by_itself(trigger, until_terminated)
        self._coordinator = target.coordinator
        self._driver: _StreamDriver | None = _StreamDriver(
            sdf, target, max_epochs, retain_epochs, checkpoint_location, trigger, until_terminated, resume
        )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_driver": None}

    def schema(self) -> pa.Schema:
        return self._schema

    def splits(self) -> list[SourceSplit]:
        d = self._need_driver()
        if d.coordinator is None:
            d.coordinator = StreamCoordinator.options(  # type: ignore[attr-defined]
                name=self._coordinator, namespace=NAMESPACE
            ).remote(self._lanes, d.max_epochs, d.retain_epochs)
            d.launcher = JobLauncher(d.sdf.sparkSession, d.kept_rdd, d.coordinator, self._name,
                                     REPUSH_JOBS, job_per_unit=False)
            d.launcher.start()
            if d.resume:
                threading.Thread(target=self._resume, name=f"{self._name}-resume", daemon=True).start()
            else:
                self.restart()
        return [SourceSplit(f"{self._name}-lane{lane}", lane) for lane in range(self._lanes)]

    def read_ahead(self) -> int:
        """An instance opens all its lanes at once, so that each registers where its partitions go."""
        return self._lanes

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        link = CoordinatorLink(self._coordinator, NAMESPACE)
        return LaneReader(link, self._schema, int(split.payload), 0 if offset is None else int(offset))

    def checkpoint_complete(self, checkpoint_id: int, offsets: dict[str, Any]) -> None:
        """The dataflow checkpointed these lane offsets: epochs before them need no replay any more."""
        prefix = f"{self._name}-lane"
        lanes = {int(s[len(prefix):]): int(o or 0) for s, o in offsets.items() if s.startswith(prefix)}
        if lanes:
            CoordinatorLink(self._coordinator, NAMESPACE).handle().acknowledge.remote(lanes)

    def _need_driver(self) -> _StreamDriver:
        if self._driver is None:
            raise RuntimeError(f"{self._name}: only the driver-side source (not closed) can do this")
        return self._driver

    def _on_batch(self, bdf: Any, batch_id: int) -> None:
        """``foreachBatch`` body (driver): credit, a copy kept by Spark, executor push, commit of the epoch."""
        d = self._need_driver()
        coordinator = d.coordinator
        while not ray.get(coordinator.wait_ready.remote(1.0)):  # back-pressure: Spark's next batch waits
            if d.closing:
                return
        d.free_released()
        generation = ray.get(coordinator.begin.remote(batch_id))
        if generation is None:
            return  # a re-run batch: counted, ignored
        kept = bdf.persist()  # filled by the push below; what a replay pushes again
        with d.lock:
            d.kept[batch_id] = kept
        target = dataclasses.replace(d.target, epoch=batch_id, generation=generation)
        try:
            rows = kept.mapInArrow(functools.partial(push_partition, target), SUMMARY_SCHEMA).collect()
        except BaseException:
            with d.lock:
                d.kept.pop(batch_id, None)
            kept.unpersist()
            raise
        succeeded = [(r["partition"], r["attempt"], r["batches"], r["rows"]) for r in rows if r["complete"]]
        ray.get(coordinator.commit.remote(batch_id, generation, [r["partition"] for r in rows], succeeded))

    def _resume(self) -> None:
        """Wait for every lane's reader, roll the query's logs back to the first epoch they need, start it.

        A failure reaches the lanes (and so the job) through the coordinator.
        """
        d = self._need_driver()
        try:
            offsets = None
            while offsets is None and not d.closing:
                offsets = ray.get(d.coordinator.registered.remote(1.0))
            if offsets is None:
                return
            rollback(d.checkpoint, min(offsets.values()))
            self.restart()
        except Exception as e:
            if not d.closing:
                ray.get(d.coordinator.end.remote(f"restarting the streaming query failed: {type(e).__name__}: {e}"))

    def query(self) -> Any:
        """The running ``StreamingQuery`` (driver only; ``None`` before it started)."""
        return self._need_driver().query

    def restart(self) -> None:
        """(Re)start the streaming query from its checkpoint location."""
        d = self._need_driver()
        writer = d.sdf.writeStream.foreachBatch(self._on_batch).option("checkpointLocation", d.checkpoint)
        if d.trigger:
            writer = writer.trigger(**d.trigger)
        d.query = writer.start()
        if d.until_terminated:
            threading.Thread(target=self._end_after, args=(d.query,), daemon=True).start()

    def _end_after(self, query: Any) -> None:
        error = None
        try:
            query.awaitTermination()
        except Exception as e:  # reaches the lanes, and so Job.wait, through the coordinator
            error = f"the streaming query failed: {type(e).__name__}: {str(e)[:2000]}"
        d = self._driver
        if d is not None and not d.closing:
            ray.get(d.coordinator.end.remote(error))

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the current query run to stop (``availableNow`` triggers stop by themselves).

        Raises:
            pyspark's StreamingQueryException: the query failed.
        """
        query = self._need_driver().query
        if timeout_s is None:
            query.awaitTermination()
            return True
        return bool(query.awaitTermination(timeout_s))

    def end(self) -> None:
        """No more epochs: each lane finishes after the last committed epoch."""
        ray.get(self._need_driver().coordinator.end.remote())

    def statistics(self) -> EpochStatistics:
        return ray.get(self._need_driver().coordinator.statistics.remote())

    def close(self) -> None:
        """Stop the query, free the kept micro-batches and kill the coordinator. Idempotent."""
        d, self._driver = self._driver, None
        if d is None:
            return
        d.closing = True
        if d.query is not None:
            d.query.stop()
        if d.launcher is not None:
            d.launcher.close()
        with d.lock:
            kept, d.kept = list(d.kept.values()), {}
        for df in kept:
            df.unpersist()
        if d.coordinator is not None:
            kill(d.coordinator)

    def __enter__(self) -> SparkStreamSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fed_from_outside(self) -> bool:
        return True  # Spark's tasks push to the readers

    def bounded(self) -> bool | None:
        """``True`` when an ``availableNow`` / ``once`` trigger stops the query and the source ends with it;
        else it cannot tell (``end()`` may end it)."""
        return True if getattr(self, "_ends", False) else None

    def driver_bound(self) -> str | None:
        """Spark's executors push through the bridge's driver half, which lives in the submitting process."""
        return ("from_spark_stream(df) pushes through the SparkSession of the submitting process, which a detached "
                "job outlives; stage the DataFrame instead (from_spark(df, staged=True, path=...)) or "
                "submit without detached=True and keep the driver running")

    def describe(self) -> str:
        return self._name


class OwnedStreamSource(Owned, SparkStreamSource):
    """``from_spark_stream(build, spark=...)``: a streaming query that runs in its job's Spark side (``owned.py``)."""

    def __init__(self, build: Any, spark: SparkConfig, name: str, options: dict[str, Any]) -> None:
        self._own(SideKind.STREAM, build, spark, options, _start_stream)
        self._schema: pa.Schema | None = None  # type: ignore[assignment]
        self._name, self._lanes, self._coordinator = name, int(options["lanes"]), name
        self._ends = ends_by_itself(options["trigger"], options["until_terminated"])
        self._driver = None

    def schema(self) -> pa.Schema | None:
        return self._schema

    def splits(self) -> list[SourceSplit]:
        self._schema, splits = self._start_side()
        return list(splits)

    def statistics(self) -> EpochStatistics:
        return CoordinatorLink(self._coordinator, NAMESPACE).ask("statistics")

    def end(self) -> None:
        """No more epochs: each lane finishes after the last committed epoch."""
        CoordinatorLink(self._coordinator, NAMESPACE).ask("end")


def _start_stream(spec: SideSpec, sdf: Any) -> tuple[SparkStreamSource, pa.Schema]:
    """In the Spark side: the driver-side stream source over ``sdf``, its query resumed once the lanes register."""
    schema = to_arrow_schema(sdf.schema)
    opt = spec.option
    source = SparkStreamSource(sdf, push_target(spec, schema, stream=True), spec.name, opt("lanes"),
                               opt("max_epochs"), opt("retain_epochs"), opt("checkpoint_location"), opt("trigger"),
                               opt("until_terminated"), resume=True)
    return source, schema


def from_spark_stream(
    sdf: Any,
    *,
    checkpoint_location: str,
    trigger: dict[str, Any] | None = None,
    lanes: int = 1,
    max_epochs: int = 2,
    retain_epochs: int = 16,
    until_terminated: bool = True,
    window: int = 4,
    batch_bytes: int = 4 << 20,
    name: str | None = None,
    spark: Any = None,
) -> SparkStreamSource:
    """A source over a Structured Streaming DataFrame; epochs are Spark's micro-batches, each seen once.

    Given a DataFrame, the query runs in this process (the driver), which must
    outlive the job. Given a function that builds the DataFrame from a
    session, the source lives with its job: the job's submit (a detached
    job's manager) starts an actor that makes the session from ``spark``,
    builds the DataFrame and runs the query there; a restarted job restarts
    it, the query rolled back from its checkpoint location to the epoch the
    dataflow's checkpoint needs (exactly once, for Spark's replayable sources
    and a deterministic plan).

    Args:
        sdf: a streaming ``DataFrame`` (``spark.readStream...`` plus preprocessing), or a function
            ``SparkSession -> DataFrame`` that builds it.
        checkpoint_location: the query's checkpoint directory (offset and commit logs).
        trigger: keywords for ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``).
        lanes: source splits; use the source's parallelism.
        max_epochs: committed micro-batches that may wait for the dataflow.
        retain_epochs: micro-batches every lane took that Spark keeps
            (persisted) until the dataflow's checkpoints cover them, so that a
            dataflow restored from its last checkpoint is handed the same
            epochs again (0: no replay). Checkpoint at least once every this
            many micro-batches.
        until_terminated: end the source when the query stops; otherwise call ``end()``.
        window: pushes in flight per Spark task.
        batch_bytes: Arrow batches are re-chunked to about this size.
        name: the source's name (default: a unique one).
        spark: with a build function, how to make its session (a :class:`SparkConfig`; default
            ``SparkConfig()``, a local master).

    Raises:
        TypeError: ``sdf`` is neither a streaming DataFrame nor a function; ``spark`` with a DataFrame.
        ValueError: ``lanes`` other than 1 with a build function (a stream the job owns has one lane).
        UnsupportedSparkType: a column's type has no Arrow mapping (named).

    Example:
        >>> src = from_spark_stream(sdf, checkpoint_location="chk/")  # doctest: +SKIP
        >>> src = from_spark_stream(lambda spark: spark.readStream.schema(s).json("in/"),  # doctest: +SKIP
        ...                         checkpoint_location="s3://bucket/chk/", spark=SparkConfig(master="local[2]"))
    """
    require_pyspark()
    from pyspark.sql import DataFrame

    for arg, value, least in (("lanes", lanes, 1), ("max_epochs", max_epochs, 1), ("window", window, 1),
                              ("batch_bytes", batch_bytes, 1), ("retain_epochs", retain_epochs, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"from_spark_stream: {arg} must be an integer >= {least}, got {value!r}")
    if not isinstance(sdf, DataFrame) and callable(sdf):
        config = check_build("from_spark_stream", sdf, spark)
        if lanes != 1:
            raise ValueError(f"from_spark_stream: a stream built by a function (it lives with its job) has one "
                             f"lane, got lanes={lanes}; Spark's executors still push each micro-batch in parallel")
        options = dict(checkpoint_location=checkpoint_location, trigger=trigger, lanes=lanes, max_epochs=max_epochs,
                       retain_epochs=retain_epochs, until_terminated=until_terminated, window=window,
                       batch_bytes=batch_bytes)
        return OwnedStreamSource(sdf, config, name or f"from_spark_stream-{uuid.uuid4().hex[:8]}", options)
    if spark is not None:
        raise TypeError("from_spark_stream: spark= goes with a build function; a DataFrame has its session already")
    if not isinstance(sdf, DataFrame) or not sdf.isStreaming:
        raise TypeError(
            f"from_spark_stream: expected a streaming DataFrame, got {type(sdf).__name__}"
            + (" (a batch one: use from_spark)" if isinstance(sdf, DataFrame) else "")
        )
    schema = to_arrow_schema(sdf.schema)
    name = name or f"from_spark_stream-{uuid.uuid4().hex[:8]}"
    target = PushTarget(
        gcs_address(), NAMESPACE, name, schema, window, batch_bytes, worker_env(), epoch=None, stream=True
    )
    return SparkStreamSource(
        sdf, target, name, lanes, max_epochs, retain_epochs, checkpoint_location, trigger, until_terminated
    )
