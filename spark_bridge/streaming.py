"""streaming.py: ``from_spark_stream``: a Structured Streaming DataFrame as a dataflow source.

Each micro-batch is an epoch (epoch = Spark's batch id). The driver's
``foreachBatch`` waits for credit (at most ``max_epochs`` committed epochs
not yet taken), has the executors push the batch (``push.py``, nothing goes
through the driver), and commits the epoch with the task attempts Spark
reported successful. Spark logs ``offsets/N`` before a batch and
``commits/N`` after it, so a query restarted from its checkpoint re-runs a
batch whose commit was not logged; the inbox has the epoch already and
ignores it: the dataflow sees every epoch once.

Splits are *lanes*: lane ``l`` gets partition ``q`` of every epoch with
``q % lanes == l``; its offset is the next epoch it needs.

Replay after a dataflow failure: the inbox keeps the epochs every lane took
until a dataflow checkpoint covers them (``Source.checkpoint_complete``), at
most ``retain_epochs`` of them; the restored lanes ask again from their
checkpointed offsets and get the same epochs, byte for byte. Spark's own
offset log covers the other side: a Spark driver restarted from the query's
checkpoint re-runs its last batch, which the inbox ignores if committed.

Example:
    >>> src = from_spark_stream(spark.readStream.parquet("in/"), checkpoint_location="chk/")  # doctest: +SKIP
    >>> flow.source(src).key_by("key").count(); job = flow.submit(); job.wait()              # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import ray

from operators import Source, SourceSplit, SplitReader

from .env import gcs_address, require_pyspark, worker_env
from .epochs import END, EpochBuffer, EpochStatistics
from .inbox import NAMESPACE
from .push import SUMMARY_SCHEMA, PushTarget, decode, push_partition
from .schema import to_arrow_schema
from .inbox import Changes
from .source import ReadyPoll, _empty, _inbox_handle

__all__ = ["SparkStreamSource", "StreamInbox", "from_spark_stream"]


@ray.remote(num_cpus=0, max_restarts=0)
class StreamInbox(Changes):
    """Ray actor: the :class:`EpochBuffer` of one streaming query, plus waiting."""

    def __init__(self, lanes: int, max_epochs: int, retain_epochs: int) -> None:
        self._buffer = EpochBuffer(lanes, max_epochs, retain_epochs)
        self._event = asyncio.Event()

    async def wait_room(self, timeout_s: float) -> bool:
        if not self._buffer.has_room():
            await self._wait(timeout_s)
        return self._buffer.has_room()

    async def is_committed(self, epoch: int) -> bool:
        return self._buffer.is_committed(epoch)

    async def push(
        self, unit: tuple[int, int], generation: int, attempt: int, seq: int, data: bytes, rows: int
    ) -> bool:
        return self._buffer.push(unit[0], unit[1], generation, attempt, seq, data, rows)

    async def commit(self, epoch: int, succeeded: Sequence[tuple[int, int, int]]) -> bool:
        done = self._buffer.commit(epoch, 0, succeeded)
        self._changed()
        return done

    async def end(self, error: str | None = None) -> None:
        self._buffer.end(error)
        self._changed()

    async def take(self, lane: int, from_epoch: int) -> tuple[int, list[bytes]]:
        while True:
            got = self._buffer.take(lane, from_epoch)
            if got is not None:
                self._changed()  # credit freed
                return got
            await self._wait(None)

    async def acknowledge(self, offsets: dict[int, int]) -> None:
        self._buffer.acknowledge(offsets)

    async def statistics(self) -> EpochStatistics:
        return self._buffer.statistics()


class _LaneReader(SplitReader):
    """Takes one lane's epochs in order without blocking the host; offset = the next epoch needed."""

    def __init__(self, source: SparkStreamSource, lane: int, offset: int) -> None:
        self._inbox = _inbox_handle(source._inbox, NAMESPACE)
        self._schema = source._schema
        self._lane, self._next = lane, offset
        self._pending: Any = None
        self._poll = ReadyPoll()
        self._ended = False

    def _request(self) -> Any:
        if self._pending is None:
            self._pending = self._inbox.take.remote(self._lane, self._next)
            self._poll.watch(self._pending)
        return self._pending

    def ready_at(self) -> float | None:
        if self._ended:
            return None
        self._request()
        return self._poll.ready_at()

    def read(self) -> pa.RecordBatch | None:
        if self._ended:
            return None
        self._request()
        if (
            self._poll.ready_at() is not None
        ):  # not yet: an empty batch (never emitted) instead of blocking the host
            return _empty(self._schema)
        epoch, data = self._poll.result()
        self._pending = None
        if epoch == END:
            self._ended = True
            return None
        self._next = epoch + 1
        batches = [b for chunk in data for b in decode(chunk)]
        if not batches:
            return _empty(self._schema)  # an epoch with no rows for this lane
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

    def offset(self) -> int:
        return self._next


class SparkStreamSource(Source):
    """A streaming DataFrame pushed into the dataflow epoch by epoch (see :func:`from_spark_stream`).

    Driver-side lifecycle: ``splits()`` (at submit) starts the query;
    ``await_termination()``, ``restart()`` (from the same checkpoint),
    ``end()`` (the lanes finish after the last committed epoch) and
    ``close()`` (stop the query, kill the inbox; idempotent).
    """

    def __init__(
        self,
        sdf: Any,
        target: PushTarget,
        name: str,
        lanes: int,
        max_epochs: int,
        retain_epochs: int,
        checkpoint_location: str,
        trigger: dict[str, Any] | None,
        until_terminated: bool,
    ) -> None:
        self._schema, self._name, self._inbox, self._lanes = target.schema, name, target.inbox, lanes
        self._driver: dict[str, Any] | None = {
            "sdf": sdf,
            "target": target,
            "max_epochs": max_epochs,
            "retain_epochs": retain_epochs,
            "checkpoint": checkpoint_location,
            "trigger": trigger,
            "until_terminated": until_terminated,
            "inbox": None,
            "query": None,
            "closing": False,
        }

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_driver": None}

    def schema(self) -> pa.Schema:
        return self._schema

    def splits(self) -> list[SourceSplit]:
        d = self._need_driver()
        if d["inbox"] is None:
            d["inbox"] = StreamInbox.options(  # type: ignore[attr-defined]
                name=self._inbox, namespace=NAMESPACE
            ).remote(self._lanes, d["max_epochs"], d["retain_epochs"])
            self.restart()
        return [SourceSplit(f"{self._name}-lane{lane}", lane) for lane in range(self._lanes)]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _LaneReader(self, int(split.payload), 0 if offset is None else int(offset))

    def checkpoint_complete(self, checkpoint_id: int, offsets: dict[str, Any]) -> None:
        """The dataflow checkpointed these lane offsets: epochs before them need no replay any more."""
        prefix = f"{self._name}-lane"
        lanes = {int(s[len(prefix):]): int(o or 0) for s, o in offsets.items() if s.startswith(prefix)}
        if lanes:
            _inbox_handle(self._inbox, NAMESPACE).acknowledge.remote(lanes)

    def _need_driver(self) -> dict[str, Any]:
        if self._driver is None:
            raise RuntimeError(f"{self._name}: only the driver-side source (not closed) can do this")
        return self._driver

    def _on_batch(self, bdf: Any, batch_id: int) -> None:
        """``foreachBatch`` body (driver): credit, executor push, commit of the epoch."""
        d = self._need_driver()
        inbox = d["inbox"]
        while not ray.get(inbox.wait_room.remote(1.0)):  # back-pressure: Spark's next batch waits
            if d["closing"]:
                return
        if ray.get(inbox.is_committed.remote(batch_id)):
            ray.get(inbox.commit.remote(batch_id, []))  # a re-run batch: counted, ignored
            return
        target = dataclasses.replace(d["target"], epoch=batch_id)
        rows = bdf.mapInArrow(functools.partial(push_partition, target), SUMMARY_SCHEMA).collect()
        ray.get(
            inbox.commit.remote(
                batch_id, [(r["partition"], r["attempt"], r["batches"]) for r in rows if r["complete"]]
            )
        )

    def restart(self) -> None:
        """(Re)start the streaming query from its checkpoint location."""
        d = self._need_driver()
        writer = (
            d["sdf"].writeStream.foreachBatch(self._on_batch).option("checkpointLocation", d["checkpoint"])
        )
        if d["trigger"]:
            writer = writer.trigger(**d["trigger"])
        d["query"] = writer.start()
        if d["until_terminated"]:
            threading.Thread(target=self._end_after, args=(d["query"],), daemon=True).start()

    def _end_after(self, query: Any) -> None:
        error = None
        try:
            query.awaitTermination()
        except Exception as e:  # reaches the lanes, and so Job.wait, through the inbox
            error = f"the streaming query failed: {type(e).__name__}: {str(e)[:2000]}"
        d = self._driver
        if d is not None and not d["closing"]:
            ray.get(d["inbox"].end.remote(error))

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the current query run to stop (``availableNow`` triggers stop by themselves).

        Raises:
            pyspark's StreamingQueryException: the query failed.
        """
        query = self._need_driver()["query"]
        if timeout_s is None:
            query.awaitTermination()
            return True
        return bool(query.awaitTermination(timeout_s))

    def end(self) -> None:
        """No more epochs: each lane finishes after the last committed epoch."""
        ray.get(self._need_driver()["inbox"].end.remote())

    def statistics(self) -> EpochStatistics:
        return ray.get(self._need_driver()["inbox"].statistics.remote())

    def close(self) -> None:
        """Stop the query and kill the inbox. Idempotent."""
        d, self._driver = self._driver, None
        if d is None:
            return
        d["closing"] = True
        if d["query"] is not None:
            d["query"].stop()
        if d["inbox"] is not None:
            ray.kill(d["inbox"], no_restart=True)

    def __enter__(self) -> SparkStreamSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        return self._name


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
) -> SparkStreamSource:
    """A source over a Structured Streaming DataFrame; epochs are Spark's micro-batches, each seen once.

    Args:
        sdf: a streaming ``DataFrame`` (``spark.readStream...`` plus preprocessing).
        checkpoint_location: the query's checkpoint directory (offset and commit logs).
        trigger: keywords for ``DataStreamWriter.trigger`` (e.g. ``{"availableNow": True}``).
        lanes: source splits; use the source's parallelism.
        max_epochs: committed micro-batches that may wait for the dataflow.
        retain_epochs: micro-batches every lane took that are kept until the
            dataflow's checkpoints cover them, so that a dataflow restored
            from its last checkpoint is handed the same epochs again (0: no
            replay). Checkpoint at least once every this many micro-batches.
        until_terminated: end the source when the query stops; otherwise call ``end()``.
        window: pushes in flight per Spark task.
        batch_bytes: Arrow batches are re-chunked to about this size.
        name: the source's name (default: a unique one).

    Raises:
        TypeError: ``sdf`` is not a streaming DataFrame.
        UnsupportedSparkType: a column's type has no Arrow mapping (named).

    Example:
        >>> src = from_spark_stream(sdf, checkpoint_location="chk/")  # doctest: +SKIP
    """
    require_pyspark()
    from pyspark.sql import DataFrame

    if not isinstance(sdf, DataFrame) or not sdf.isStreaming:
        raise TypeError(
            f"from_spark_stream: expected a streaming DataFrame, got {type(sdf).__name__}"
            + (" (a batch one: use from_spark)" if isinstance(sdf, DataFrame) else "")
        )
    for arg, value, least in (("lanes", lanes, 1), ("max_epochs", max_epochs, 1), ("window", window, 1),
                              ("batch_bytes", batch_bytes, 1), ("retain_epochs", retain_epochs, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"from_spark_stream: {arg} must be an integer >= {least}, got {value!r}")
    schema = to_arrow_schema(sdf.schema)
    name = name or f"from_spark_stream-{uuid.uuid4().hex[:8]}"
    target = PushTarget(gcs_address(), NAMESPACE, name, schema, window, batch_bytes, worker_env(), epoch=None)
    return SparkStreamSource(
        sdf, target, name, lanes, max_epochs, retain_epochs, checkpoint_location, trigger, until_terminated
    )
