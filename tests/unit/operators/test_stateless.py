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
