"""BinChains: which bins a checkpoint writes whole, as changes, or not at all; the bound on a chain."""

from __future__ import annotations

import pytest

from chiray.control.ops.chains import BinChains, ChainBound, manifest_chains


def _cut(chains: BinChains, checkpoint_id: int, versions: dict[int, int], bound: ChainBound,
         full: bool = False, sizes: dict[int, int] | None = None):
    plan = chains.cut("root", checkpoint_id, f"chk-{checkpoint_id}/s", versions, bound, full, lambda since: set(since))
    chains.written(plan, sizes or {b: 10 for b in (*plan.full, *plan.since)})
    return plan


def test_a_chain_is_cut_short_by_count_and_by_bytes_and_unchanged_bins_write_nothing():
    bound = ChainBound(max_deltas=2, max_delta_ratio=1.0)
    chains = BinChains()
    first = _cut(chains, 1, {0: 5, 1: 5, 2: 5}, bound, sizes={0: 100, 1: 100, 2: 100})
    assert first.full == (0, 1, 2) and not first.since
    second = _cut(chains, 2, {0: 6, 1: 7, 2: 5}, bound, sizes={0: 10, 1: 150})
    assert second.full == () and second.since == {0: 5, 1: 5}  # bin 2 unchanged: nothing written
    assert [link.file for link in second.chains[2].links] == ["chk-1/s"]
    third = _cut(chains, 3, {0: 7, 1: 8, 2: 6}, bound)
    assert third.since == {0: 6, 2: 5} and third.full == (1,)  # bin 1's changes (150) outweigh its copy (100)
    fourth = _cut(chains, 4, {0: 8, 1: 9, 2: 6}, bound)
    assert fourth.full == (0,) and fourth.since == {1: 8}  # bin 0 holds max_deltas changes already
    assert manifest_chains({"format_version": 2, "state_chains": {"op/0": fourth.manifest_entry()}}) == {
        "op/0": {0: ["chk-4/s"], 1: ["chk-3/s", "chk-4/s"], 2: ["chk-1/s", "chk-3/s"]}}
    assert fourth.depends_on() == {1, 3}


def test_bins_that_left_are_forgotten_and_a_full_checkpoint_or_another_storage_writes_everything():
    bound = ChainBound()
    chains = BinChains()
    _cut(chains, 1, {0: 1, 1: 1}, bound)
    assert _cut(chains, 2, {0: 2}, bound).since == {0: 1}
    assert _cut(chains, 3, {0: 3, 1: 1}, bound).full == (1,)  # bin 1 came back: its past here is gone
    assert _cut(chains, 4, {0: 4, 1: 2}, bound, full=True).full == (0, 1)
    plan = chains.cut("elsewhere", 5, "chk-5/s", {0: 5, 1: 3}, bound, False, lambda since: set(since))
    assert plan.full == (0, 1)
    refused = chains.cut("elsewhere", 6, "chk-6/s", {0: 6, 1: 4}, bound, False, lambda since: {1})
    assert refused.full == (0,) and refused.since == {1: 3}  # the state could not write bin 0's changes


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="max_deltas must be >= 0"):
        ChainBound(max_deltas=-1)
    with pytest.raises(ValueError, match="max_delta_ratio must be positive"):
        ChainBound(max_delta_ratio=0)


def _run_instances(parallelism: int, bound: ChainBound, full_size: int, delta_size: int, checkpoints: int,
                   first_delta: int | None = None) -> list[list[int]]:
    """``parallelism`` instances of 4 bins each, every bin changed between any two checkpoints, its full copy
    ``full_size`` bytes and its changes ``delta_size`` (``first_delta`` for the first, as after a long gap);
    per checkpoint, the instances that wrote full copies. Each checkpoint's chains are checked against the
    bound on the way."""
    instances = [BinChains() for _ in range(parallelism)]
    fulls: list[list[int]] = []
    for checkpoint_id in range(1, checkpoints + 1):
        fulls.append([])
        for i, chains in enumerate(instances):
            versions = {b: checkpoint_id for b in range(4 * i, 4 * i + 4)}
            plan = chains.cut("root", checkpoint_id, f"chk-{checkpoint_id}/s{i}", versions, bound, False,
                              lambda since: set(since), (i, parallelism))
            first = checkpoint_id == 2 and first_delta is not None
            chains.written(plan, {**{b: full_size for b in plan.full},
                                  **{b: first_delta if first else delta_size for b in plan.since}})
            assert not plan.full or plan.full == tuple(versions), "an instance's bins keep in step"
            if plan.full:
                fulls[-1].append(i)
            for chain in plan.chains.values():
                assert len(chain.links) - 1 <= bound.max_deltas
    return fulls


@pytest.mark.parametrize("parallelism", [2, 3, 5, 9])
@pytest.mark.parametrize("delta_size, first_delta", [(5, None), (14, None), (5, 60), (30, None)])
def test_the_instances_of_an_operator_take_their_full_copies_in_turn(parallelism, delta_size, first_delta):
    bound = ChainBound(max_deltas=8, max_delta_ratio=1.0)
    alone = [c for c, who in enumerate(_run_instances(1, bound, 100, delta_size, 80, first_delta)) if who]
    cycle = alone[-1] - alone[-2]  # one instance's full copies, every ``cycle`` checkpoints
    fulls = _run_instances(parallelism, bound, 100, delta_size, 80, first_delta)
    assert fulls[0] == list(range(parallelism))  # the first checkpoint copies everything
    # Once each has taken a turn, the instances share out the full copies: never more at once than needed.
    steady = fulls[2 * cycle:]
    assert max(len(who) for who in steady) == -(-parallelism // cycle), fulls
    for i in range(parallelism):
        # Its first full copy after the first checkpoint comes no more than slots - 1 checkpoints before an
        # instance alone takes it (a first change far larger than the rest does not bring it forward).
        assert min(c for c, who in enumerate(fulls) if c and i in who) >= alone[1] - (min(parallelism, 9) - 1)
        at = [c for c, who in enumerate(fulls) if i in who and c >= 2 * cycle]
        # Never more than slots - 1 checkpoints early.
        assert min(b - a for a, b in zip(at, at[1:])) >= cycle - (min(parallelism, 9) - 1)


def test_an_instance_alone_or_a_bound_of_no_changes_keeps_the_plain_bound():
    bound = ChainBound(max_deltas=8, max_delta_ratio=1.0)
    assert [c for c, who in enumerate(_run_instances(1, bound, 100, 5, 30)) if who] == [0, 9, 18, 27]
    assert [c for c, who in enumerate(_run_instances(1, bound, 100, 30, 30)) if who] == [0, 5, 10, 15, 20, 25]
    every = _run_instances(3, ChainBound(max_deltas=0), 100, 5, 4)
    assert every == [[0, 1, 2]] * 4


def test_a_change_written_after_its_bins_chain_started_again_does_not_count_against_the_new_chain():
    """A bin's bytes are summed as its files are written: a write that ends after a later cut started the
    bin's chain again (a savepoint's full copy) belongs to the old chain, not to the bound of the new one."""
    bound = ChainBound(max_deltas=8, max_delta_ratio=1.0)
    chains = BinChains()
    _cut(chains, 1, {0: 1}, bound, sizes={0: 100})
    late = chains.cut("root", 2, "chk-2/s", {0: 2}, bound, False, lambda since: set(since))
    assert late.since == {0: 1}
    assert _cut(chains, 3, {0: 3}, bound, full=True, sizes={0: 100}).full == (0,)
    chains.written(late, {0: 90})
    assert _cut(chains, 4, {0: 4}, bound, sizes={0: 60}).since == {0: 3}
    assert _cut(chains, 5, {0: 5}, bound, sizes={0: 30}).since == {0: 4}  # 60 of 100: the late 90 not counted
    assert _cut(chains, 6, {0: 6}, bound, sizes={0: 30}).since == {0: 5}  # 90 of 100
    assert _cut(chains, 7, {0: 7}, bound).full == (0,)  # 120 of 100: a full copy
