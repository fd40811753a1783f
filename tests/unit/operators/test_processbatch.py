"""Keyed ``process`` (per key) and ``process_batch`` (per batch) against a plain loop, with bins moving mid-stream.

Both keep a running (count, total) per key and emit it for every key a batch touched; the oracle is a Python
loop over the records, batch by batch. Their checkpoints (incremental too) and restores run in
``tests/unit/actors/test_incremental_checkpoints.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray.actors.jobs.harness import LocalRun
from chiray.operators import Dataflow, from_arrow
from chiray.operators.keygroups import group_by_key
from chiray.operators.keyed import ProcessLogic, ValueState
from chiray.operators.processbatch import KeyedBatch, ProcessBatchLogic

from .support import run_trading

BINS = 16
SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("total", pa.int64())])


def _batches(seed: int, count: int = 12, keys: int = 40) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        size = int(rng.integers(0, 60))
        names = [None if x == 0 else f"k{x}" for x in rng.integers(0, keys, size)]  # None: the null key
        out.append(pa.record_batch({"k": pa.array(names, pa.string()),
                                    "v": pa.array(rng.integers(-5, 100, size), pa.int64())}))
    return out


def _loop(batches: list[pa.RecordBatch]) -> dict[Any, list[tuple[int, int]]]:
    """Per key, its (count, total) after each batch that had it."""
    totals: dict[Any, tuple[int, int]] = {}
    emitted: dict[Any, list[tuple[int, int]]] = {}
    for batch in batches:
        seen = []
        for row in batch.to_pylist():
            n, t = totals.get(row["k"], (0, 0))
            totals[row["k"]] = (n + 1, t + row["v"])
            if row["k"] not in seen:
                seen.append(row["k"])
        for k in seen:
            emitted.setdefault(k, []).append(totals[k])
    return emitted


def count_sum(key: Any, rows: pa.RecordBatch, state: ValueState) -> list[dict]:
    n, total = state.value or (0, 0)
    state.value = (n + rows.num_rows, total + pc.sum(rows.column("v")).as_py())
    return [{"k": key, "n": state.value[0], "total": state.value[1]}]


def count_sum_batch(batch: KeyedBatch) -> pa.RecordBatch:
    counts = np.diff(batch.offsets)
    values = batch.rows.column("v").to_numpy()
    totals = np.add.reduceat(values, batch.offsets[:-1]) if len(values) else np.zeros(0, np.int64)
    batch.states = [(n + (s[0] if s else 0), int(t) + (s[1] if s else 0))
                    for s, n, t in zip(batch.states, counts.tolist(), totals.tolist())]
    return pa.RecordBatch.from_arrays([pa.array(batch.keys, pa.string()), pa.array([s[0] for s in batch.states]),
                                       pa.array([s[1] for s in batch.states])], schema=SCHEMA)


def _per_key(table: pa.Table) -> dict[Any, list[tuple[int, int]]]:
    out: dict[Any, list[tuple[int, int]]] = {}
    for row in table.to_pylist():
        out.setdefault(row["k"], []).append((row["n"], row["total"]))
    return out


@pytest.mark.parametrize("make", [lambda: ProcessLogic("k", count_sum, BINS),
                                  lambda: ProcessBatchLogic("k", count_sum_batch, BINS)], ids=["process", "batch"])
@pytest.mark.parametrize("seed", [1, 2])
def test_running_totals_match_a_loop_while_bins_move(make, seed):
    batches = _batches(seed)
    out, instances = run_trading(make, [(b, 0) for b in batches], ["k"], BINS, every=2)
    assert _per_key(out) == _loop(batches)
    final = {k: v for i in instances for k, v in i.state.items()}
    assert final == {k: seq[-1] for k, seq in _loop(batches).items()}


def test_group_by_key_keeps_first_appearance_and_arrival_order():
    batch = pa.record_batch({"k": ["b", None, "a", "b", None], "i": [0, 1, 2, 3, 4]})
    groups = group_by_key(batch, batch.column("k"), BINS)
    assert groups.keys == ["b", None, "a"]
    assert [(k, rows.column("i").to_pylist()) for k, _, rows in groups.slices()] == \
        [("b", [0, 3]), (None, [1, 4]), ("a", [2])]
    same = pa.record_batch({"k": ["x", "x", "y"]})  # already key by key: the batch itself
    assert group_by_key(same, same.column("k"), BINS).rows is same


def test_process_batch_that_breaks_its_states_or_raises_writes_no_state():
    def drop_one(batch: KeyedBatch) -> None:
        batch.states = batch.states[1:]

    logic = ProcessBatchLogic("k", drop_one, BINS)
    with pytest.raises(TypeError, match=r"drop_one left batch.states as 1 values; expected a list of 2"):
        logic.process(pa.record_batch({"k": ["a", "b"]}))

    def fail_after_setting(batch: KeyedBatch) -> None:
        batch.states[0] = "set"
        raise RuntimeError("user bug")

    logic = ProcessBatchLogic("k", fail_after_setting, BINS)
    with pytest.raises(RuntimeError):
        logic.process(pa.record_batch({"k": ["a"]}))
    assert len(logic.state) == 0


def test_process_state_cleared_by_none_and_values_changed_in_place_are_kept():
    def keep(key: Any, rows: pa.RecordBatch, state: ValueState) -> None:
        if key == "gone":
            state.clear()
        elif state.value is None:
            state.value = [rows.num_rows]
        else:
            state.value.append(rows.num_rows)  # in place, never assigned again

    logic = ProcessLogic("k", keep, BINS)
    logic.process(pa.record_batch({"k": ["a", "gone", "a"]}))
    logic.process(pa.record_batch({"k": ["a", "gone"]}))
    assert dict(logic.state.items()) == {"a": [2, 1]}


def test_process_batch_in_a_dataflow_equals_pandas():
    batches = _batches(3, count=6)
    flow = Dataflow("process_batch")
    (flow.source(from_arrow(batches), parallelism=1).key_by("k", num_bins=BINS)
         .process_batch(count_sum_batch, schema=SCHEMA, parallelism=2, name="count").collect(name="out"))
    got = LocalRun(flow).run()["out"].to_pandas()
    last = got.groupby("k", dropna=False).agg(n=("n", "max"), total=("total", "last"))
    frame = pa.Table.from_batches(batches).to_pandas()
    expected = frame.groupby("k", dropna=False).agg(n=("v", "size"), total=("v", "sum"))
    assert last.sort_index().equals(expected.sort_index())
