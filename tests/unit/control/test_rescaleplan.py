"""Rescale plans as pure values: steps per strategy and knob, against hand-computed expectations."""

from __future__ import annotations

import random

import pytest

from chiray.control.rescaleplan import (BinMetrics, Drain, Migrate, Pause, Priority, Replicate,
                                        RescaleOptions, RescalePlan, Strategy, acyclic_steps, pair_chunks,
                                        plan_rescale, plan_steps)

# bins 0..9 move from instance 0 to instance 1; bin b's load is b (so hot_first is 9, 8, ..., 0)
MOVES = {b: (0, 1) for b in range(10)}
LOADS = [float(b) for b in range(10)]


def steps(strategy: str, loads=LOADS, scale_out: bool = False, **knobs) -> list[list[int]]:
    return plan_steps(RescaleOptions.of(strategy, knobs), MOVES, loads, scale_out)


def test_all_at_once_is_one_step_hottest_first():
    assert steps("all_at_once") == [[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]


def test_fluid_is_one_bin_a_step():
    assert steps("fluid", priority="arrival") == [[b] for b in range(10)]


def test_batched_defaults_to_16_and_takes_chunk_bins_or_chunks():
    assert steps("batched", priority="arrival") == [list(range(10))]
    assert steps("batched", priority="arrival", chunk_bins=4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert steps("batched", priority="arrival", chunks=3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # ceil(10/3)


def test_non_disruptive_defaults_to_an_eighth_and_replication_adds_a_first_empty_step_on_scale_out():
    assert steps("non_disruptive", priority="arrival") == [[b] for b in range(10)]  # 10 // 8 = 1
    assert steps("non_disruptive", priority="arrival", chunk_bins=5, replicate=True) == [
        [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert steps("non_disruptive", priority="arrival", chunk_bins=5, replicate=True, scale_out=True) == [
        [], [0], [1, 2], [3, 4, 5, 6], [7, 8, 9]]  # and a scale-out's first steps ramp up (below)


def test_priorities():
    assert steps("batched", chunk_bins=3) == [[9, 8, 7], [6, 5, 4], [3, 2, 1], [0]]  # hot first
    assert steps("batched", chunk_bins=3, loads=None) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]  # no loads
    shuffled = steps("batched", chunk_bins=10, priority="random", seed=3)
    assert sorted(shuffled[0]) == list(range(10)) and shuffled != [list(range(10))]
    assert shuffled == steps("batched", chunk_bins=10, priority="random", seed=3)  # seeded


def test_each_fine_grained_step_moves_between_one_old_and_one_new_owner_in_priority_order():
    """A blocking step holds its owners' inputs until the new owner installed what every old owner
    sent: one pair a step never waits for a second old owner, nor holds it."""
    moves = {b: (b % 2, 2) for b in range(10)}  # a scale-out: even bins leave 0, odd ones leave 1
    loads = [float(b) for b in range(10)]
    for strategy in ("batched", "non_disruptive"):
        got = plan_steps(RescaleOptions.of(strategy, {"chunk_bins": 3}), moves, loads)
        assert got == [[9, 7, 5], [8, 6, 4], [3, 1], [2, 0]]  # hottest first, by the first bin of each
        assert all(len({moves[b] for b in step}) == 1 for step in got)
    assert sorted(b for step in got for b in step) == list(range(10))
    assert plan_steps(RescaleOptions.of("all_at_once", {}), moves, loads) == [list(range(9, -1, -1))]


def test_a_scale_outs_first_steps_ramp_up_per_pair_from_one_bin():
    """A new owner is cold (its first installs fault in the hash table made for all its keys): each
    pair's steps grow 1, 2, 4, ... bins up to the chunk size. A scale-in's new owners are warm."""
    moves = {b: (0, 1) for b in range(40)}
    out = plan_steps(RescaleOptions.of("batched", {"chunk_bins": 16, "priority": "arrival"}), moves, None,
                     scale_out=True)
    assert [len(step) for step in out] == [1, 2, 4, 8, 16, 9]
    assert [b for step in out for b in step] == list(range(40))
    assert [len(s) for s in plan_steps(RescaleOptions.of("batched", {"chunk_bins": 16}), moves, None)] == [16, 16, 8]
    two = {b: (b % 2, 2) for b in range(12)}
    assert pair_chunks(list(range(12)), two, 4, ramp=True) == [[0], [1], [2, 4], [3, 5], [6, 8, 10], [7, 9, 11]]
    assert pair_chunks([], two, 4, ramp=True) == []
    assert pair_chunks(list(range(12)), two, 6, ramp=True) == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]], \
        "bins that fit in one step per pair move in one"


def test_nothing_to_move_is_one_empty_step():
    assert plan_steps(RescaleOptions(), {}) == [[]]


def test_a_step_never_holds_a_cycle_of_owners():
    # bins 0 and 1 swap instances 0 and 1; bin 2 goes 1 -> 2: 0 -> 1 and 1 -> 0 may not share a step
    moves = {0: (0, 1), 1: (1, 0), 2: (1, 2)}
    assert acyclic_steps([[0, 1, 2]], moves) == [[0, 2], [1]]
    assert plan_steps(RescaleOptions(), moves) == [[0, 2], [1]]  # all_at_once takes two steps here
    ring = {0: (0, 1), 1: (1, 2), 2: (2, 0)}
    assert acyclic_steps([[0, 1, 2]], ring) == [[0, 1], [2]]


def test_options_are_checked():
    assert RescaleOptions.of("fluid", {"gap_s": 0.1}) == RescaleOptions(Strategy.FLUID, gap_s=0.1)
    assert RescaleOptions.of("batched", {"priority": "random"}).priority is Priority.RANDOM
    with pytest.raises(TypeError, match=r"unknown options \['chunk'\]"):
        RescaleOptions.of("batched", {"chunk": 3})
    with pytest.raises(ValueError, match="unknown strategy 'quick'"):
        RescaleOptions.of("quick", {})
    with pytest.raises(ValueError, match="priority must be one of"):
        RescaleOptions.of("batched", {"priority": "cold_first"})
    with pytest.raises(ValueError, match="chunk_bins must be an int >= 1"):
        RescaleOptions.of("batched", {"chunk_bins": 0})
    with pytest.raises(ValueError, match="replicate=True needs strategy='non_disruptive'"):
        RescaleOptions.of("batched", {"replicate": True})
    with pytest.raises(ValueError, match="pace must be True or False, got 'False'"):
        RescaleOptions.of("batched", {"pace": "False"})  # a CLI --option pace=False arrives as text
    assert RescaleOptions.of("batched", {"pace": True}).pace and not RescaleOptions.of("batched", {}).pace
    assert not Strategy.ALL_AT_ONCE.moves_bins and Strategy.FLUID.moves_bins


# -- whole plans: hundreds of random ones against a plain simulation of the table ---------------------------


def random_plan(rng: random.Random) -> tuple[RescaleOptions, list[int], int, int, list[int] | None,
                                            RescalePlan]:
    """A random rescale (strategy, knobs, bins, parallelisms, planner or a given table) and its plan."""
    strategy = rng.choice(["all_at_once", "batched", "fluid", "non_disruptive"])
    knobs: dict = {"priority": rng.choice(["hot_first", "arrival", "random"]), "seed": rng.randrange(9),
                   "theta": 3.0}  # a bin never carries over 4 times the mean: ssm always has an answer
    if strategy in ("batched", "non_disruptive"):
        knobs.update(rng.choice([{}, {"chunk_bins": rng.randint(1, 8)}, {"chunks": rng.randint(1, 5)}]))
    knobs["pace"] = strategy != "all_at_once" and rng.random() < 0.3
    knobs["replicate"] = strategy == "non_disruptive" and rng.random() < 0.5
    knobs["gap_s"] = rng.choice([0.0, 0.05])
    options = RescaleOptions.of(strategy, knobs)
    bins, before, after = rng.choice([4, 16, 64]), rng.randint(1, 4), rng.randint(1, 4)
    table = [rng.randrange(before) for _ in range(bins)]
    given = [rng.randrange(after) for _ in range(bins)] if rng.random() < 0.4 else None
    loads = [float(rng.randint(0, 100)) for _ in range(bins)]
    sizes = [rng.randint(0, 1000) for _ in range(bins)]
    metrics = BinMetrics(loads, sizes, {b: rng.randint(0, 9) for b in range(bins)})
    plan = plan_rescale(options, "op", before, after, table, metrics if rng.random() < 0.8 else None, given,
                        rng.choice(["ssm", "round_robin", "consistent_hash"]))
    return options, table, before, after, given, plan


@pytest.mark.parametrize("seed", range(500))
def test_a_random_plan_moves_each_changed_bin_once_from_its_owner_and_ends_at_the_new_table(seed):
    """Carry the plan out on a dict (bin -> owner): every step moves bins from the owner they have then,
    its table is the dict after it, each bin whose owner changes moves exactly once, the last table is the
    given one (or the planner's, within the new parallelism), instances exist for every owner at every step
    (a scale-out adds them with the first step, a scale-in retires them with the last), and the knobs show
    where they should."""
    options, table, before, after, given, plan = random_plan(random.Random(seed))
    owner = dict(enumerate(table))
    migrations = [s for s in plan.steps if isinstance(s, Migrate)]
    moved: list[int] = []
    for k, step in enumerate(migrations):
        for b, (old, new) in step.moves.items():
            assert owner[b] == old != new, (seed, k, b)
            owner[b] = new
        moved.extend(step.moves)
        assert step.table == tuple(owner[b] for b in range(len(table)))
        last = k == len(migrations) - 1
        assert step.parallelism == (after if after > before or last else before)
        assert max(step.table) < step.parallelism, "a bin's owner does not exist at this step"
        assert step.blocking == (options.strategy is not Strategy.NON_DISRUPTIVE)
        assert step.everywhere == (options.strategy is Strategy.ALL_AT_ONCE)
        assert (step.reserve is not None) == (k == 0) and step.retiring == tuple(range(after, before))
        if options.strategy is Strategy.ALL_AT_ONCE and step.moves:  # no cycle of owners in one step
            assert acyclic_steps([list(step.moves)], step.moves) == [list(step.moves)]
        elif step.moves:  # one pair of owners a step
            assert len(set(step.moves.values())) == 1
    final = [owner[b] for b in range(len(table))]
    assert sorted(moved) == [b for b in range(len(table)) if table[b] != final[b]] and plan.bins == len(moved)
    assert final == (given if given is not None else final) and max(final) < after
    if plan.bins:
        assert plan.steps[-1] == migrations[-1], "nothing waits after the last step"
    for i, step in enumerate(plan.steps):
        if isinstance(step, Replicate):  # a copy of exactly the next step's bins, just before it
            assert options.replicate and plan.steps[i + 1].moves == step.moves and step.moves
        elif isinstance(step, Drain):
            assert options.pace and isinstance(plan.steps[i - 1], Migrate)
        elif isinstance(step, Pause):
            assert step.seconds == options.gap_s > 0
    replicas = sum(isinstance(s, Replicate) for s in plan.steps)
    assert replicas == (sum(1 for s in migrations if s.moves) if options.replicate else 0)
    assert plan.counted_steps == len(migrations) + replicas


def test_a_stateless_operator_is_one_step_that_changes_its_instances():
    plan = plan_rescale(RescaleOptions(), "map", 2, 5)
    assert plan.steps == (Migrate(None, {}, 5),) and (plan.bins, plan.counted_steps) == (0, 1)
