"""A migration's new owner makes room for its incoming keys before the first bins arrive
(``MigrateBins`` with ``reserve``), and for the keys first seen while they move.

The oracle: the state's column capacity, read after the handler's ``on_begin`` and after installs of
more keys than the planner counted.
"""

from __future__ import annotations

import types

import numpy as np
import pyarrow as pa

from chiray.control.ops.migrate import MigrateBins
from chiray.operators.accumulators import Accumulator
from chiray.operators.columnarstate import ColumnarAggState

BINS = 16


def _filled(keys: list[str]) -> ColumnarAggState:
    state = ColumnarAggState(BINS)
    state.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    state.update(pa.array(keys), {"n": np.ones(len(keys), dtype=np.int64)})
    return state


def test_a_new_owner_takes_more_keys_than_planned_without_growing_its_columns():
    planned = 4000  # what the planner counted in the bins that move
    old = _filled([f"k{i}" for i in range(planned + planned // 10)])  # 10 % more arrived since
    op = MigrateBins("count", [1] * BINS, {b: (0, 1) for b in range(BINS)}, reserve={1: planned})
    new_owner = types.SimpleNamespace(instance=("count", 1), state=ColumnarAggState(BINS))
    MigrateBins.Instance(op, {"send": {}, "receive": list(range(BINS))}).on_begin(new_owner)
    new_owner.state.install_bins(old.extract_bins(range(BINS)))
    room = len(new_owner.state._bin)
    assert len(new_owner.state) == planned + planned // 10 <= room < 2 * planned, \
        "the installs fit the room made up front: the columns were not doubled (a stall at a large state)"


def test_a_retiring_old_owner_empties_without_compacting_and_gives_every_key_away():
    """A scale-in's retiring owner gives its bins away step by step; told it retires, it never
    compacts its few last keys (a stall at a large state) and still sends every key exactly once."""
    bins = 64  # one bin a step: the last ones leave under a 32nd of the keys live
    keys = [f"k{i}" for i in range(3000)]
    old = ColumnarAggState(bins)
    old.configure(pa.string(), [Accumulator("n", "sum", "int64")])
    old.update(pa.array(keys), {"n": np.ones(len(keys), dtype=np.int64)})
    receiver = ColumnarAggState(bins)
    slots_before = old._n
    for b in range(bins):
        op = MigrateBins("count", [0] * bins, {b: (1, 0)}, retiring=[1])
        sent: dict = {}
        owner = types.SimpleNamespace(instance=("count", 1), state=old, set_bin_table=lambda *a: None,
                                      attach=lambda target, payload: sent.update(payload["bins"]),
                                      ack=lambda payload: None)
        MigrateBins.Instance(op, {"send": {("count", 0): [b]}, "receive": []}).on_complete(owner)
        receiver.install_bins(sent)
        if len(old):
            assert old._n == slots_before, f"the retiring state compacted at {len(old)} keys"
    assert len(old) == 0
    slots = receiver.slots()
    assert dict(zip(receiver.keys_at(slots).to_pylist(), receiver.values(slots)["n"].tolist())) == dict.fromkeys(keys, 1)
