"""The batch coordinator's rules without Ray or Spark: destinations, credit, commit, replay."""

from __future__ import annotations

import pytest

from chiray.spark_bridge.messages import Commit, Destination, Fail, Forward
from chiray.spark_bridge.units import WAIT, UnitDirectory

UNITS = [(0, p) for p in range(6)]


def reader(unit, token: str = "t") -> Destination:
    return Destination(f"host-of-{unit[1]}", "src", unit[1] % 2, f"src-p{unit[1]}", f"{token}{unit[1]}")


def register_all(d: UnitDirectory, units=UNITS, token: str = "t") -> None:
    for unit in units:
        assert d.register(unit, reader(unit, token)) == []


def commit_of(forwards: list[Forward]) -> list[tuple[str, int, int, int]]:
    return [(f.destination.token, f.message.generation, f.message.attempt, f.message.num_batches)
            for f in forwards if isinstance(f.message, Commit)]


def test_launches_respect_the_credit_window_and_wanted_units_jump_the_queue():
    d = UnitDirectory(UNITS, max_units=2)
    assert d.launch() == (1, [(0, 0), (0, 1)])  # at submit, before the readers are open
    assert d.launch() == (1, [])  # no credit left
    d.want((0, 4), reader((0, 4)))  # a source instance waits for unit 4: launched despite the window
    assert d.launch() == (2, [(0, 4)])
    assert d.statistics().buffered_units == 3
    d.want((0, 5), reader((0, 5)))
    assert d.launch() == (3, [(0, 5)])


def test_tasks_wait_for_the_reader_of_a_unit_computed_before_it_registered():
    d = UnitDirectory(UNITS[:1], max_units=1)
    generation, [unit] = d.launch()
    assert d.route(unit, generation) == WAIT
    d.register(unit, reader(unit))
    assert d.route(unit, generation) == reader(unit)


def test_tasks_are_routed_to_the_reader_of_their_launch_only():
    d = UnitDirectory(UNITS[:1], max_units=1)
    register_all(d, UNITS[:1])
    generation, [unit] = d.launch()
    assert d.route(unit, generation) == reader(unit)
    assert d.route(unit, generation - 1) is None  # a stale launch stops


def test_the_successful_attempt_is_committed_at_its_reader_and_reading_it_frees_credit():
    d = UnitDirectory(UNITS[:2], max_units=2)
    register_all(d, UNITS[:2])
    generation, units = d.launch()
    forwards = d.job_done(generation, units, None, succeeded=[((0, 0), 8, 3, 30), ((0, 1), 9, 1, 5)])
    assert commit_of(forwards) == [("t0", generation, 8, 3), ("t1", generation, 9, 1)]
    for f in forwards:
        assert d.answered(f, (f.message.num_batches * 7, 1)) == []  # rows committed, 1 attempt discarded
    stats = d.statistics()
    assert (stats.buffered_units, stats.buffered_rows, stats.committed_units, stats.discarded_attempts) == (2, 35, 2, 2)
    d.taken((0, 0), "t0", 30, 300)
    d.taken((0, 1), "stale-token", 5, 50)  # from a reader that was replaced: ignored
    stats = d.statistics()
    assert (stats.buffered_units, stats.delivered_rows, stats.delivered_bytes) == (1, 30, 300)


def test_a_new_reader_of_a_taken_unit_has_spark_compute_it_again():
    d = UnitDirectory(UNITS[:1], max_units=1)
    register_all(d, UNITS[:1])
    g1, [unit] = d.launch()
    d.job_done(g1, [unit], None, succeeded=[(unit, 1, 1, 10)])
    d.taken(unit, "t0", 10, 100)
    assert d.launch() == (g1, [])
    d.want(unit, reader(unit, token="restored"))  # a restored source instance: its offset says "not taken"
    g2, again = d.launch()
    assert again == [unit] and g2 == g1 + 1
    assert d.job_done(g1, [unit], None) == []  # a stale report of the older launch changes nothing
    assert commit_of(d.job_done(g2, [unit], None, succeeded=[(unit, 5, 1, 10)])) == [("restored0", g2, 5, 1)]
    stats = d.statistics()
    assert (stats.committed_units, stats.relaunches) == (2, 1)


def test_a_unit_whose_reader_died_is_computed_again_for_its_successor():
    d = UnitDirectory(UNITS[:2], max_units=2)
    register_all(d, UNITS[:2])
    generation, units = d.launch()
    commits = d.job_done(generation, [(0, 0)], None, succeeded=[((0, 0), 1, 1, 10)])
    d.answered(commits[0], None)  # the commit found the reader gone: nothing is pushed there any more
    d.job_done(generation, [(0, 1)], None, lost=[(0, 1)])  # the pushes found the reader gone
    assert d.statistics().buffered_units == 0
    assert d.launch() == (generation, [])  # both wait for a reader to register again
    d.register((0, 0), reader((0, 0), token="new"))
    d.want((0, 1), reader((0, 1), token="new"))
    assert d.launch() == (generation + 1, [(0, 1), (0, 0)])  # the wanted one first
    assert d.route((0, 1), generation + 1).token == "new1"


def test_a_registration_replaces_a_reader_that_held_a_committed_unit():
    d = UnitDirectory(UNITS[:1], max_units=1)
    register_all(d, UNITS[:1])
    g1, [unit] = d.launch()
    [commit] = d.job_done(g1, [unit], None, succeeded=[(unit, 1, 1, 10)])
    d.register(unit, reader(unit, token="new"))  # its host died holding the data
    assert d.statistics().buffered_rows == 0
    d.taken(unit, "t0", 10, 100)  # the old reader cannot deliver any more
    d.answered(commit, (10, 0))  # a late answer of the old reader changes nothing
    assert d.launch() == (g1 + 1, [unit])


def test_a_failed_spark_job_and_a_reader_that_raises_fail_the_unit_at_its_readers():
    d = UnitDirectory(UNITS[:3], max_units=3)
    register_all(d, UNITS[:3])
    generation, units = d.launch()
    forwards = d.job_done(generation, units[:2], "PythonException: ValueError: bad row")
    assert [(f.destination.token, type(f.message)) for f in forwards] == [("t0", Fail), ("t1", Fail)]
    assert "partition 1 " in forwards[1].message.error and "bad row" in forwards[1].message.error
    assert d.answered(forwards[0], 2) == [] and d.statistics().discarded_attempts == 2
    [late] = d.register((0, 1), reader((0, 1), token="restored"))  # a new reader learns it too
    assert isinstance(late.message, Fail) and late.destination.token == "restored1"
    [commit] = d.job_done(generation, units[2:], None, succeeded=[((0, 2), 4, 2, 8)])
    [fail] = d.answered(commit, None, "ValueError: bug in spark_bridge: attempt (1, 4) reported 2 batches")
    assert isinstance(fail.message, Fail) and "reported 2 batches" in fail.message.error


def test_misuse_is_named():
    with pytest.raises(ValueError, match="max_units"):
        UnitDirectory(UNITS, max_units=0)
    d = UnitDirectory(UNITS, max_units=1)
    with pytest.raises(KeyError, match="unknown unit"):
        d.register((3, 3), reader((3, 3)))
    register_all(d, UNITS[:1])
    generation, units = d.launch()
    [fail] = d.job_done(generation, units, None)  # Spark succeeded, yet no attempt was complete
    assert "bug in spark_bridge" in fail.message.error
