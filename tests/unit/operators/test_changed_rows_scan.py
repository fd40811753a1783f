"""A checkpoint's cut finds the rows written since each bin's version in one pass over the slots once the
bins asked for hold most of them (``columnarstate.SCAN_SHARE``), and through the bins' slot lists
otherwise: both give the same changes, and a replica that applies them holds what a plain dict holds.

The cut runs on the processing thread: gathering 2M stamps in bin order took 34 ms there, the pass 7.
Since then, a state marks the rows written since the last checkpoint's cut, and the next cut looks at those
only, wherever the versions asked for are not older than that cut; an older version (a pre-copy's) takes
the pass. Either way the rows are those a full pass finds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import columnarstate
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.hashing import bins_of

BINS = 32
ALWAYS, NEVER = 0.0, float("inf")


def _state() -> ColumnarAggState:
    state = ColumnarAggState(BINS)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    return state


def _contents(state: ColumnarAggState) -> dict[str, int]:
    slots = state.slots()
    return dict(zip(state.keys_at(slots).to_pylist(), state.values(slots)["n"].tolist()))


def _add(state: ColumnarAggState, oracle: dict[str, int], keys: list[str]) -> None:
    state.update(pa.array(keys), {"n": np.ones(len(keys), np.int64)})
    for k in keys:
        oracle[k] = oracle.get(k, 0) + 1


@pytest.mark.parametrize("scan", [ALWAYS, NEVER], ids=["one-pass", "slot-lists"])
@pytest.mark.parametrize("asked", ["every bin", "a few bins"])
def test_changes_since_the_cut_rebuild_the_state_whichever_way_the_rows_are_found(
        monkeypatch: pytest.MonkeyPatch, scan: float, asked: str) -> None:
    monkeypatch.setattr(columnarstate, "SCAN_SHARE", scan)
    rng = np.random.default_rng(7)
    universe = [f"key-{i}" for i in range(3000)]
    bin_of = dict(zip(universe, bins_of(pa.array(universe), BINS).tolist()))
    source, oracle = _state(), {}
    _add(source, oracle, universe[:2000])
    gone = [0, 5]  # bins that leave and come back: their old slots are tombstones the pass must skip
    source.extract_bins(gone)
    for k in [k for k in oracle if bin_of[k] in gone]:
        del oracle[k]
    kept = [b for b in range(BINS) if b not in gone]
    replica = _state()
    replica.install_bins(source.snapshot_bins(kept))
    for _ in range(3):  # three checkpoints, each the changes since the one before
        since = {b: source.version(b) for b in source.bins()}
        wanted = since if asked == "every bin" else {b: since[b] for b in kept[:6]}
        _add(source, oracle, [universe[i] for i in rng.choice(3000, 400, replace=False)])  # new keys, old
        full, changes = source.snapshot_changes_later([], wanted)()
        assert not full
        assert set(changes.sizes if changes else ()) <= set(wanted)
        replica.apply_changes(changes)
        expected = {k: v for k, v in oracle.items() if bin_of[k] in wanted}
        got = {k: v for k, v in _contents(replica).items() if bin_of[k] in wanted}
        assert got == expected
        if asked == "a few bins":  # the others are not the replica's to follow: start them again
            replica = _state()
            replica.install_bins(source.snapshot_bins(source.bins()))
        else:
            replica.install_bins({b: data for b, data in source.snapshot_bins(
                [b for b in source.bins() if b not in replica.bins()]).items()})


def _scanned(state: ColumnarAggState, since: dict[int, int]) -> np.ndarray:
    """The oracle: every live slot of a bin of ``since`` stamped after its version (a pass over all)."""
    n = state._n
    base = np.full(state.num_bins + 1, np.iinfo(np.int64).max, dtype=np.int64)
    base[list(since)] = list(since.values())
    return np.flatnonzero(state._stamp[:n] > base[state._bin[:n]])


def test_a_cut_looks_only_at_the_rows_written_since_the_last_and_finds_what_a_full_pass_finds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnarstate, "SCAN_SHARE", ALWAYS)
    monkeypatch.setattr(columnarstate, "COMPACT_LIVE", 0.5)
    rng = np.random.default_rng(11)
    universe = [f"key-{i}" for i in range(4000)]
    bin_of = dict(zip(universe, bins_of(pa.array(universe), BINS).tolist()))
    state, oracle = _state(), {}
    _add(state, oracle, universe[:1500])
    replica = _state()
    replica.install_bins(state.snapshot_bins(state.bins()))
    cuts: list[dict[int, int]] = [{b: state.version(b) for b in state.bins()}]
    state.snapshot_changes_later(list(cuts[0]), {})()  # the first cut: every bin whole
    fast = slow = 0
    for step in range(8):
        _add(state, oracle, [universe[i] for i in rng.choice(4000, 300, replace=False)])
        if step == 2:  # bins leave and come back (tombstones, then installs at their old versions)
            gone = [1, 2, 3]
            data = state.extract_bins(gone)
            state.install_bins(data)
        if step == 4:  # most bins leave: the state compacts its slots (and ``_dirty`` with them)
            slots_before = state._n
            data = state.extract_bins([b for b in state.bins() if b > 2])
            assert state._n < slots_before and not state._dead
            state.install_bins(data)
        since = {b: cuts[-1].get(b, 0) for b in state.bins()}
        known = state.changes_since(since)  # a bin that left and came back is written whole
        whole = sorted(b for b in since if b not in known)
        since = {b: v for b, v in since.items() if b in known}
        older = {b: cuts[max(len(cuts) - 3, 0)].get(b, 0) for b in since}  # as a pre-copy asks
        base = np.full(state.num_bins, np.iinfo(np.int64).max, dtype=np.int64)
        base[list(older)] = list(older.values())
        assert not state._dirty_covers(base) or step < 2, "a version from before the last cut is not covered"
        for asked in (older, since):
            expected = _scanned(state, asked)
            wanted, moved, _ = state._changed_rows(asked)
            assert sorted(wanted) == sorted(asked)
            assert np.array_equal(np.sort(moved), expected)
            base = np.full(state.num_bins, np.iinfo(np.int64).max, dtype=np.int64)
            base[list(asked)] = list(asked.values())
            if state._dirty_covers(base):
                fast += 1
            else:
                slow += 1
        cuts.append({b: state.version(b) for b in state.bins()})
        full, changes = state.snapshot_changes_later(whole, since)()  # the checkpoint's cut: clears ``_dirty``
        assert sorted(full.sizes if full else ()) == whole
        replica.extract_bins([b for b in whole if b in replica.bins()])
        replica.install_bins(full)
        replica.apply_changes(changes)
        assert _contents(replica) == oracle
        assert {bin_of[k] for k in oracle} == set(state.bins())
    assert fast >= 8 and slow >= 5  # every checkpoint took the short way; every older version the long one


@pytest.mark.parametrize("share", [8, 10**9], ids=["slots kept", "too many to keep"])
def test_a_cut_after_writes_alone_takes_the_rows_written_as_they_are_and_any_other_change_checks_their_stamps(
        monkeypatch: pytest.MonkeyPatch, share: int) -> None:
    """After writes alone (``update``) since the last cut, asked as of that cut, the rows written are the
    changes: the state takes the slots it kept as it wrote them (in that order: no pass over the slots), or,
    once they were too many to keep (``WRITTEN_SHARE``), the marked rows in slot order, without looking at
    their stamps. Expiry (rows written since die), an install (rows carry their versions in) or a bin written
    but not asked for falls back to checking the stamps. Each time the rows are those a full pass finds."""
    monkeypatch.setattr(columnarstate, "SCAN_SHARE", ALWAYS)
    monkeypatch.setattr(columnarstate, "WRITTEN_SHARE", share)
    rng = np.random.default_rng(5)
    universe = [f"key-{i}" for i in range(3000)]
    doomed = [f"doomed-{i}" for i in range(20)]  # written once, in the expiry step, then expired (with keys
    # written in earlier steps only)
    state = ColumnarAggState(BINS, touched=True)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    clock = iter(range(1, 10**6))

    def write(keys: list[str], now: int) -> list[int]:
        return state.update(pa.array(keys), {"n": np.ones(len(keys), np.int64)},
                            np.full(len(keys), now, np.int64)).tolist()

    write(universe[:2500], 10**6)  # touched late: these never expire
    state.snapshot_changes_later(state.bins(), {})()  # the first cut: every bin whole
    for step in ("writes", "expiry", "install", "a bin not asked for", "writes again"):
        since = {b: state.version(b) for b in state.bins()}
        order: list[int] = []  # the slots written since the cut, as first written
        first = next(clock)
        if step == "expiry":
            order += write(doomed, first)
        for _ in range(3):
            picked = [universe[i] for i in rng.choice(3000, 40, replace=False)]
            order += [s for s in write(picked, next(clock)) if s not in order]
        if step == "expiry":  # the doomed keys die: rows written since the cut become tombstones
            assert set(doomed) <= set(state.expire(first, 0)[0].to_pylist())
        if step == "install":
            moved_bin = state.bins()[0]
            state.install_bins(state.extract_bins([moved_bin]))
        asked = since if step != "a bin not asked for" else {b: v for b, v in since.items() if b % 2}
        base = np.full(state.num_bins, np.iinfo(np.int64).max, dtype=np.int64)
        base[list(asked)] = list(asked.values())
        exact = step in ("writes", "writes again")
        assert state._dirty_covers(base)
        assert state._dirty_exact(base) == exact, step
        _, moved, _ = state._changed_rows(asked)
        expected = _scanned(state, asked)
        assert np.array_equal(np.sort(moved), expected), step
        if exact and share == 8:
            assert moved.tolist() == order  # the kept slots, as written
        elif exact:
            assert state._written is None and moved.tolist() == sorted(order)
        state.snapshot_changes_later([], {b: v for b, v in since.items() if b in state.changes_since(since)})()
