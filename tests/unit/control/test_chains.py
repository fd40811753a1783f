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
    # bins 10-12: with max_deltas=2 their turns (the next test) give no full copy here beyond the bounds
    bound = ChainBound(max_deltas=2, max_delta_ratio=1.0)
    chains = BinChains()
    first = _cut(chains, 1, {10: 5, 11: 5, 12: 5}, bound, sizes={10: 100, 11: 100, 12: 100})
    assert first.full == (10, 11, 12) and not first.since
    second = _cut(chains, 2, {10: 6, 11: 7, 12: 5}, bound, sizes={10: 10, 11: 150})
    assert second.full == () and second.since == {10: 5, 11: 5}  # bin 12 unchanged: nothing written
    assert [link.file for link in second.chains[12].links] == ["chk-1/s"]
    third = _cut(chains, 3, {10: 7, 11: 8, 12: 6}, bound)
    assert third.since == {10: 6, 12: 5} and third.full == (11,)  # bin 11's changes (150) outweigh its copy (100)
    fourth = _cut(chains, 4, {10: 8, 11: 9, 12: 6}, bound)
    assert fourth.full == (10,) and fourth.since == {11: 8}  # bin 10 holds max_deltas changes already
    assert manifest_chains({"format_version": 2, "state_chains": {"op/0": fourth.manifest_entry()}}) == {
        "op/0": {10: ["chk-4/s"], 11: ["chk-3/s", "chk-4/s"], 12: ["chk-1/s", "chk-3/s"]}}
    assert fourth.depends_on() == {1, 3}


def test_full_copies_of_bins_that_all_change_spread_evenly_over_the_checkpoints():
    """Uniform keys change every bin between two checkpoints: each checkpoint copies about a
    ``max_deltas``-th of the bins whole (never the whole state at once, as when every chain reached
    the bound together), and no chain holds more than ``max_deltas`` changes."""
    bound = ChainBound(max_deltas=8, max_delta_ratio=1.0)
    bins = range(1024)
    chains = BinChains()
    assert len(_cut(chains, 1, {b: 1 for b in bins}, bound, sizes={b: 100 for b in bins}).full) == 1024
    counts = []
    for checkpoint_id in range(2, 40):
        plan = chains.cut("root", checkpoint_id, f"chk-{checkpoint_id}/s", {b: checkpoint_id for b in bins}, bound,
                          False, lambda since: set(since))
        chains.written(plan, {b: 100 if b in plan.full else 5 for b in bins})  # small changes: the count bounds
        counts.append(len(plan.full))
        assert len(plan.full) + len(plan.since) == 1024
        assert max(len(chain.links) for chain in plan.chains.values()) <= 1 + bound.max_deltas
    # (once, in the first round, the bins whose turn came right after their first copy meet the bound
    # together with those whose turn it is: twice the share)
    assert max(counts) <= 2 * (1024 // 8 + 1), counts
    assert max(counts[10:]) <= 1024 // 8 + 1, counts
    assert sum(counts[-16:]) == 2 * 1024  # in steady state each bin once every max_deltas checkpoints


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
