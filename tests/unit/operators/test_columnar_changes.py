"""Changes applied to a columnar state list a key deleted twice since a version (deleted, written again,
deleted again): the state buries it once, and the other bins' keys stay.

Burying it twice counted it twice as dead; a state whose count of live keys so reached zero was reset,
and lost the keys of bins the changes did not touch (a restore of an aggregation with a TTL lost keys).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.hashing import bins_of

BINS = 16


def _state() -> ColumnarAggState:
    state = ColumnarAggState(BINS, touched=True)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    return state


def _put(state: ColumnarAggState, keys: list[str], touch: int) -> None:
    state.update(pa.array(keys), {"n": np.ones(len(keys), np.int64)}, np.full(len(keys), touch, np.int64))


def _contents(state: ColumnarAggState) -> dict[str, int]:
    slots = state.slots()
    return dict(zip(state.keys_at(slots).to_pylist(), state.values(slots)["n"].tolist()))


def test_a_key_deleted_twice_since_a_version_is_buried_once_and_other_bins_keep_their_keys() -> None:
    keys = [f"k{i}" for i in range(40)]
    bin_of = dict(zip(keys, bins_of(pa.array(keys), BINS).tolist()))
    churn = "k1"
    busy = [churn]  # alone in its bin: two keys installed, and the key buried twice counted both dead
    quiet = [k for k in keys if bin_of[k] != bin_of[churn]][:1]  # one key of another bin
    source = _state()
    _put(source, busy, touch=1)
    _put(source, quiet, touch=100)  # never expires here
    b = bin_of[churn]
    whole = source.snapshot_bins(source.bins())
    since = {b: source.version(b)}
    for step, touch in ((0, 2), (1, 3)):  # every key of the bin expires, comes back, expires again
        source.expire(cutoff=touch - 1, fill=0)
        if step == 0:
            _put(source, busy, touch=touch)
    _put(source, [churn], touch=9)
    expected = {k: v for k, v in _contents(source).items() if bin_of[k] in (b, bin_of[quiet[0]])}
    changes = source.extract_changes(since)
    assert changes is not None
    replica = _state()
    replica.install_bins({bb: whole[bb] for bb in (b, bin_of[quiet[0]])})
    replica.apply_changes(changes)
    assert _contents(replica) == expected
    assert quiet[0] in _contents(replica)
