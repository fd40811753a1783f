"""A checkpoint's cut finds the rows written since each bin's version in one pass over the slots once the
bins asked for hold most of them (``columnarstate.SCAN_SHARE``), and through the bins' slot lists
otherwise: both give the same changes, and a replica that applies them holds what a plain dict holds.

The cut runs on the processing thread: gathering 2M stamps in bin order took 34 ms there, the pass 7.
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
        assert set(changes) <= set(wanted)
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
