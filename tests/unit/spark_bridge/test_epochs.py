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
    assert buf.take(1, 0) == (4, [])  # lane 1 moves past epoch 4, which has no rows for it
    assert buf.take(1, 5) is None  # nothing yet
    assert not buf.has_room()
    assert buf.take(0, 0) == (4, [b"4/0/1/0"])
    assert buf.has_room()  # both lanes are past epoch 4
    buf.end()
    assert buf.take(1, 5) == (END, [])
    with pytest.raises(LookupError, match="lane 0 must replay from epoch 4, but epochs before 5 were released"):
        buf.take(0, 4)  # retain_epochs=0: nothing is kept for a replay


def test_a_failed_query_fails_the_lanes():
    buf = EpochBuffer(lanes=1, max_epochs=1)
    buf.end("the streaming query failed: boom")
    with pytest.raises(RuntimeError, match="boom"):
        buf.take(0, 0)


def test_a_replay_gets_the_same_epochs_until_checkpoints_cover_them():
    buf = EpochBuffer(lanes=2, max_epochs=1, retain_epochs=8)
    for epoch in range(3):
        stage(buf, epoch, 0, attempt=10 + epoch)
        stage(buf, epoch, 1, attempt=20 + epoch)
        buf.commit(epoch, 0, [(0, 10 + epoch, 1), (1, 20 + epoch, 1)])
        first = [buf.take(lane, epoch) for lane in (0, 1)]
        assert first == [(epoch, [f"{epoch}/0/{10 + epoch}/0".encode()]),
                         (epoch, [f"{epoch}/1/{20 + epoch}/0".encode()])]
        assert buf.has_room()  # kept epochs do not hold Spark back
    assert buf.statistics().retained_epochs == 3
    buf.acknowledge({0: 1, 1: 2})  # a checkpoint: lane 0 needs epoch 1 next, lane 1 epoch 2
    assert buf.statistics().retained_epochs == 2  # epoch 0 is covered for both lanes; 1 is not for lane 0
    # The dataflow is restored from that checkpoint: each lane asks again from its offset.
    assert buf.take(0, 1) == (1, [b"1/0/11/0"])
    assert buf.take(1, 2) == (2, [b"2/1/22/0"])
    assert buf.take(0, 2) == (2, [b"2/0/12/0"])
    assert buf.statistics().replayed_epochs == 3
    with pytest.raises(LookupError, match="lane 1 must replay from epoch 0, but epochs before 1 were released"):
        buf.take(1, 0)
    buf.acknowledge({0: 3, 1: 3})
    assert buf.statistics().retained_epochs == 0


def test_at_most_retain_epochs_are_kept():
    buf = EpochBuffer(lanes=1, max_epochs=1, retain_epochs=2)
    for epoch in range(5):
        stage(buf, epoch, 0, attempt=1)
        buf.commit(epoch, 0, [(0, 1, 1)])
        assert buf.take(0, epoch)[0] == epoch
    assert buf.statistics().retained_epochs == 2
    assert buf.take(0, 3) == (3, [b"3/0/1/0"])  # still kept
    with pytest.raises(LookupError, match="retain_epochs=2"):
        buf.take(0, 2)
