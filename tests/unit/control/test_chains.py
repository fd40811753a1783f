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
