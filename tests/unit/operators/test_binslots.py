"""BinSlots (the slots of each bin of a columnar state) and the state's moves through it.

The oracle is a plain pass over every slot's bin (``np.isin``), and, for the
state, a Python dict of per-key counts that moves bins between two states the
way a migration does.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import binslots
from chiray.operators.binslots import BinSlots
from chiray.operators.hashing import bins_of
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState

from .support import move_bins


@pytest.mark.parametrize("background", [False, True], ids=["", "sorted-in-the-background"])
@pytest.mark.parametrize("seed", range(40))
def test_the_slots_of_bins_equal_a_pass_over_every_slot(seed, background, monkeypatch):
    """With ``background``, the run is also sorted on the worker thread from copies taken at random
    points, while slots are added, bins leave and come back, and slots are renumbered."""
    rng, r = np.random.default_rng(seed), random.Random(seed)
    num_bins = r.choice([4, 16, 64])
    monkeypatch.setattr(binslots, "MIN_TAIL", r.choice([1, 4, 64]))
    bin_of = np.zeros(0, dtype=np.int32)
    index = BinSlots(num_bins)
    for _ in range(150):
        action = r.random()
        if action < 0.4:  # new slots
            new = rng.integers(0, num_bins, r.randrange(0, 30)).astype(np.int32)
            start = len(bin_of)
            bin_of = np.concatenate([bin_of, new])
            index.added(np.arange(start, len(bin_of)))
        elif action < 0.6:  # whole bins leave: their slots become tombstones
            bins = r.sample(range(num_bins), r.randrange(1, 3))
            bin_of[np.isin(bin_of, bins)] = num_bins
            index.removed(bins, bin_of)
        elif action < 0.75:  # tombstones come back
            tombs = np.flatnonzero(bin_of == num_bins)
            if len(tombs):
                back = rng.choice(tombs, size=min(len(tombs), r.randrange(1, 5)), replace=False)
                bin_of[back] = rng.integers(0, num_bins, len(back))
                index.added(back)
        elif action < 0.8:  # compaction renumbers the slots
            bin_of = bin_of[bin_of != num_bins].copy()
            index.invalidate()
        elif background and action < 0.86:  # a rescale's planner asked for metrics: sort in the background
            index.prepare(bin_of)
            if r.random() < 0.5 and index._building is not None:
                index._building.future.result()  # done before what follows (else it may still run)
        else:
            bins = r.sample(range(num_bins), r.randrange(1, num_bins))
            got = index.slots_in(bins, bin_of)
            assert len(set(got.tolist())) == len(got), "a slot twice"
            assert sorted(got.tolist()) == np.flatnonzero(np.isin(bin_of, bins)).tolist()


def _state(num_bins: int) -> ColumnarAggState:
    state = ColumnarAggState(num_bins)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    return state


def _contents(state: ColumnarAggState) -> dict[str, int]:
    slots = state.slots()
    return dict(zip(state.keys_at(slots).to_pylist(), state.values(slots)["n"].tolist()))


@pytest.mark.parametrize("seed", range(6))
def test_bins_moving_back_and_forth_between_two_states_keep_every_count(seed):
    r = random.Random(seed)
    num_bins = 32
    states = [_state(num_bins), _state(num_bins)]
    owner = [r.randrange(2) for _ in range(num_bins)]
    oracle: dict[str, int] = {}
    for _ in range(60):
        if r.random() < 0.6:  # a batch: each key goes to the state that owns its bin
            keys = [f"k{r.randrange(3000)}" for _ in range(r.randrange(1, 400))]
            batch = pa.array(sorted(set(keys)))
            bins = bins_of(batch, num_bins)
            for side in (0, 1):
                mine = np.flatnonzero(np.array([owner[b] for b in bins]) == side)
                if len(mine):
                    part = batch.take(pa.array(mine))
                    states[side].update(part, {"n": np.ones(len(part), dtype=np.int64)})
            for k in batch.to_pylist():
                oracle[k] = oracle.get(k, 0) + 1
        else:  # a migration step: a few bins change owner
            moving = r.sample(range(num_bins), r.randrange(1, 6))
            leaving = [[b for b in moving if owner[b] == side] for side in (0, 1)]
            for side in (0, 1):
                if leaving[side]:
                    move_bins(states, owner, side, leaving[side])
        held = {**_contents(states[0]), **_contents(states[1])}
        assert held == oracle
        for side in (0, 1):  # per-bin key counts (kept as bins move) equal a count over the keys
            keys = states[side].keys_at(states[side].slots())
            expected = np.bincount(bins_of(keys, num_bins), minlength=num_bins) if len(keys) else np.zeros(num_bins)
            counts = states[side].bin_key_counts()
            assert [counts.get(b, 0) for b in range(num_bins)] == expected.tolist()
            assert all(owner[b] == side for b in counts)


@pytest.mark.parametrize("hash_bits", [64, 6])
def test_a_key_index_that_reserved_room_finds_every_key_it_held_and_gets(hash_bits):
    from chiray.operators.keyindex import KeyIndex

    index = KeyIndex(pa.string(), table_hash_bits=hash_bits)  # 6 bits: most keys share a hash
    first = [f"a{i}" for i in range(300)]
    slots, _ = index.upsert(pa.array(first))
    index.reserve(5000)
    more = [f"b{i}" for i in range(2000)]
    index.upsert(pa.array(more))
    everything = first + more
    found, new = index.upsert(pa.array(everything))
    assert len(new) == 0
    assert found.tolist() == list(range(len(everything)))
    assert index.keys_at(found).to_pylist() == everything


def test_a_state_that_reserved_room_before_it_learnt_its_layout_installs_bins_unchanged():
    source = _state(16)
    keys = pa.array([f"k{i}" for i in range(3000)])
    source.update(keys, {"n": np.arange(3000, dtype=np.int64)})
    empty = _state(16).memory_nbytes()
    receiver = ColumnarAggState(16)  # unconfigured: a new owner before its first bins
    receiver.reserve(3000)
    receiver.install_bins(source.extract_bins(range(16)))
    assert _contents(receiver) == {f"k{i}": i for i in range(3000)}
    assert receiver.memory_nbytes() - empty >= 3000 * (8 + 8 + 8), "the room shows in the state's memory"
    configured = _state(16)
    configured.update(pa.array(["x"]), {"n": np.array([5])})
    configured.reserve(100)
    configured.update(pa.array(["x", "y"]), {"n": np.array([1, 2])})
    assert _contents(configured) == {"x": 6, "y": 2}


def test_a_prepared_index_answers_its_first_question_without_sorting_on_the_owners_thread(monkeypatch):
    """The first question after ``prepare`` takes the run sorted in the background; it sorts nothing
    itself (the owner's stall that ``prepare`` exists to avoid)."""
    num_bins = 64
    bin_of = np.random.default_rng(3).integers(0, num_bins, 50_000).astype(np.int32)
    index = BinSlots(num_bins)
    index.prepare(bin_of)
    index._building.future.result()
    bin_of[bin_of == 5] = num_bins  # bin 5 leaves after the copy was taken
    index.removed([5], bin_of)
    bin_of = np.concatenate([bin_of, np.array([7, 5], dtype=np.int32)])  # a new key, and bin 5 comes back
    index.added(np.array([50_000, 50_001]))
    sorted_here = []
    monkeypatch.setattr(binslots, "_sorted_run", lambda *a: sorted_here.append(1))
    for bins in ([5], [7], [5, 7, 9]):
        assert sorted(index.slots_in(bins, bin_of).tolist()) == np.flatnonzero(np.isin(bin_of, bins)).tolist()
    assert not sorted_here
