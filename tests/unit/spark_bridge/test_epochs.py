"""The streaming coordinator's rules without Ray or Spark: epochs committed once, lanes in order, credit, replay."""

from __future__ import annotations

from chiray.spark_bridge.epochs import EpochDirectory
from chiray.spark_bridge.messages import CommitEpoch, Destination, EndStream, Fail, Forward


def lane_reader(lane: int, token: str = "t") -> Destination:
    return Destination(f"host-{lane}", "src", lane, f"src-lane{lane}", f"{token}{lane}")


def started(lanes: int, max_epochs: int = 2, retain_epochs: int = 0) -> EpochDirectory:
    d = EpochDirectory(lanes, max_epochs, retain_epochs)
    for lane in range(lanes):
        assert not d.ready()
        assert d.register(lane, lane_reader(lane), 0) == []
    assert d.ready()
    return d


def push_epoch(d: EpochDirectory, epoch: int, partitions: int) -> list[Forward]:
    """The driver's micro-batch: every partition's attempt (100 + partition) pushed 1 batch of 10 rows."""
    generation = d.begin(epoch)
    assert generation is not None
    for p in range(partitions):
        assert d.route((epoch, p), generation).token == f"t{p % d.lanes}"
    return d.commit(epoch, generation, range(partitions), [(p, 100 + p, 1, 10) for p in range(partitions)])


def shares(forwards: list[Forward]) -> dict[int, tuple]:
    return {f.about[1]: (f.message.epoch, f.message.previous, f.message.attempts)
            for f in forwards if isinstance(f.message, CommitEpoch)}


def deliver(d: EpochDirectory, forwards: list[Forward]) -> None:
    for f in forwards:
        rows = 10 * len(f.message.attempts) if isinstance(f.message, CommitEpoch) else True
        assert d.answered(f, (rows, 0)) == []


def test_an_epoch_is_committed_once_and_each_lane_gets_its_partitions():
    d = started(lanes=2)
    forwards = push_epoch(d, 0, partitions=3)
    assert shares(forwards) == {0: (0, -1, ((0, 100, 1), (2, 102, 1))), 1: (0, -1, ((1, 101, 1),))}
    assert d.begin(0) is None  # Spark re-ran batch 0 after a restart: ignored
    assert shares(push_epoch(d, 1, partitions=1)) == {0: (1, 0, ((0, 100, 1),)), 1: (1, 0, ())}
    stats = d.statistics()
    assert (stats.committed_epochs, stats.ignored_commits, stats.held_epochs) == (2, 1, 2)


def test_credit_counts_epochs_not_yet_taken_by_every_lane_and_the_end_follows_the_last():
    d = started(lanes=2, max_epochs=1)
    deliver(d, push_epoch(d, 4, partitions=1))
    assert not d.ready()
    d.taken(1, 4, 0, 0)
    assert not d.ready()
    d.taken(0, 4, 10, 400)
    assert d.ready()
    [end0, end1] = d.end()
    assert end0.message == EndStream("t0", 4, None) and end1.message.last == 4
    assert d.end("the streaming query failed: boom")[0].message.error == "the streaming query failed: boom"
    stats = d.statistics()
    assert (stats.delivered_rows, stats.delivered_bytes, stats.retained_epochs) == (10, 400, 0)


def test_a_restored_lane_gets_each_kept_epoch_pushed_again_from_sparks_copy():
    d = started(lanes=2, max_epochs=1, retain_epochs=8)
    for epoch in range(3):
        deliver(d, push_epoch(d, epoch, partitions=4))
        for lane in (0, 1):
            d.taken(lane, epoch, 20, 200)
    assert d.statistics().retained_epochs == 3 and d.launch() == []
    d.acknowledge({0: 1, 1: 2})  # a checkpoint: lane 0 needs epoch 1 next, lane 1 epoch 2
    assert d.take_released() == [0] and d.statistics().retained_epochs == 2
    # The dataflow is restored from that checkpoint: each lane's new reader asks from its offset.
    assert d.register(0, lane_reader(0, "new"), 1) == []
    assert d.register(1, lane_reader(1, "new"), 2) == []
    jobs = d.launch()
    assert [units for _, units in jobs] == [[(1, 0), (1, 2)], [(2, 0), (2, 1), (2, 2), (2, 3)]]
    (g1, units1), (g2, units2) = jobs
    assert d.route((1, 0), g1).token == "new0" and d.route((1, 1), g1) is None  # lane 1 needs no epoch 1
    assert d.launch() == []  # running already
    commits = d.job_done(g1, units1, None, [(u, 7, 1, 10) for u in units1])
    commits += d.job_done(g2, units2, None, [(u, 8, 1, 10) for u in units2])
    assert shares(commits) == {0: (2, 1, ((0, 8, 1), (2, 8, 1))), 1: (2, 1, ((1, 8, 1), (3, 8, 1)))}
    assert [f.message.epoch for f in commits if f.about[1] == 0] == [1, 2]
    deliver(d, commits)
    for lane, epoch in [(0, 1), (0, 2), (1, 2)]:
        d.taken(lane, epoch, 20, 200)
    stats = d.statistics()
    assert (stats.replayed_epochs, stats.repushes) == (3, 2)
    d.acknowledge({0: 3, 1: 3})
    assert sorted(d.take_released()) == [1, 2] and d.statistics().retained_epochs == 0


def test_a_share_that_did_not_reach_its_reader_is_pushed_again():
    d = started(lanes=2)
    forwards = push_epoch(d, 0, partitions=2)
    commit0, commit1 = forwards
    assert d.answered(commit0, (-1, 1)) == []  # the batches went to a former reader
    assert d.answered(commit1, None) == []  # the reader is gone: wait for its successor
    assert not d.ready()
    [(g0, units)] = d.launch()
    assert units == [(0, 0)]
    d.register(1, lane_reader(1, "new"), 0)
    [(g1, units1)] = d.launch()
    assert units1 == [(0, 1)]
    assert shares(d.job_done(g1, units1, None, [((0, 1), 3, 2, 20)])) == {1: (0, -1, ((1, 3, 2),))}
    [fail] = d.job_done(g0, units, "SparkException: gone")
    assert isinstance(fail.message, Fail) and "pushing epoch 0 again failed" in fail.message.error


def test_a_replay_past_what_was_kept_fails_the_lane_with_a_clear_error():
    d = started(lanes=1, max_epochs=1, retain_epochs=2)
    for epoch in range(5):
        deliver(d, push_epoch(d, epoch, partitions=1))
        d.taken(0, epoch, 10, 100)
    assert d.statistics().retained_epochs == 2 and d.take_released() == [0, 1, 2]
    [fail] = d.register(0, lane_reader(0, "new"), 2)
    assert isinstance(fail.message, Fail)
    assert "lane 0 must replay from epoch 2, but epochs before 3 were released (retain_epochs=2)" in fail.message.error
    assert d.register(0, lane_reader(0, "newer"), 3) == []
    assert [units for _, units in d.launch()] == [[(3, 0)], [(4, 0)]]


def test_a_lane_with_nothing_in_a_kept_epoch_is_sent_it_at_once_and_a_late_reader_learns_the_end():
    d = started(lanes=2, retain_epochs=4)
    deliver(d, push_epoch(d, 0, partitions=1))  # nothing for lane 1
    d.taken(0, 0, 10, 100)
    d.taken(1, 0, 0, 0)
    d.end()
    forwards = d.register(1, lane_reader(1, "new"), 0)
    assert shares(forwards) == {1: (0, -1, ())}
    assert [f.message for f in forwards if isinstance(f.message, EndStream)] == [EndStream("new1", 0, None)]


def test_a_restarted_query_re_running_epochs_a_lane_holds_already_is_skipped_then_the_rest_flows():
    """After a restart the lanes register from their checkpointed epochs; Spark re-runs its last batch: a lane
    past it takes none of it (it counts as taken, so credit is not held), the next epochs reach every lane."""
    d = EpochDirectory(2, max_epochs=1)
    assert d.registered() is None
    d.register(0, lane_reader(0), 5)
    assert d.registered() is None
    d.register(1, lane_reader(1), 4)
    assert d.registered() == {0: 5, 1: 4}
    forwards = push_epoch(d, 4, 4)  # lane 0 holds epoch 4 already: only lane 1 gets its share
    assert set(shares(forwards)) == {1}
    deliver(d, forwards)
    d.taken(1, 4, 20, 0)
    assert d.statistics().skipped_epochs == 1 and d.statistics().rows_waiting == 0
    assert d.has_room()  # epoch 4 is taken by both lanes
    forwards = push_epoch(d, 5, 4)
    assert {lane: (e, prev) for lane, (e, prev, _) in shares(forwards).items()} == {0: (5, 4), 1: (5, 4)}
    assert d.statistics().rows_waiting == 40
    d.taken(0, 5, 20, 0)
    assert d.statistics().rows_waiting == 20


def test_an_epoch_every_lane_holds_is_ignored_at_begin():
    d = EpochDirectory(1, max_epochs=2)
    d.register(0, lane_reader(0), 8)
    assert d.begin(7) is None and d.statistics().ignored_commits == 1
    assert d.begin(8) is not None
