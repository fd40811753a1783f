"""Source watermarks: bounded disorder or a user function, per split, kept in the split's offset."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from chiray.operators import bounded_out_of_orderness, from_items, watermarks_from
from chiray.operators.endpoints import SourceLogic
from chiray.operators.watermarks import WatermarkedSource

ROWS = [{"t": t} for t in [5, 3, 9, 7, 8, 20, 12, 15]]


def test_bounded_watermark_is_the_running_max_minus_the_delay_and_survives_a_reopen():
    src = WatermarkedSource(from_items(ROWS, batch_size=2), bounded_out_of_orderness("t", 4))
    split = src.splits()[0]
    reader = src.open_split(split)
    marks = []
    for _ in range(2):
        reader.read()
        marks.append(reader.watermark)
    assert marks == [5 - 4 - 1, 9 - 4 - 1]
    resumed = src.open_split(split, reader.offset())  # a replay from a checkpoint keeps event time
    assert resumed.watermark == marks[-1]
    resumed.read()  # rows 8, 20
    assert resumed.watermark == 20 - 5
    resumed.read()  # rows 12, 15: the max does not go back, nor does the watermark
    assert resumed.watermark == 15


def test_user_function_watermarks_never_go_backwards():
    fn = watermarks_from(lambda b: min(b.column("t").to_pylist()))
    logic = SourceLogic(WatermarkedSource(from_items(ROWS, batch_size=2), fn), from_items(ROWS).splits())
    seen = []
    while logic.poll() is not None:
        seen.append(logic.watermark()[0])
    assert seen == [3, 7, 8, 12]


def test_a_source_watermarks_only_from_its_last_split():
    src = WatermarkedSource(from_items(ROWS, batch_size=2, num_splits=2), bounded_out_of_orderness("t", 0))
    logic = SourceLogic(src, src.splits())
    marks = []
    while logic.poll() is not None:
        marks.append(logic.watermark()[0])
    assert marks[:2] == [None, None] and marks[2:] == [19, 19]  # the second split may still hold old records


def test_strategy_errors_name_the_operator_and_column():
    schema = pa.schema([("t", pa.string())])
    with pytest.raises(TypeError, match=r"operator 'src': event-time column 't' must be a timestamp or an integer"):
        bounded_out_of_orderness("t", 1).check(schema, "operator 'src'")
    with pytest.raises(ValueError, match=r"unknown event-time column 'x'"):
        bounded_out_of_orderness("x", 1).check(schema, "operator 'src'")
    ts = pa.schema([("t", pa.timestamp("ms"))])
    bounded_out_of_orderness("t", datetime.timedelta(seconds=1)).check(ts, "operator 'src'")


def test_a_watermarked_source_passes_read_ahead_messages_and_its_inner_offsets_through():
    seen = []
    inner = from_items(ROWS, batch_size=2)
    inner.read_ahead = lambda: 3  # as a source fed from outside would answer
    inner.checkpoint_complete = lambda checkpoint_id, offsets: seen.append((checkpoint_id, offsets))
    src = WatermarkedSource(inner, bounded_out_of_orderness("t", 4))
    assert src.read_ahead() == 3
    src.checkpoint_complete(7, {"a": (4, 12), "b": None})
    assert seen == [(7, {"a": 4, "b": None})]  # the inner source's own offsets, watermarks stripped
    reader = src.open_split(src.splits()[0])
    with pytest.raises(TypeError, match="takes no messages"):
        reader.receive("hello")  # the inner reader takes none: the wrapper passes that on
