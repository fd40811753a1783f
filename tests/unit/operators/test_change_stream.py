"""A columnar state's checkpoint writes the changes of all its bins as one stream with a bin column.

Checked against plain dicts: the stream decoded for every bin, or for some of them (a restore at another
parallelism), holds exactly the rows written since the cut of those bins, their last touches, and the keys
expired from them; a state restored from a full copy and such streams equals the state. A stream given where
a single bin's payload is expected is refused by name.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState
from chiray.operators.dictstate import DictState
from chiray.operators.hashing import bins_of
from chiray.operators.statecodec import (BinStream, SharedBins, stream_bins, decode_bin_stream,
                                         encode_columnar_bin)

BINS = 16


def _state() -> ColumnarAggState:
    state = ColumnarAggState(BINS, touched=True)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    return state


def _put(state: ColumnarAggState, oracle: dict[str, tuple[int, int]], keys: list[str], touch: int) -> None:
    state.update(pa.array(keys), {"n": np.ones(len(keys), np.int64)}, np.full(len(keys), touch, np.int64))
    for k in keys:
        oracle[k] = (oracle.get(k, (0, 0))[0] + 1, touch)


def _bin(key: str) -> int:
    return int(bins_of(pa.array([key]), BINS)[0])


def _dump(state: ColumnarAggState) -> dict[str, int]:
    slots = state.slots()
    return dict(zip(state.keys_at(slots).to_pylist(), state.values(slots)["n"].tolist()))


@pytest.mark.parametrize("seed", range(4))
def test_the_stream_holds_each_bins_changes_and_expiries_and_restores_the_state(seed: int) -> None:
    rng = random.Random(seed)
    state, oracle = _state(), {}
    keys = [f"k{i}" for i in range(300)]
    _put(state, oracle, rng.sample(keys, 150), 1)
    full = state.snapshot_changes_later(state.bins(), {})()[0]
    versions = {b: state.version(b) for b in range(BINS)}
    rounds: list[BinStream] = []
    for now in range(2, 8):
        written = rng.sample(keys, rng.randint(1, 60))
        _put(state, oracle, written, now)
        gone = set(state.expire(now - 3, now)[0].to_pylist())
        for k in gone:
            del oracle[k]
        since = {b: versions[b] for b in state.changes_since(versions)}
        _, changes = state.snapshot_changes_later([], since)()
        assert isinstance(changes, BinStream)
        assert stream_bins(changes.payload) == {b: state.version(b) for b in since}
        assert sum(changes.sizes.values()) == pytest.approx(len(changes.payload), rel=0.01)
        some = set(rng.sample(sorted(since), BINS // 2))  # a restore whose instance owns half of the bins
        for bins in (set(since), some):
            got = decode_bin_stream(changes.payload, bins, BINS)
            rows = dict(zip(got.rows.column(0).to_pylist(), zip(got.rows.column(1).to_pylist(), got.touched.tolist())))
            assert rows == {k: oracle[k] for k in set(written) - gone if _bin(k) in bins}
            assert got.row_bins.tolist() == [_bin(k) for k in got.rows.column(0).to_pylist()]
            assert set(got.deleted.to_pylist()) == {k for k in gone if _bin(k) in bins}
            assert got.versions == {b: state.version(b) for b in bins}
        rounds.append(changes)
        versions = {b: state.version(b) for b in range(BINS)}
        fresh = ColumnarAggState(BINS, touched=True)
        fresh.restore_bins(full, rounds)
        assert _dump(fresh) == {k: n for k, (n, _) in oracle.items()} == _dump(state)


def test_rows_are_copied_and_written_in_slot_order_with_their_bins() -> None:
    state, oracle = _state(), {}
    _put(state, oracle, [f"k{i}" for i in range(200)], 1)
    state.snapshot_changes_later(state.bins(), {})()
    versions = {b: state.version(b) for b in range(BINS)}
    _put(state, oracle, [f"k{i}" for i in range(199, 0, -9)], 2)  # written in descending slot order
    _, changes = state.snapshot_changes_later([], versions)()
    table = pa.ipc.open_stream(changes.payload).read_all()
    assert table.column_names == ["key", "acc0", "touched", "bin"]
    assert table.column("key").to_pylist() == [f"k{i}" for i in range(1, 200, 9)]  # slot order: first written first
    assert table.column("bin").to_pylist() == [_bin(f"k{i}") for i in range(1, 200, 9)]


def test_a_stream_of_changes_is_refused_where_one_bin_is_expected() -> None:
    state, oracle = _state(), {}
    _put(state, oracle, ["a", "b", "c"], 1)
    state.snapshot_changes_later(state.bins(), {})()
    since = {b: state.version(b) for b in state.bins()}
    _put(state, oracle, ["a"], 2)
    _, changes = state.snapshot_changes_later([], since)()
    shared = SharedBins(changes.payload)
    with pytest.raises(ValueError, match=r"cannot install bin \d+: the payload holds changes, not a bin"):
        ColumnarAggState(BINS).install_bins({_bin("a"): shared})
    with pytest.raises(ValueError, match=r"bin \d+: payload is a stream of several bins of a ColumnarAggState, "
                                         r"not a DictState bin"):
        DictState(BINS).apply_changes({_bin("a"): shared})
    with pytest.raises(ValueError, match=r"a DictState reads a payload per bin, not a stream of several bins"):
        DictState(BINS).restore_bins({}, [changes])
    with pytest.raises(ValueError, match=r"the stream does not hold bin"):
        decode_bin_stream(changes.payload, set(range(BINS)), BINS)
    with pytest.raises(ValueError, match=r"bins written with 16 bins, not 32"):
        decode_bin_stream(changes.payload, set(since), 32)
    one_bin = encode_columnar_bin(BINS, 0, 1, state.layout, None, {"n": np.zeros(0, np.int64)})
    with pytest.raises(ValueError, match=r"not a stream of ColumnarAggState bins"):
        stream_bins(one_bin)
