"""Readers in the hosts, without Ray: staging pushes, commits, order of epochs, what they tell the coordinator."""

from __future__ import annotations

import pyarrow as pa
import pytest

from chiray.operators import SplitAddress
from chiray.spark_bridge.messages import Commit, CommitEpoch, EndStream, Fail, Push
from chiray.spark_bridge.push import encode
from chiray.spark_bridge.readers import LaneReader, UnitReader
from chiray.spark_bridge.units import SparkUnitFailed

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


class FakeLink:
    """Records the calls a reader makes to its coordinator."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def here(self):
        return "this-host"

    def call(self, method, *args):
        self.calls.append((method, *args))


def rows(*values: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": f"k{v}", "v": v} for v in values], schema=SCHEMA)


def bound_unit_reader(link: FakeLink) -> tuple[UnitReader, str]:
    reader = UnitReader(link, SCHEMA, (0, 3), taken=False)
    reader.bind(SplitAddress("src", 1, "src-p3"))
    (method, unit, destination), = link.calls
    assert (method, unit, destination.host, destination.index, destination.split_id) == (
        "register", (0, 3), "this-host", 1, "src-p3")
    return reader, destination.token


def test_a_unit_reader_reads_only_the_committed_attempt_once():
    link = FakeLink()
    reader, token = bound_unit_reader(link)
    pushed = {7: [rows(1, 2)], 8: [rows(1, 2), rows(3)]}  # attempt 7 failed mid-push; 8 is the retry
    for attempt, batches in pushed.items():
        for seq, batch in enumerate(batches):
            assert reader.receive(Push(token, (0, 3), 1, attempt, seq, encode(batch), batch.num_rows)) is True
    assert reader.ready_at() is not None and link.calls[-1][0] == "want"  # the host asks: it waits for it
    assert reader.read().num_rows == 0 and reader.offset() == 0  # nothing yet
    assert reader.receive(Push("other-token", (0, 3), 1, 9, 0, b"", 0)) is None  # for a replaced reader
    assert reader.receive(Commit(token, 1, 8, 2)) == (3, 1)  # rows committed, the other attempt dropped
    assert reader.receive(Push(token, (0, 3), 1, 9, 0, encode(rows(5)), 1)) is False  # late: stop pushing
    assert reader.ready_at() is None
    expected = pa.Table.from_batches(pushed[8])
    assert pa.Table.from_batches([reader.read()]).equals(expected) and reader.offset() == 1
    assert link.calls[-1][:4] == ("taken", (0, 3), token, expected.num_rows)
    assert reader.read() is None


def test_a_failed_unit_raises_at_its_reader_and_a_taken_one_registers_nowhere():
    link = FakeLink()
    reader, token = bound_unit_reader(link)
    reader.receive(Push(token, (0, 3), 1, 7, 0, encode(rows(1)), 1))
    assert reader.receive(Fail(token, "Spark failed to compute partition 3 (epoch 0): boom")) == 1
    assert reader.ready_at() is None
    with pytest.raises(SparkUnitFailed, match="partition 3 .*boom"):
        reader.read()
    done = UnitReader(link, SCHEMA, (0, 4), taken=True)  # restored with offset 1
    done.bind(SplitAddress("src", 0, "src-p4"))
    assert done.read() is None and len(link.calls) == 1


def bound_lane_reader(link: FakeLink, next_epoch: int = 0) -> tuple[LaneReader, str]:
    reader = LaneReader(link, SCHEMA, 1, next_epoch)
    reader.bind(SplitAddress("src", 1, "src-lane1"))
    (method, lane, destination, from_epoch), = link.calls
    assert (method, lane, from_epoch) == ("register_lane", 1, next_epoch)
    return reader, destination.token


def test_a_lane_reads_committed_epochs_in_order_whatever_order_their_commits_arrive_in():
    link = FakeLink()
    reader, token = bound_lane_reader(link)
    data = {(2, 1): rows(1, 2), (2, 3): rows(3), (5, 1): rows(4)}
    for (epoch, partition), batch in data.items():
        assert reader.receive(Push(token, (epoch, partition), 0, 10 + partition, 0, encode(batch), batch.num_rows))
    assert reader.receive(CommitEpoch(token, 5, 3, 0, ((1, 11, 1),))) == (1, 0)
    assert reader.ready_at() is not None  # epoch 5 waits: epoch 3 before it is committed, not here yet
    assert reader.receive(CommitEpoch(token, 3, 2, 0, ())) == (0, 0)  # nothing for this lane in epoch 3
    assert reader.read().num_rows == 0  # epoch 2 is committed (it comes before 3) but not here yet
    assert reader.receive(CommitEpoch(token, 2, -1, 0, ((1, 11, 1), (3, 13, 1)))) == (3, 0)
    got = [reader.read() for _ in range(3)]
    assert [b.num_rows for b in got] == [3, 0, 1] and reader.offset() == 6
    assert [c[2] for c in link.calls if c[0] == "taken"] == [2, 3, 5]
    assert reader.receive(Push(token, (5, 1), 1, 99, 0, encode(rows(9)), 1)) is False  # epoch read already
    assert reader.read().num_rows == 0
    assert reader.receive(EndStream(token, 5)) is True
    assert reader.ready_at() is None and reader.read() is None


def test_a_lane_answers_that_a_share_went_elsewhere_and_fails_as_told():
    link = FakeLink()
    reader, token = bound_lane_reader(link, next_epoch=4)
    reader.receive(Push(token, (4, 1), 2, 7, 0, encode(rows(1)), 1))
    assert reader.receive(CommitEpoch(token, 4, 3, 2, ((1, 7, 1), (3, 8, 1)))) == (-1, 1)
    assert reader.receive(EndStream(token, 4, "the streaming query failed: boom")) is True
    assert reader.read().num_rows == 0  # epoch 4 will be pushed again before the end
    reader.receive(Push(token, (4, 1), 3, 9, 0, encode(rows(1)), 1))
    assert reader.receive(CommitEpoch(token, 4, 3, 3, ((1, 9, 1),))) == (1, 0)
    assert reader.read().num_rows == 1
    with pytest.raises(RuntimeError, match="boom"):
        reader.read()
    other, other_token = bound_lane_reader(FakeLink())
    other.receive(Fail(other_token, "from_spark_stream: lane 1 must replay from epoch 0"))
    with pytest.raises(RuntimeError, match="must replay"):
        other.read()
