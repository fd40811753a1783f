"""Stateless operators: what user functions may return, and the errors when they return something else."""

from __future__ import annotations

import pyarrow as pa
import pytest


def test_map_may_return_a_pandas_dataframe():
    from chiray.operators.stateless import MapLogic

    batch = pa.record_batch({"x": [1, 2, 3]})
    out = MapLogic(lambda b: b.to_pandas().assign(y=lambda d: d["x"] * 2)).process(batch, 0)
    assert pa.Table.from_batches(out).to_pydict() == {"x": [1, 2, 3], "y": [2, 4, 6]}


def test_map_records_returning_no_dict_names_the_function_and_what_came_back():
    from chiray.operators.stateless import MapRecordsLogic

    def pair(row):
        return row["x"], row["x"] * 2

    with pytest.raises(TypeError, match=r"map_records function .*pair returned tuple \(1, 2\); expected a dict"):
        MapRecordsLogic(pair).process(pa.record_batch({"x": [1]}), 0)


@pytest.mark.parametrize("mask", [pa.array([1, 0, 1]), [1, 0, 1]], ids=["arrow-int", "list-int"])
def test_filter_with_an_integer_mask_says_booleans_are_expected(mask):
    from chiray.operators.stateless import FilterLogic

    def odd(batch):
        return mask

    with pytest.raises(TypeError, match=r"filter function .*odd returned a mask of .*int64.*expected booleans"):
        FilterLogic(odd).process(pa.record_batch({"x": [1, 2, 3]}), 0)


def test_a_map_whose_output_type_changes_between_batches_fails_there_naming_the_column():
    import pyarrow.compute as pc

    from chiray.operators.stateless import MapLogic

    def widen(b):  # strings from the second batch on: a common slip (str(x) in one branch)
        return b.set_column(0, "v", pc.cast(b["v"], pa.string())) if b["v"][0].as_py() > 2 else b

    logic = MapLogic(widen)
    assert logic.process(pa.record_batch({"v": [1, 2]}), 0)[0].schema.field("v").type == pa.int64()
    with pytest.raises(TypeError, match=r"map function .*widen changed the type of column 'v' between batches: "
                                        r"first int64, now string; cast it"):
        logic.process(pa.record_batch({"v": [3, 4]}), 0)


def test_a_map_whose_columns_change_between_batches_fails_naming_both():
    from chiray.operators.stateless import FlatMapLogic

    logic = FlatMapLogic(lambda b: b if b["v"][0].as_py() < 3 else b.rename_columns(["w"]))
    logic.process(pa.record_batch({"v": [1]}), 0)
    with pytest.raises(TypeError, match=r"flat_map function .* changed its output columns between batches: "
                                        r"first \['v'\], now \['w'\]"):
        logic.process(pa.record_batch({"v": [5]}), 0)


def test_map_records_absorbs_all_null_columns_and_column_order_and_refuses_real_drift():
    from chiray.operators.stateless import MapRecordsLogic

    logic = MapRecordsLogic(lambda r: {"k": r["k"], "x": r["x"]} if r["k"] != "b" else {"x": r["x"], "k": r["k"]})
    first = logic.process(pa.record_batch({"k": ["a"], "x": [1.5]}), 0)[0]
    nulls = logic.process(pa.record_batch({"k": ["a"], "x": pa.array([None], pa.float64())}), 0)[0]
    reordered = logic.process(pa.record_batch({"k": ["b"], "x": [2.5]}), 0)[0]
    assert nulls.schema == reordered.schema == first.schema  # x inferred as null: cast back to double
    assert reordered.to_pylist() == [{"k": "b", "x": 2.5}]
    with pytest.raises(TypeError, match=r"map_records function .* column 'x' between batches: first double, now string"):
        logic.process(pa.record_batch({"k": ["a"], "x": ["text"]}), 0)


def test_a_declared_schema_is_what_every_batch_is_cast_to_without_the_drift_check():
    from chiray.operators.stateless import MapRecordsLogic

    schema = pa.schema([("x", pa.float64())])
    logic = MapRecordsLogic(lambda r: {"x": r["x"]}, schema)
    assert logic.process(pa.record_batch({"x": [1]}), 0)[0].schema == schema
    assert logic.process(pa.record_batch({"x": [1.5]}), 0)[0].schema == schema


def test_a_map_without_schema_gives_columns_it_passes_through_unchanged_their_input_types():
    from chiray.operators.stateless import MapLogic, MapRecordsLogic

    batch = pa.record_batch({"ts": pa.array([1_000, 2_001], pa.timestamp("ms")), "n": pa.array([1, 2], pa.int32()),
                             "s": ["a", "b"]})
    assert pa.RecordBatch.from_pylist(batch.to_pylist()).schema.field("ts").type == pa.timestamp("us")  # the trap
    (rows,) = MapLogic(lambda b: b.to_pylist()).process(batch, 0)
    assert rows.schema == batch.schema and rows.equals(batch)
    (changed,) = MapLogic(lambda b: [{**r, "n": r["n"] * 10} for r in b.to_pylist()]).process(batch, 0)
    assert changed.schema.field("n").type == pa.int64() and changed.column("n").to_pylist() == [10, 20]
    assert changed.schema.field("ts").type == pa.timestamp("ms")
    (each,) = MapRecordsLogic(lambda r: {**r, "extra": 1}).process(batch, 0)
    assert each.schema.field("ts").type == pa.timestamp("ms") and each.schema.field("n").type == pa.int32()
    (declared,) = MapLogic(lambda b: b.to_pylist(), schema=pa.schema([("ts", pa.timestamp("us")),
                                                                      ("n", pa.int64()), ("s", pa.string())])
                           ).process(batch, 0)
    assert declared.schema.field("ts").type == pa.timestamp("us")  # a declared schema is what it says
