"""What a Spark task sends, without Spark or Ray: Spark's own messages framed unchanged, out-of-band buffers,
and the reader casting Spark's types to the bridge's schema."""

from __future__ import annotations

import datetime as dt
import pickle

import pyarrow as pa
import pytest

from chiray.operators import SplitAddress
from chiray.spark_bridge.messages import Commit, Push
from chiray.spark_bridge.push import PushTarget, decode, encode, frame_messages, push_ipc_partition
from chiray.spark_bridge.readers import UnitReader

from .test_readers import FakeLink

# what Spark writes with spark.sql.execution.arrow.useLargeVarTypes and a session time zone other than UTC
SPARK_SCHEMA = pa.schema([("key", pa.large_string()), ("v", pa.int32()),
                          ("ts", pa.timestamp("us", tz="America/New_York"))])
BRIDGE_SCHEMA = pa.schema([("key", pa.string()), ("v", pa.int32()), ("ts", pa.timestamp("us", tz="UTC"))])
START = dt.datetime(2026, 11, 26, tzinfo=dt.timezone.utc)


def spark_batch(first: int, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"key": [f"k{i % 7}" for i in range(first, first + n)], "v": list(range(first, first + n)),
         "ts": [START + dt.timedelta(seconds=i) for i in range(first, first + n)]},
        schema=SPARK_SCHEMA)


def spark_messages(sizes: list[int]) -> tuple[list[bytes], pa.Table]:
    """Encapsulated record-batch messages as Spark's executors write them (no schema message)."""
    batches, first = [], 0
    for n in sizes:
        batches.append(spark_batch(first, n))
        first += n
    return [b.serialize().to_pybytes() for b in batches], pa.Table.from_batches(batches, schema=SPARK_SCHEMA)


def test_frames_carry_sparks_messages_unchanged_in_streams_of_about_batch_bytes():
    messages, table = spark_messages([500, 0, 700, 300, 0, 900, 100])
    batch_bytes = len(messages[0]) + 1  # two messages a frame
    frames = list(frame_messages(iter(messages), SPARK_SCHEMA, batch_bytes))
    assert len(frames) == 3 and all(isinstance(data, pa.Buffer) for data, _ in frames)
    decoded = [decode(data) for data, _ in frames]
    assert [rows for _, rows in frames] == [sum(b.num_rows for b in batches) for batches in decoded]
    assert [b.num_rows for batches in decoded for b in batches] == [500, 700, 300, 900, 100]  # empty ones skipped
    assert pa.Table.from_batches([b for batches in decoded for b in batches]).equals(table)


def test_a_message_that_does_not_match_the_schema_fails_in_the_task():
    messages, _ = spark_messages([10])
    narrower = pa.schema([("key", pa.large_string())])
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, ValueError)):
        list(frame_messages(iter(messages), pa.schema([*narrower, ("v", pa.int64()), ("w", pa.int64())]), 1 << 20))


def test_pushed_buffers_travel_out_of_band():
    data = encode(spark_batch(0, 1000))
    buffers: list = []
    pickle.dumps(Push("t", (0, 1), 1, 2, 0, data, 1000), protocol=5, buffer_callback=buffers.append)
    assert sum(memoryview(b).nbytes for b in buffers) == data.size  # the data is not copied into the pickle


def test_the_reader_casts_sparks_types_to_the_bridges_schema():
    link = FakeLink()
    reader = UnitReader(link, BRIDGE_SCHEMA, (0, 2), taken=False)
    reader.bind(SplitAddress("src", 0, "src-p2"))
    token = link.calls[0][2].token
    messages, table = spark_messages([300, 200, 400])
    frames = list(frame_messages(iter(messages), SPARK_SCHEMA, 1))
    for seq, (data, rows) in enumerate(frames):
        assert reader.receive(Push(token, (0, 2), 1, 5, seq, data, rows)) is True
    assert reader.receive(Commit(token, 1, 5, len(frames))) == (900, 0)
    got = reader.read()
    assert got.schema.equals(BRIDGE_SCHEMA)
    expected = table.cast(BRIDGE_SCHEMA)
    assert pa.Table.from_batches([got]).equals(expected)
    assert got.column("ts")[0].as_py() == START  # the same instant, whatever zone Spark wrote it in


def test_a_spark_schema_that_cannot_be_cast_fails_the_task_before_it_pushes():
    target = PushTarget("gcs:0", "ns", "coordinator", BRIDGE_SCHEMA, 4, 1 << 20, {})
    wrong = pa.schema([("key", pa.large_string()), ("v", pa.list_(pa.int32())), ("ts", pa.timestamp("us"))])
    with pytest.raises(TypeError, match="column 'v'"):
        next(push_ipc_partition(target, wrong, iter([])))
