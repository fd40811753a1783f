"""push.py: what runs inside a Spark task: push one partition's Arrow batches to its reader, then report it.

A task's input is either Spark's own Arrow record-batch messages (the
default: ``push_ipc_partition`` over ``Dataset.toArrowBatchRdd``, the JVM's
executor-side conversion that ``toArrow()`` uses too) or a ``mapInArrow``
batch iterator (``push_partition``: Spark Connect, the streaming bridge, or
a Spark without that JVM method). The task connects to Ray once per Spark
Python worker (workers are reused) and asks the bridge's coordinator where
its partition goes: the host actor that runs the reader of that unit (or
lane); a task that starts before that reader was opened reads its first
batch and waits for the answer. It then re-chunks the batches to about
``batch_bytes``, casts them to the bridge's schema, and sends each one
straight to that host (``OperatorHost.feed_reader``: queued there and
answered at once, never after a step of operator code), keeping at most
``window`` pushes in flight: a task that has no credit waits in
``ray.wait``, which stops it reading its input and so stops the JVM side
computing it. After its last push was queued it yields a one-row summary
(partition, attempt, batch count, whether it pushed everything, whether the
reader's host was gone): Spark returns the summaries of successful attempts
only, and the driver commits exactly those at the reader, which drops the
other attempts' batches. A host that is gone (it died) makes the task stop
and report the partition *lost*, and the coordinator has it pushed again to
the reader's successor. A streaming task still reads the rest of its input
then, so that Spark's copy of the micro-batch is whole for that push.

Everything here runs in Spark's Python workers, never in the driver.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from chiray.operators.inflight import CallWindow

from .messages import Destination, Push
from .schema import conform

__all__ = [
    "GENERATION_PROPERTY",
    "SUMMARY_SCHEMA",
    "PushTarget",
    "decode",
    "encode",
    "frame_messages",
    "push_ipc_partition",
    "push_partition",
    "rechunk",
]

GENERATION_PROPERTY = "chiray.spark.generation"
ROUTE_TIMEOUT_S = 300.0
"""How long a task waits for its unit's reader to register before it fails (a clear error, not a stall)."""
ROUTE_WAIT_S = 5.0
"""How long one ``route`` call may wait at the coordinator for the reader to register."""
SUMMARY_SCHEMA = (
    "epoch bigint, partition int, attempt bigint, rows bigint, batches int, complete boolean, lost boolean"
)

_handles: dict[tuple[str, str, str], Any] = {}


@dataclasses.dataclass(frozen=True)
class PushTarget:
    """Where and how a Spark task pushes (pickled into the task).

    Attributes:
        gcs_address: the Ray cluster's GCS address.
        namespace: the coordinator actor's namespace.
        coordinator: the coordinator actor's name (it says where each unit goes).
        schema: the Arrow schema batches are cast to.
        window: pushes in flight per task (the credit window).
        batch_bytes: re-chunk Spark's batches to about this many bytes.
        env: environment a Spark worker needs to reach Ray (set if absent).
        epoch: the unit's epoch; ``None``: Spark's streaming batch id.
        generation: the launch's generation; ``None``: the Spark local property
            the job launcher sets (``GENERATION_PROPERTY``).
        stream: a micro-batch push (a lost push still reads the whole input,
            for Spark's copy of the micro-batch).
    """

    gcs_address: str
    namespace: str
    coordinator: str
    schema: pa.Schema
    window: int
    batch_bytes: int
    env: dict[str, str]
    epoch: int | None = 0
    generation: int | None = None
    stream: bool = False


def encode(batch: pa.RecordBatch) -> pa.Buffer:
    """One batch as an Arrow IPC stream, in an Arrow buffer: Ray ships it out of band (one copy, into the
    object store) and the receiver reads it in place, where ``bytes`` would be pickled in band."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def decode(data: pa.Buffer | bytes) -> list[pa.RecordBatch]:
    """The batches of an Arrow IPC stream (zero-copy over ``data``)."""
    return list(pa.ipc.open_stream(data if isinstance(data, pa.Buffer) else pa.py_buffer(data)))


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"

Frame = tuple[pa.Buffer, int]
"""One push's data: an Arrow IPC stream and its row count."""


def frame_messages(messages: Iterator[bytes], schema: pa.Schema, batch_bytes: int) -> Iterator[Frame]:
    """Spark's encapsulated record-batch ``messages`` (written with ``schema``) as IPC streams of about
    ``batch_bytes``, with their row counts; the batches are not decoded, only checked.

    Each message is read (its header only) and validated against ``schema``
    first, so bytes that do not match fail here, in the task. A stream is the
    schema's message, the messages as Spark wrote them, and the end marker:
    one copy of the data, where decoding, merging and writing the batches
    again took three.
    """
    head = schema.serialize()
    pending: list[bytes] = []
    size = rows = 0
    for message in messages:
        batch = pa.ipc.read_record_batch(pa.py_buffer(message), schema)
        batch.validate()
        if batch.num_rows == 0:
            continue
        pending.append(message)
        size += len(message)
        rows += batch.num_rows
        if size >= batch_bytes:
            yield pa.py_buffer(b"".join([head, *pending, _END_OF_STREAM])), rows
            pending, size, rows = [], 0, 0
    if rows:
        yield pa.py_buffer(b"".join([head, *pending, _END_OF_STREAM])), rows


def _coordinator(target: PushTarget) -> Any:
    for key, value in target.env.items():
        os.environ.setdefault(key, value)
    import ray

    if not ray.is_initialized():
        ray.init(
            address=target.gcs_address,
            namespace=target.namespace,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    where = (target.gcs_address, target.namespace, target.coordinator)
    if where not in _handles:
        _handles[where] = ray.get_actor(target.coordinator, namespace=target.namespace)
        # Spark's reused Python worker runs a full collection after each task, and Ray's client holds
        # many objects: out of the collector's sight from now on, they cost it nothing (measured: about
        # 40 ms of CPU a task)
        gc.freeze()
    return _handles[where]


def _sized(batch: pa.RecordBatch, batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in slices of about ``batch_bytes`` (as it is when it is not more than twice that)."""
    pieces = batch.nbytes // batch_bytes if batch.nbytes > 2 * batch_bytes else 1
    rows = -(-batch.num_rows // max(pieces, 1))
    for start in range(0, batch.num_rows, rows):
        yield batch.slice(start, rows)


def rechunk(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, batch_bytes: int
) -> Iterator[pa.RecordBatch]:
    """Spark's batches cast to ``schema`` and merged or sliced into batches of about ``batch_bytes``.

    Empty batches are skipped.
    """
    for batch in _merged(batches, schema, batch_bytes):
        yield from _sized(batch, batch_bytes)


def _merged(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, batch_bytes: int
) -> Iterator[pa.RecordBatch]:
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(conform(batch, schema))
        size += batch.nbytes
        if size >= batch_bytes:
            yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)
            pending, size = [], 0
    if pending:
        yield pending[0] if len(pending) == 1 else pa.concat_batches(pending)


class _Pusher:
    """Sends one attempt's batches to its reader, at most ``window`` in flight; knows how it went.

    ``_calls`` counts the pushes in flight (one receiver: the unit's reader; pushes are never
    coalesced, a push waits for credit instead); ``_in_flight`` holds their refs, for ``ray.wait``.
    """

    def __init__(self, destination: Destination, unit: tuple[int, int], generation: int, attempt: int,
                 window: int) -> None:
        self._destination, self._unit = destination, unit
        self._generation, self._attempt = generation, attempt
        self._calls: CallWindow[tuple[int, int], Push] = CallWindow(window=window)
        self._in_flight: list[Any] = []
        self.seq = self.rows = 0
        self.accepted = True  # every push so far was queued at the reader's host
        self.lost = False  # the reader's host is gone

    def send(self, data: pa.Buffer, rows: int) -> bool:
        """Push the IPC stream ``data`` of ``rows`` rows (waiting for credit first); ``False``: stop, the
        reader's host is gone."""
        import ray

        while self._calls.full(self._unit) and self.accepted:  # no credit: wait, stops Spark upstream
            done, self._in_flight = ray.wait(self._in_flight, num_returns=1)
            self._calls.returned(self._unit)
            self._settle(done)
        if not self.accepted:
            return False
        push = self._calls.offer(self._unit, Push(self._destination.token, self._unit, self._generation,
                                                  self._attempt, self.seq, data, rows))
        assert push is not None, "bug in spark_bridge: a push sent without credit"
        self._in_flight.append(self._destination.feed(push))
        self.seq += 1
        self.rows += rows
        return True

    def finish(self) -> None:
        """Wait for the pushes in flight."""
        self._settle(self._in_flight)
        self._in_flight = []
        self._calls.forget(self._unit)

    def _settle(self, refs: list[Any]) -> None:
        import ray

        for ref in refs:
            try:
                answer = ray.get(ref)
            except ray.exceptions.RayActorError:  # the host died
                answer = None
            self.lost = self.lost or answer is None
            self.accepted = self.accepted and bool(answer)


def _route(
    coordinator: Any, unit: tuple[int, int], generation: int, chunks: Iterator[Frame], window: int
) -> tuple[Destination | None, list[Frame]]:
    """Where to push ``unit``, and the frames read meanwhile.

    While the unit's reader has not registered (its host is still starting),
    the task reads up to ``window`` frames ahead, so that Spark computes
    meanwhile, then waits; after ``ROUTE_TIMEOUT_S`` it fails.
    """
    import ray

    held: list[Frame] = []
    more = True
    deadline = time.monotonic() + ROUTE_TIMEOUT_S
    while True:
        reading = more and len(held) < window
        answer_ref = coordinator.route.remote(unit, generation, 0.0 if reading else ROUTE_WAIT_S)
        if reading:  # read while the answer comes
            batch = next(chunks, None)
            more = batch is not None
            held += [batch] if batch is not None else []
        answer = ray.get(answer_ref)
        if not isinstance(answer, str):
            return answer, held
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"spark_bridge: no source instance opened the reader of partition {unit[1]} (epoch {unit[0]}) "
                f"within {ROUTE_TIMEOUT_S:.0f} s; is the dataflow running?"
            )


def _push(target: PushTarget, frames: Iterator[Frame], batches: Iterator[Any]) -> dict[str, Any]:
    """Push this task's partition (``frames``, made from the task's input ``batches``) as one unit; its
    summary (see :func:`push_partition`)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "bug in spark_bridge: a push outside a Spark task"
    coordinator = _coordinator(target)
    epoch = (
        target.epoch if target.epoch is not None else int(str(ctx.getLocalProperty("streaming.sql.batchId")))
    )
    generation = target.generation
    if generation is None:
        generation = int(ctx.getLocalProperty(GENERATION_PROPERTY) or 0)
    unit, attempt = (epoch, ctx.partitionId()), ctx.taskAttemptId()
    destination, held = _route(coordinator, unit, generation, frames, target.window)  # None: stale (or no reader)
    pusher = None
    if destination is not None:
        pusher = _Pusher(destination, unit, generation, attempt, target.window)
        for data, rows in itertools.chain(held, frames):
            if not pusher.send(data, rows):
                break  # another attempt already committed this unit, or the reader is gone
        pusher.finish()
    complete = pusher is not None and pusher.accepted
    lost = pusher.lost if pusher is not None else target.stream
    if target.stream and not complete:
        for _ in batches:  # Spark's copy of the micro-batch must hold the whole partition for a push again
            pass
    return {
        "epoch": unit[0],
        "partition": unit[1],
        "attempt": attempt,
        "rows": pusher.rows if pusher is not None else 0,
        "batches": pusher.seq if pusher is not None else 0,
        "complete": complete,
        "lost": lost,
    }


_SUMMARY_ARROW = pa.schema(
    [
        ("epoch", pa.int64()),
        ("partition", pa.int32()),
        ("attempt", pa.int64()),
        ("rows", pa.int64()),
        ("batches", pa.int32()),
        ("complete", pa.bool_()),
        ("lost", pa.bool_()),
    ]
)


def push_partition(target: PushTarget, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: push this task's partition as one unit; yield a one-row summary.

    ``attempt`` in the summary is Spark's task attempt id (unique in the
    application); ``complete`` is false when the task stopped early because
    another attempt's data was already committed (or its launch is stale),
    ``lost`` is true when the reader was gone.
    """
    frames = ((encode(b), b.num_rows) for b in rechunk(batches, target.schema, target.batch_bytes))
    summary = _push(target, frames, batches)
    yield pa.RecordBatch.from_pylist([summary], schema=_SUMMARY_ARROW)


def push_ipc_partition(
    target: PushTarget, spark_schema: pa.Schema, messages: Iterator[bytes]
) -> Iterator[dict[str, Any]]:
    """RDD body over Spark's own Arrow record-batch messages: push them as one unit; yield its summary.

    ``messages`` are the encapsulated IPC record-batch messages (no schema)
    that Spark's executors make from the partition's rows; ``spark_schema``
    is the Arrow schema Spark wrote them with. They travel as Spark wrote
    them (:func:`frame_messages`: each is validated against the schema
    first, so bytes that do not match fail the task instead of reading
    garbage) and the reader casts them to the bridge's schema; a schema that
    cannot be cast fails the task before it pushes.
    """
    conform(pa.RecordBatch.from_pylist([], schema=spark_schema), target.schema)
    messages = iter(messages)
    yield _push(target, frame_messages(messages, spark_schema, target.batch_bytes), messages)
