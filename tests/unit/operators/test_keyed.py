"""Tests for operators.keyed: built-in aggregations, keyed reduce and keyed process, against oracles."""

from __future__ import annotations

import datetime
import math
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.hashing import bins_of
from chiray.operators.keyed import (
    AggregateLogic,
    AggSpec,
    ProcessLogic,
    ReduceLogic,
    ValueState,
    aggregate_output_schema,
)
from chiray.operators.logic import InstanceInfo

from .support import move_bins, owned

NUM_BINS = 16
KEY_TYPES = {"string": pa.string(), "int": pa.int64()}
ALL_AGGS = [
    AggSpec("rows", "count"),
    AggSpec("n_i", "count", "i"),
    AggSpec("sum_i", "sum", "i"),
    AggSpec("sum_f", "sum", "f"),
    AggSpec("min_i", "min", "i"),
    AggSpec("max_i", "max", "i"),
    AggSpec("min_f", "min", "f"),
    AggSpec("max_f", "max", "f"),
    AggSpec("mean_i", "mean", "i"),
    AggSpec("mean_f", "mean", "f"),
]


def _schema(key_kind: str) -> pa.Schema:
    return pa.schema([("k", KEY_TYPES[key_kind]), ("i", pa.int64()), ("f", pa.float64())])


def _batches(seed: int, key_kind: str, count: int = 8, distinct: int = 60, nulls: float = 0.1) -> list[pa.RecordBatch]:
    """Random batches (some with zero rows), keys and values with nulls."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(count):
        n = 0 if b % 4 == 1 else int(rng.integers(1, 400))
        raw = rng.integers(0, distinct, n)
        keys: list[Any] = [f"key-{v}" for v in raw] if key_kind == "string" else (raw * 7919 - 100).tolist()
        ints: list[Any] = rng.integers(-50, 50, n).tolist()
        floats: list[Any] = rng.normal(size=n).tolist()
        for column in (keys, ints, floats):
            for i in np.flatnonzero(rng.random(n) < nulls):
                column[i] = None
        out.append(pa.record_batch([pa.array(keys, KEY_TYPES[key_kind]), pa.array(ints, pa.int64()),
                                    pa.array(floats, pa.float64())], schema=_schema(key_kind)))
    return out


def _py(value: Any) -> Any:
    if value is pd.NA or value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _pandas_oracle(batches: Sequence[pa.RecordBatch], aggs: Sequence[AggSpec]) -> dict[Any, tuple]:
    """Per key, the aggregates as pandas computes them (SQL null semantics)."""
    df = pa.Table.from_batches(batches).to_pandas(types_mapper=pd.ArrowDtype)
    groups = df.groupby("k", dropna=False, sort=False)
    columns = []
    for agg in aggs:
        if agg.func == "count":
            columns.append(groups.size() if agg.column is None else groups[agg.column].count())
        elif agg.func == "sum":
            columns.append(groups[agg.column].sum(min_count=1))
        else:
            columns.append(getattr(groups[agg.column], agg.func)())
    table = pd.concat(columns, axis=1)
    return {_py(k): tuple(_py(v) for v in row) for k, row in zip(table.index, table.itertuples(index=False))}


def _as_dict(batches: Sequence[pa.RecordBatch], key: str = "k") -> dict[Any, tuple]:
    out: dict[Any, tuple] = {}
    for batch in batches:
        for row in batch.to_pylist():
            k = row.pop(key)
            assert k not in out, f"key {k!r} emitted twice"
            out[k] = tuple(row.values())
    return out


def _assert_same(got: dict[Any, tuple], expected: dict[Any, tuple]) -> None:
    assert got.keys() == expected.keys()
    for k, row in expected.items():
        for g, e in zip(got[k], row):
            if isinstance(e, float) and g is not None:
                assert g == pytest.approx(e, rel=1e-9, abs=1e-12), (k, got[k], row)
            else:
                assert g == e, (k, got[k], row)


def _run(logic: Any, batches: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    logic.open(InstanceInfo("op", 0, 1, NUM_BINS))
    out: list[pa.RecordBatch] = []
    for batch in batches:
        out.extend(logic.process(batch, 0))
    out.extend(logic.finish())
    return out


# -- schema and specs -----------------------------------------------------------------------------


def test_output_schema_types() -> None:
    schema = pa.schema([("k", pa.string()), ("i", pa.int32()), ("u", pa.uint64()), ("f", pa.float32()),
                        ("t", pa.timestamp("ms", "UTC")), ("b", pa.bool_()), ("s", pa.string())])
    aggs = [AggSpec("a", "count"), AggSpec("b1", "count", "s"), AggSpec("c", "sum", "i"), AggSpec("d", "sum", "u"),
            AggSpec("e", "sum", "f"), AggSpec("g", "min", "i"), AggSpec("h", "max", "t"), AggSpec("j", "min", "b"),
            AggSpec("m", "mean", "i"), AggSpec("o", "max", "f")]
    out = aggregate_output_schema(schema, "k", aggs)
    assert out.names == ["k"] + [a.name for a in aggs]
    assert out.types == [pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.float64(), pa.int32(),
                         pa.timestamp("ms", "UTC"), pa.bool_(), pa.float64(), pa.float32()]


@pytest.mark.parametrize(("aggs", "error", "words"), [
    ([AggSpec("x", "sum", "s")], TypeError, ["'s'", "string", "integer, floating or decimal"]),
    ([AggSpec("x", "min", "s")], TypeError, ["'s'", "strings are not supported"]),
    ([AggSpec("x", "sum", "nope")], ValueError, ["'nope'", "input columns"]),
    ([AggSpec("x", "count"), AggSpec("x", "sum", "i")], ValueError, ["'x'", "twice"]),
    ([AggSpec("k", "count")], ValueError, ["'k'", "twice"]),
])
def test_output_schema_errors_name_the_column(aggs: list, error: type, words: list) -> None:
    schema = pa.schema([("k", pa.string()), ("i", pa.int64()), ("s", pa.string())])
    with pytest.raises(error) as info:
        aggregate_output_schema(schema, "k", aggs)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_output_schema_missing_key() -> None:
    with pytest.raises(ValueError, match="key column 'key'"):
        aggregate_output_schema(pa.schema([("k", pa.string())]), "key", [AggSpec("n", "count")])


def test_agg_spec_validation() -> None:
    with pytest.raises(ValueError, match="func must be one of"):
        AggSpec("x", "median", "v")
    with pytest.raises(ValueError, match="sum needs a column"):
        AggSpec("x", "sum")
    with pytest.raises(ValueError, match="non-empty"):
        AggSpec("", "count")


def test_aggregate_logic_argument_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        AggregateLogic("k", [], NUM_BINS)
    with pytest.raises(ValueError, match="emit"):
        AggregateLogic("k", [AggSpec("n", "count")], NUM_BINS, emit="sometimes")
    with pytest.raises(TypeError, match="AggSpec"):
        AggregateLogic("k", [("n", "count")], NUM_BINS)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="power of two"):
        AggregateLogic("k", [AggSpec("n", "count")], 10)


# -- AggregateLogic -------------------------------------------------------------------------------


@pytest.mark.parametrize("nulls", [0.0, 0.15])
@pytest.mark.parametrize("key_kind", sorted(KEY_TYPES))
def test_aggregate_final_matches_pandas(key_kind: str, nulls: float) -> None:
    batches = _batches(1, key_kind, nulls=nulls)
    logic = AggregateLogic("k", ALL_AGGS, NUM_BINS)
    out = _run(logic, batches)
    assert all(b.schema == aggregate_output_schema(_schema(key_kind), "k", ALL_AGGS) for b in out)
    _assert_same(_as_dict(out), _pandas_oracle(batches, ALL_AGGS))
    assert any(k is None for k in _as_dict(out)) == (nulls > 0)


@pytest.mark.parametrize("key_kind", sorted(KEY_TYPES))
def test_aggregate_updates_replay_to_the_oracle(key_kind: str) -> None:
    batches = _batches(2, key_kind)
    logic = AggregateLogic("k", ALL_AGGS, NUM_BINS, emit="updates")
    logic.open(InstanceInfo("op", 0, 1, NUM_BINS))
    table: dict[Any, tuple] = {}
    for batch in batches:
        out = logic.process(batch, 0)
        changed = _as_dict(out)
        assert set(changed) == set(batch.column("k").to_pylist())  # exactly the keys it touched
        table.update(changed)
    assert logic.finish() == []
    _assert_same(table, _pandas_oracle(batches, ALL_AGGS))


@pytest.mark.parametrize("emit", ["final", "updates"])
@pytest.mark.parametrize("key_kind", sorted(KEY_TYPES))
def test_aggregate_bins_move_between_instances_mid_stream(key_kind: str, emit: str) -> None:
    """Three instances behind a bin -> instance table; random bins move while the stream runs."""
    batches = _batches(3, key_kind, count=12)
    instances = [AggregateLogic("k", ALL_AGGS, NUM_BINS, emit) for _ in range(3)]
    table, owner = _run_moving_bins(instances, batches, np.random.default_rng(5))
    for logic in instances:
        assert set(logic.state.bins()) <= set(np.flatnonzero(owner == instances.index(logic)).tolist())
    _assert_same(table, _pandas_oracle(batches, ALL_AGGS))


def _run_moving_bins(instances: list, batches: Sequence[pa.RecordBatch],
                     rng: np.random.Generator) -> tuple[dict[Any, tuple], np.ndarray]:
    """Batches routed by bin to ``instances`` (the last starts with none); every third batch some bins
    move between two of them. Returns the results by key (the latest per key) and the bin owners."""
    owner = np.zeros(NUM_BINS, dtype=np.int64)
    owner[NUM_BINS // 2:] = 1
    table: dict[Any, tuple] = {}
    for step, batch in enumerate(batches):
        bins = bins_of(batch.column("k"), NUM_BINS)
        for i, logic in enumerate(instances):
            table.update(_as_dict(logic.process(batch.filter(pa.array(owner[bins] == i)), 0)))
        if step % 3 == 2:
            src, dst = rng.choice(len(instances), size=2, replace=False)
            move_bins(instances, owner, src, [b for b in owned(owner, src) if rng.random() < 0.6], dst)
    for logic in instances:
        table.update(_as_dict(logic.finish()))
    return table, owner


def test_aggregate_instance_with_installed_bins_only_can_finish() -> None:
    batches = _batches(4, "string")
    first = AggregateLogic("k", ALL_AGGS, NUM_BINS)
    _run(first, batches[:3])
    fresh = AggregateLogic("k", ALL_AGGS, NUM_BINS)
    fresh.state.install_bins(first.state.extract_bins(range(NUM_BINS)))
    out = fresh.finish()
    assert out[0].schema == aggregate_output_schema(_schema("string"), "k", ALL_AGGS)
    assert first.finish() == []
    _assert_same(_as_dict(out), _pandas_oracle(batches[:3], ALL_AGGS))


def test_aggregate_without_input_emits_nothing_and_zero_rows_are_fine() -> None:
    assert AggregateLogic("k", ALL_AGGS, NUM_BINS).finish() == []
    logic = AggregateLogic("k", ALL_AGGS, NUM_BINS, emit="updates")
    assert logic.process(pa.RecordBatch.from_pylist([], schema=_schema("int")), 0) == []
    assert logic.finish() == [] and logic.state.bins() == []
    final = AggregateLogic("k", ALL_AGGS, NUM_BINS)
    assert final.process(pa.RecordBatch.from_pylist([], schema=_schema("int")), 0) == []
    assert final.finish() == []


def test_one_key_and_all_null_values() -> None:
    batch = pa.record_batch({"k": ["x"] * 5, "i": pa.array([None] * 5, pa.int64()),
                             "f": pa.array([None] * 5, pa.float64())})
    out = _run(AggregateLogic("k", ALL_AGGS, NUM_BINS), [batch, batch])
    assert out[0].to_pylist() == [{"k": "x", "rows": 10, "n_i": 0, "sum_i": None, "sum_f": None, "min_i": None,
                                   "max_i": None, "min_f": None, "max_f": None, "mean_i": None, "mean_f": None}]


def test_min_max_of_temporal_bool_and_narrow_types_match_a_loop() -> None:
    rng = np.random.default_rng(9)
    n = 500
    base = datetime.datetime(2024, 1, 1)
    cols = {
        "k": pa.array(rng.integers(0, 20, n)),
        "t": pa.array([None if r < 0.1 else base + datetime.timedelta(seconds=int(s))
                       for r, s in zip(rng.random(n), rng.integers(0, 10**6, n))], pa.timestamp("us")),
        "d": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=int(v)) for v in rng.integers(0, 900, n)],
                      pa.date32()),
        "b": pa.array([None if r < 0.1 else bool(r > 0.5) for r in rng.random(n)]),
        "i8": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "f32": pa.array(rng.normal(size=n), pa.float32()),
    }
    batch = pa.record_batch(cols)
    aggs = [AggSpec(f"{f}_{c}", f, c) for c in ("t", "d", "b", "i8", "f32") for f in ("min", "max")]
    out = _as_dict(_run(AggregateLogic("k", aggs, NUM_BINS), [batch.slice(0, 200), batch.slice(200)]))
    expected: dict[Any, tuple] = {}
    rows = batch.to_pylist()
    for k in {r["k"] for r in rows}:
        values = []
        for agg in aggs:
            seen = [r[agg.column] for r in rows if r["k"] == k and r[agg.column] is not None]
            values.append((min if agg.func == "min" else max)(seen) if seen else None)
        expected[k] = tuple(values)
    _assert_same(out, expected)


def test_large_integer_sums_are_exact() -> None:
    values = [2**60 + 1, 2**60 + 3, 7, -(2**59)]
    batch = pa.record_batch({"k": ["a", "a", "b", "a"], "i": values})
    out = _as_dict(_run(AggregateLogic("k", [AggSpec("s", "sum", "i")], NUM_BINS), [batch]))
    assert out == {"a": (2**60 + 1 + 2**60 + 3 - 2**59,), "b": (7,)}


def test_float_keys_group_zero_signs_and_nans() -> None:
    batch = pa.record_batch({"k": [0.0, -0.0, float("nan"), float("nan"), None, 1.5]})
    out = _run(AggregateLogic("k", [AggSpec("n", "count")], NUM_BINS), [batch])
    counts = sorted(r["n"] for r in out[0].to_pylist())
    assert counts == [1, 1, 2, 2]


def test_aggregate_rejects_a_changed_schema_and_a_missing_key() -> None:
    logic = AggregateLogic("k", [AggSpec("s", "sum", "i")], NUM_BINS)
    logic.process(pa.record_batch({"k": ["a"], "i": [1]}), 0)
    with pytest.raises(ValueError, match="schema changed"):
        logic.process(pa.record_batch({"k": ["a"], "i": [1.5]}), 0)
    with pytest.raises(ValueError, match="key column 'k'"):
        AggregateLogic("k", [AggSpec("n", "count")], NUM_BINS).process(pa.record_batch({"x": [1]}), 0)


# -- ReduceLogic ----------------------------------------------------------------------------------


def _add(acc: dict, row: dict) -> dict:
    return {"k": acc["k"], "i": (acc["i"] or 0) + (row["i"] or 0), "f": acc["f"]}


def _reduce_oracle(batches: Sequence[pa.RecordBatch], fn: Callable[[dict, dict], dict]) -> dict[Any, tuple]:
    accs: dict[Any, dict] = {}
    for batch in batches:
        for row in batch.to_pylist():
            accs[row["k"]] = fn(accs[row["k"]], row) if row["k"] in accs else row
    return {k: tuple(v for name, v in acc.items() if name != "k") for k, acc in accs.items()}


@pytest.mark.parametrize("key_kind", sorted(KEY_TYPES))
def test_reduce_final_matches_a_loop_and_keeps_the_input_schema(key_kind: str) -> None:
    batches = _batches(6, key_kind)
    out = _run(ReduceLogic("k", _add, NUM_BINS), batches)
    assert all(b.schema == _schema(key_kind) for b in out)
    assert _as_dict(out) == _reduce_oracle(batches, _add)


def test_reduce_updates_replay_to_the_final_result_and_bins_move() -> None:
    batches = _batches(7, "string", count=10)
    rng = np.random.default_rng(1)
    instances = [ReduceLogic("k", _add, NUM_BINS, emit="updates") for _ in range(2)]
    owner = np.zeros(NUM_BINS, dtype=np.int64)
    table: dict[Any, tuple] = {}
    for step, batch in enumerate(batches):
        bins = bins_of(batch.column("k"), NUM_BINS)
        for i, logic in enumerate(instances):
            out = logic.process(batch.filter(pa.array(owner[bins] == i)), 0)
            table.update(_as_dict(out))
        if step % 2 == 1:
            src = int(rng.integers(0, 2))
            move_bins(instances, owner, src, [b for b in instances[src].state.bins() if rng.random() < 0.5])
    assert all(logic.finish() == [] for logic in instances)
    assert table == _reduce_oracle(batches, _add)


def test_reduce_that_changes_the_columns_fails_at_that_call() -> None:
    """Keys that saw one row keep the record's columns, others would not: the sink got mixed schemas."""
    calls = []

    def count(acc: dict, row: dict) -> dict:
        calls.append(row)
        return {"k": acc["k"], "count": acc.get("count", 1) + 1}

    batch = pa.record_batch({"k": ["a", "b", "a", "a"], "v": [1, 2, 3, 4]})
    with pytest.raises(TypeError, match=r"reduce function .*count.* returned columns \['count', 'k'\]; "
                                        r"expected the record's columns \['k', 'v'\] \(added \['count'\]; "
                                        r"dropped \['v'\]\).*process\(fn, schema=...\)"):
        _run(ReduceLogic("k", count, NUM_BINS), [batch])
    assert len(calls) == 1  # the first call that changed them, not the end of the job


def test_reduce_rejects_a_function_that_returns_no_dict() -> None:
    logic = ReduceLogic("k", lambda acc, row: None, NUM_BINS)  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="expected a dict"):
        logic.process(pa.record_batch({"k": ["a", "a"]}), 0)
    with pytest.raises(TypeError, match="callable"):
        ReduceLogic("k", 42, NUM_BINS)  # type: ignore[arg-type]


# -- ProcessLogic ---------------------------------------------------------------------------------


def test_process_calls_keys_in_first_appearance_order_with_rows_in_arrival_order() -> None:
    calls: list[tuple[Any, list]] = []

    def record(key: Any, rows: pa.RecordBatch, state: ValueState) -> None:
        calls.append((key, rows.column("v").to_pylist()))

    batch = pa.record_batch({"k": ["b", None, "a", "b", None, "a", "b"], "v": [0, 1, 2, 3, 4, 5, 6]})
    assert ProcessLogic("k", record, NUM_BINS).process(batch, 0) == []
    assert calls == [("b", [0, 3, 6]), (None, [1, 4]), ("a", [2, 5])]


def _session(key: Any, rows: pa.RecordBatch, state: ValueState) -> list[dict]:
    """Emit a row every time a key has seen 5 rows in all, then start over."""
    out = []
    for v in rows.column("v").to_pylist():
        seen = (state.value or 0) + 1
        if seen == 5:
            out.append({"k": key, "last": v})
            state.clear()
        else:
            state.value = seen
    return out


def _session_oracle(batches: Sequence[pa.RecordBatch]) -> list[tuple]:
    seen: dict[Any, int] = {}
    out = []
    for batch in batches:
        emitted = []
        rows = batch.to_pylist()
        for key in dict.fromkeys(r["k"] for r in rows):
            for r in rows:
                if r["k"] == key:
                    seen[key] = seen.get(key, 0) + 1
                    if seen[key] == 5:
                        emitted.append((key, r["v"]))
                        del seen[key]
        out.extend(emitted)
    return out


def test_process_state_persists_across_batches_and_bins_move() -> None:
    rng = np.random.default_rng(3)
    batches = [pa.record_batch({"k": [f"k{v}" if v else None for v in rng.integers(0, 12, 40)],
                                "v": np.arange(40) + 40 * i}) for i in range(10)]
    instances = [ProcessLogic("k", _session, NUM_BINS) for _ in range(2)]
    owner = np.zeros(NUM_BINS, dtype=np.int64)
    emitted = []
    for step, batch in enumerate(batches):
        bins = bins_of(batch.column("k"), NUM_BINS)
        for i, logic in enumerate(instances):
            for out in logic.process(batch.filter(pa.array(owner[bins] == i)), 0):
                emitted.extend((r["k"], r["last"]) for r in out.to_pylist())
        if step % 2 == 0:
            src = int(rng.integers(0, 2))
            move_bins(instances, owner, src, [b for b in instances[src].state.bins() if rng.random() < 0.5])
    assert sorted(emitted, key=repr) == sorted(_session_oracle(batches), key=repr)


class _Tally:
    """A user object as keyed state: it moves with its bin, pickled (only user state is)."""

    def __init__(self) -> None:
        self.seen: list[int] = []


def test_user_objects_in_process_state_and_reduce_accumulators_move_with_their_bins() -> None:
    """Their state is the user's (any objects): kept with ``pickled=True``, it moves pickled."""
    def tally(key: Any, rows: pa.RecordBatch, state: ValueState) -> list[dict]:
        state.value = state.value or _Tally()
        state.value.seen += rows.column("v").to_pylist()
        return [{"k": key, "seen": list(state.value.seen)}]

    batch = pa.record_batch({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    process = [ProcessLogic("k", tally, NUM_BINS) for _ in range(2)]
    process[0].process(batch, 0)
    move_bins(process, np.zeros(NUM_BINS, dtype=np.int64), 0, process[0].state.bins())
    assert process[1].state.pickled and len(process[0].state) == 0
    assert process[1].process(batch.slice(2), 0)[0].to_pylist() == [{"k": "a", "seen": [1, 3, 3]}]
    add = lambda acc, row: {"k": row["k"], "v": acc["v"] + row["v"]}  # noqa: E731
    reduce = [ReduceLogic("k", add, NUM_BINS) for _ in range(2)]
    reduce[0].process(batch, 0)
    move_bins(reduce, np.zeros(NUM_BINS, dtype=np.int64), 0, reduce[0].state.bins())
    assert reduce[1].state.pickled and sorted(reduce[1].finish()[0].to_pylist(), key=lambda r: r["k"]) == [
        {"k": "a", "v": 4}, {"k": "b", "v": 2}]


def test_process_concatenates_outputs_in_order_and_casts_to_the_output_schema() -> None:
    def echo(key: Any, rows: pa.RecordBatch, state: ValueState) -> pa.RecordBatch:
        return pa.record_batch({"k": rows.column("k"), "v": pa.array(rows.column("v").to_pylist(), pa.int32())})

    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    batch = pa.record_batch({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    out = ProcessLogic("k", echo, NUM_BINS, output_schema=schema).process(batch, 0)
    assert len(out) == 1 and out[0].schema == schema
    assert out[0].to_pylist() == [{"k": "a", "v": 1}, {"k": "a", "v": 3}, {"k": "b", "v": 2}]


def test_process_rejects_outputs_of_another_schema() -> None:
    def odd(key: Any, rows: pa.RecordBatch, state: ValueState) -> list[dict]:
        return [{"k": key}] if key == "a" else [{"other": 1.5}]

    with pytest.raises(TypeError, match=r"process\(\.\.\., schema=") as info:
        ProcessLogic("k", odd, NUM_BINS).process(pa.record_batch({"k": ["a", "b"]}), 0)
    assert "output_schema" not in str(info.value)  # the parameter is schema=


def test_process_without_a_schema_never_casts_or_drops_silently() -> None:
    """The first output fixes the schema; 2.0 after 1 and an extra 'note' field are errors, not 2 and a drop."""
    def scores(key: Any, rows: pa.RecordBatch, state: ValueState) -> pa.RecordBatch:
        state.value = (state.value or 0) + 1
        if state.value == 1:
            return pa.record_batch({"k": [key], "score": [1]})
        return pa.record_batch({"k": [key], "score": [2.0], "note": ["again"]})

    logic = ProcessLogic("k", scores, NUM_BINS)
    assert logic.process(pa.record_batch({"k": ["a"]}), 0)[0].to_pylist() == [{"k": "a", "score": 1}]
    with pytest.raises(TypeError) as info:
        logic.process(pa.record_batch({"k": ["a"]}), 0)
    message = str(info.value)
    assert "scores" in message and "field 'score' as double where the first output had int64" in message
    assert "field 'note' (string) that the first output did not have" in message

    def plain(key: Any, rows: pa.RecordBatch, state: ValueState) -> pa.RecordBatch:
        state.value = (state.value or 0) + 1
        return pa.record_batch({"k": [key], "score": [1 if state.value == 1 else 2.5]})

    declared = ProcessLogic("k", plain, NUM_BINS, pa.schema([("k", pa.string()), ("score", pa.float64())]))
    outs = [declared.process(pa.record_batch({"k": ["a"]}), 0)[0].to_pylist() for _ in range(2)]
    assert outs == [[{"k": "a", "score": 1.0}], [{"k": "a", "score": 2.5}]]  # declared: cast, exactly


def test_process_value_state_none_clears_and_zero_rows_are_fine() -> None:
    def toggle(key: Any, rows: pa.RecordBatch, state: ValueState) -> None:
        state.value = None if state.value else "on"

    logic = ProcessLogic("k", toggle, NUM_BINS)
    batch = pa.record_batch({"k": ["a"]})
    logic.process(batch, 0)
    assert len(logic.state) == 1
    logic.process(batch, 0)
    assert len(logic.state) == 0
    assert logic.process(pa.RecordBatch.from_pylist([], schema=batch.schema), 0) == []


def test_process_infers_row_outputs_over_all_keys_of_a_batch() -> None:
    """A null key first must not fix the output key column's type to null."""
    from chiray.operators.keyed import ProcessLogic
    from chiray.operators.logic import InstanceInfo

    logic = ProcessLogic("k", lambda key, rows, state: [{"k": key, "n": rows.num_rows}], 16)
    logic.open(InstanceInfo("p", 0, 1, 16))
    batch = pa.record_batch({"k": pa.array([None, "a", None, "b"], pa.string()), "v": [1, 2, 3, 4]})
    [out] = logic.process(batch, 0)
    assert out.schema.field("k").type == pa.string()
    assert sorted(out.to_pylist(), key=lambda r: str(r["k"])) == [
        {"k": None, "n": 2}, {"k": "a", "n": 1}, {"k": "b", "n": 1}]
    [later] = logic.process(pa.record_batch({"k": ["c"], "v": [5]}), 0)
    assert later.to_pylist() == [{"k": "c", "n": 1}]


def test_timer_register_takes_integer_ticks_and_refuses_a_datetime_clearly() -> None:
    import datetime

    from chiray.operators.timers import KeyContext, TimerState

    store = TimerState(NUM_BINS)
    ctx = KeyContext(store, "a", 3)
    ctx.register(np.int64(50))
    ctx.register(10)
    assert ctx.timers == [10, 50]
    for bad in (datetime.datetime(2026, 1, 1), 12.5, True):
        with pytest.raises(TypeError, match=r"state.register\(time\): expected an integer in the unit of the "
                                            r"watermarks"):
            ctx.register(bad)
    assert "int(pd.Timestamp(t).value)" in str(pytest.raises(TypeError, ctx.register,
                                                             datetime.datetime(2026, 1, 1)).value)
    assert ctx.timers == [10, 50]  # nothing truncated in


def _decimal_batches(seed: int, count: int = 6) -> list[pa.RecordBatch]:
    import decimal

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(0, 40))
        keys = [f"k{int(i)}" for i in rng.integers(0, 9, n)]
        cents = rng.integers(-10**12, 10**12, n)
        values = [None if rng.random() < 0.1 else decimal.Decimal(int(c)).scaleb(-2) for c in cents]
        out.append(pa.record_batch({"k": pa.array(keys, pa.string()), "v": pa.array(values, pa.decimal128(16, 2))}))
    return out


DECIMAL_AGGS = [AggSpec("s", "sum", "v"), AggSpec("lo", "min", "v"), AggSpec("hi", "max", "v"),
                AggSpec("m", "mean", "v"), AggSpec("n", "count", "v")]


def test_decimal_aggregates_are_exact_against_python_decimals_also_across_a_bin_migration() -> None:
    """What Spark's DECIMAL becomes through the bridge: sums exact, min/max of the same type, mean as float."""
    import decimal

    batches = _decimal_batches(7)
    first, second = (AggregateLogic("k", DECIMAL_AGGS, NUM_BINS) for _ in range(2))
    half = len(batches) // 2
    _run(first, batches[:half])
    moving = [b for b in range(NUM_BINS) if b % 2]
    second.state.install_bins(first.state.extract_bins(moving))  # half the bins move mid-stream
    owner = np.array([1 if b % 2 else 0 for b in range(NUM_BINS)])
    for batch in batches[half:]:
        bins = bins_of(batch.column("k"), NUM_BINS)
        for i, logic in enumerate((first, second)):
            logic.process(batch.filter(pa.array(owner[bins] == i)), 0)
    table = pa.Table.from_batches([b for logic in (first, second) for b in logic.finish()])
    assert table.schema.field("s").type == pa.decimal128(38, 2)
    assert table.schema.field("lo").type == pa.decimal128(16, 2) and table.schema.field("m").type == pa.float64()
    got = {r["k"]: r for r in table.to_pylist()}
    expected: dict[str, list] = {}
    for batch in batches:  # the oracle: a plain loop over Python Decimals
        for k, v in zip(batch.column("k").to_pylist(), batch.column("v").to_pylist()):
            expected.setdefault(k, []).append(v)
    assert set(got) == set(expected)
    for k, values in expected.items():
        present = [v for v in values if v is not None]
        row = got[k]
        assert row["n"] == len(present)
        assert row["s"] == (sum(present, decimal.Decimal(0)) if present else None)
        assert row["lo"] == (min(present) if present else None) and row["hi"] == (max(present) if present else None)
        if present:
            assert row["m"] == pytest.approx(float(sum(present) / len(present)), rel=1e-12)


def test_wide_decimals_are_refused_with_a_way_out() -> None:
    schema = pa.schema([("k", pa.string()), ("v", pa.decimal128(30, 4))])
    with pytest.raises(TypeError, match=r"decimal128 up to precision 18.*cast it to decimal128\(18, 4\) or to float64"):
        aggregate_output_schema(schema, "k", [AggSpec("s", "sum", "v")])


# -- first, last, arg_min, arg_max, count_distinct ------------------------------------------------

PICK_AGGS = [
    AggSpec("first_s", "first", "s"),
    AggSpec("last_s", "last", "s"),
    AggSpec("first_t", "first", "t"),
    AggSpec("last_i", "last", "i"),
    AggSpec("lo_s", "arg_min", "i", "s"),
    AggSpec("hi_s", "arg_max", "i", "s"),
    AggSpec("hi_t", "arg_max", "t", "i"),
    AggSpec("lo_row", "arg_min", "i"),
    AggSpec("d_i", "count_distinct", "i"),
    AggSpec("d_s", "count_distinct", "s"),
    AggSpec("min_i", "min", "i"),  # shares its state column with arg_min of i
]


def _pick_batches(seed: int, count: int = 9) -> list[pa.RecordBatch]:
    """Batches of (k, i, s, t) with nulls, repeated values (ties, duplicates) and an empty batch."""
    rng = np.random.default_rng(seed)
    schema = pa.schema([("k", pa.string()), ("i", pa.int64()), ("s", pa.string()), ("t", pa.timestamp("ms"))])
    out = []
    base = datetime.datetime(2026, 1, 1)
    for b in range(count):
        n = 0 if b == 4 else int(rng.integers(1, 300))
        keys = [f"key-{v}" for v in rng.integers(0, 40, n)]
        ints: list[Any] = rng.integers(0, 12, n).tolist()
        strings: list[Any] = [f"s{v}" for v in rng.integers(0, 9, n)]
        times: list[Any] = [base + datetime.timedelta(seconds=int(v)) for v in rng.integers(0, 50, n)]
        for column in (ints, strings, times):
            for i in np.flatnonzero(rng.random(n) < 0.15):
                column[i] = None
        out.append(pa.record_batch([pa.array(keys, pa.string()), pa.array(ints, pa.int64()),
                                    pa.array(strings, pa.string()), pa.array(times, pa.timestamp("ms"))],
                                   schema=schema))
    return out


def _pick_oracle(batches: Sequence[pa.RecordBatch]) -> dict[Any, tuple]:
    """The aggregates of PICK_AGGS with a plain loop over the rows in arrival order."""
    rows: dict[Any, list[dict]] = {}
    for batch in batches:
        for row in batch.to_pylist():
            rows.setdefault(row["k"], []).append(row)

    def values(group: list[dict], c: str) -> list[dict]:
        return [r for r in group if r[c] is not None]

    def arg(group: list[dict], c: str, pick: Callable) -> dict | None:
        present = values(group, c)
        if not present:
            return None
        best = pick(r[c] for r in present)
        return next(r for r in present if r[c] == best)  # the earliest row on ties

    out = {}
    for k, group in rows.items():
        lo, hi, hi_t = arg(group, "i", min), arg(group, "i", max), arg(group, "t", max)
        out[k] = (
            next((r["s"] for r in group if r["s"] is not None), None),
            next((r["s"] for r in reversed(group) if r["s"] is not None), None),
            next((r["t"] for r in group if r["t"] is not None), None),
            next((r["i"] for r in reversed(group) if r["i"] is not None), None),
            lo and lo["s"], hi and hi["s"], hi_t and hi_t["i"], lo,
            len({r["i"] for r in values(group, "i")}),
            len({r["s"] for r in values(group, "s")}),
            min((r["i"] for r in values(group, "i")), default=None),
        )
    return out


def test_pick_and_distinct_aggregates_match_a_loop_and_pandas() -> None:
    batches = _pick_batches(11)
    got = _as_dict(_run(AggregateLogic("k", PICK_AGGS, NUM_BINS), batches))
    assert got == _pick_oracle(batches)
    # pandas agrees where it has the same functions: first / last skip nulls, nunique, idxmax (the first on ties)
    df = pa.Table.from_batches(batches).to_pandas()
    g = df.groupby("k")
    assert {k: got[k][0] for k in got} == {k: (None if pd.isna(v) else v) for k, v in g["s"].first().items()}
    assert {k: got[k][8] for k in got} == g["i"].nunique().to_dict()
    rows_hi = df.loc[g["i"].idxmax().dropna().astype(int)]
    assert {k: got[k][5] for k in got if got[k][5] is not None or k in set(rows_hi["k"])} == \
        {r.k: (None if pd.isna(r.s) else r.s) for r in rows_hi.itertuples()}


def test_pick_aggregate_output_types() -> None:
    schema = _pick_batches(1)[0].schema
    out = aggregate_output_schema(schema, "k", PICK_AGGS)
    assert [out.field(n).type for n in ("first_s", "first_t", "lo_s", "hi_t", "d_s")] == [
        pa.string(), pa.timestamp("ms"), pa.string(), pa.int64(), pa.int64()]
    assert out.field("lo_row").type == pa.struct(list(schema))


@pytest.mark.parametrize("emit", ["final", "updates"])
def test_pick_aggregates_survive_bins_moving_between_instances_mid_stream(emit: str) -> None:
    """The object state columns (values, rows, sets) travel with their bins; the oracle is the one-instance loop."""
    batches = _pick_batches(12, count=12)
    instances = [AggregateLogic("k", PICK_AGGS, NUM_BINS, emit) for _ in range(3)]
    table, _ = _run_moving_bins(instances, batches, np.random.default_rng(8))
    assert table == _pick_oracle(batches)


def test_pick_aggregates_changes_since_a_replica_carry_the_object_columns() -> None:
    """extract_changes / apply_changes (a replicated bin's delta) keep first, arg_max and distinct sets."""
    batches = _pick_batches(13)
    old = AggregateLogic("k", PICK_AGGS, NUM_BINS)
    old.open(InstanceInfo("op", 0, 1, NUM_BINS))
    for batch in batches[:5]:
        old.process(batch, 0)
    replica = AggregateLogic("k", PICK_AGGS, NUM_BINS)
    bins = old.state.bins()
    replica.state.install_bins(old.state.snapshot_bins(bins))
    versions = {b: old.state.version(b) for b in bins}
    for batch in batches[5:]:
        old.process(batch, 0)
    everything = set(bins) | set(old.state.bins())
    replica.state.install_bins(old.state.extract_bins(everything - set(bins)))
    replica.state.apply_changes(old.state.extract_changes(versions))
    assert _as_dict(replica.finish()) == _pick_oracle(batches)


def test_pick_aggregate_specs_are_checked() -> None:
    schema = _pick_batches(1)[0].schema
    with pytest.raises(ValueError, match="only arg_min and arg_max take a third item"):
        AggSpec("x", "first", "s", "i")
    with pytest.raises(ValueError, match="column 'nope' is not in the input columns"):
        aggregate_output_schema(schema, "k", [AggSpec("x", "arg_max", "i", "nope")])
    with pytest.raises(TypeError, match="'x'.*arg_max needs a numeric, boolean or temporal column.*'s'"):
        aggregate_output_schema(schema, "k", [AggSpec("x", "arg_max", "s", "i")])
    nested = pa.schema([("k", pa.string()), ("l", pa.list_(pa.int64()))])
    with pytest.raises(TypeError, match="count_distinct needs a column of scalar values; column 'l'"):
        aggregate_output_schema(nested, "k", [AggSpec("x", "count_distinct", "l")])
