"""The streaming hand-off's rules without Ray or Spark: epochs committed once, lanes in order, credit."""

from __future__ import annotations

import pytest

from spark_bridge.epochs import END, EpochBuffer


def stage(buf: EpochBuffer, epoch: int, partition: int, attempt: int, batches: int = 1) -> None:
    for seq in range(batches):
        assert buf.push(epoch, partition, 0, attempt, seq, f"{epoch}/{partition}/{attempt}/{seq}".encode(), 5)


def test_epoch_committed_once_and_rerun_ignored():
    buf = EpochBuffer(lanes=2, max_epochs=2)
    stage(buf, 0, 0, attempt=1)
    stage(buf, 0, 1, attempt=2)
    stage(buf, 0, 1, attempt=3)  # a retried attempt; Spark reports attempt 3 successful
    assert buf.commit(0, 0, [(0, 1, 1), (1, 3, 1)])
    assert not buf.push(0, 0, 0, 9, 0, b"re-run", 5)  # the re-run batch is told to stop
    assert not buf.commit(0, 0, [(0, 9, 0)])
    assert buf.take(0, 0) == (0, [b"0/0/1/0"])
    assert buf.take(1, 0) == (0, [b"0/1/3/0"])
    stats = buf.statistics()
    assert (stats.committed_epochs, stats.ignored_commits, stats.discarded_attempts) == (1, 1, 1)


def test_credit_lanes_skip_empty_epochs_and_end():
    buf = EpochBuffer(lanes=2, max_epochs=1)
    stage(buf, 4, 0, attempt=1)  # epoch 4 has data for lane 0 only
    buf.commit(4, 0, [(0, 1, 1)])
    assert not buf.has_room()
    assert buf.take(1, 0) is None  # lane 1: nothing yet (epoch 4 is empty for it)
    assert buf.take(0, 0) == (4, [b"4/0/1/0"])
    assert buf.has_room()  # both lanes are past epoch 4
    buf.end()
    assert buf.take(1, 0) == (END, [])
    with pytest.raises(LookupError, match="lane 0 asked again for epoch 4"):
        buf.take(0, 4)


def test_a_failed_query_fails_the_lanes():
    buf = EpochBuffer(lanes=1, max_epochs=1)
    buf.end("the streaming query failed: boom")
    with pytest.raises(RuntimeError, match="boom"):
        buf.take(0, 0)
