"""A batch that leaves its process carries its own rows, not the buffers it is a slice of.

Pickling an Arrow slice writes the whole buffers it views. An operator that emits a large table as
64K-row slices (a keyed top's final emission did) then sent each slice as the whole table: at 10M
NEXMark events q19's 34 slices per instance filled Ray's object store with tens of GB and spilled.
"""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from chiray.actors.runtime.messages import Data, Envelope, Parcel
from chiray.operators.batch import compacted
from chiray.operators.logic import InstanceInfo
from chiray.operators.sinks import CollectSink

ROWS = 200_000


def _table() -> pa.Table:
    return pa.table({"k": pa.array(range(ROWS), pa.int64()),
                     "s": pa.array([f"row-{i:06d}-" + "x" * 60 for i in range(ROWS)]),
                     "l": pa.array([[i, i + 1] for i in range(ROWS)]),
                     "n": pa.array([None if i % 3 else i for i in range(ROWS)], pa.int32())}).combine_chunks()


def _slices() -> list[pa.RecordBatch]:
    return _table().to_batches(max_chunksize=1 << 14)


def test_a_pickled_data_message_is_about_its_slice_not_the_whole_table() -> None:
    whole = _table().nbytes
    for piece in _slices()[1:4]:
        assert piece.get_total_buffer_size() > 5 * piece.nbytes  # the premise: a view into the whole table
        wire = len(pickle.dumps(Envelope(3, 7, Data(piece)), protocol=5))
        assert wire < 1.5 * piece.nbytes + 4096, (wire, piece.nbytes, whole)
        back = pickle.loads(pickle.dumps(Parcel(envelopes=[Envelope(3, 7, Data(piece))]), protocol=5))
        assert back.envelopes[0].message.batch.equals(piece)  # the same rows, nulls and nested values
        assert back.envelopes[0].message.batch.schema.equals(piece.schema, check_metadata=True)


def test_compacted_leaves_a_batch_that_owns_its_buffers_as_it_is() -> None:
    own = pa.record_batch({"k": pa.array(range(1000))})
    assert compacted(own) is own
    small_view = own.slice(10, 100)  # a view, but of so little that a copy saves nothing worth it
    assert compacted(small_view) is small_view


def test_compacted_keeps_schema_metadata_and_an_empty_slice() -> None:
    table = _table().replace_schema_metadata({"origin": "test"})
    piece = table.to_batches(max_chunksize=1 << 14)[2]
    copy = compacted(piece)
    assert copy is not piece and copy.equals(piece)
    assert copy.schema.metadata == {b"origin": b"test"}
    assert copy.get_total_buffer_size() <= 2 * piece.nbytes
    empty = table.slice(ROWS // 2, 0).to_batches()
    for batch in empty:
        assert compacted(batch).num_rows == 0


@pytest.mark.parametrize("index", [0, 1])
def test_a_collect_sink_sends_its_final_batches_compacted(index: int) -> None:
    writer = CollectSink().create_writer(InstanceInfo("out", index, 2))
    pieces = _slices()[:3]
    for piece in pieces:
        writer.write(piece)
    result = writer.finish()
    wire = len(pickle.dumps(result, protocol=5))
    assert wire < 1.5 * sum(p.nbytes for p in pieces) + 4096
    assert pa.Table.from_batches(result["batches"]).equals(pa.Table.from_batches(pieces))
