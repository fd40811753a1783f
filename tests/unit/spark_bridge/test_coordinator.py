"""What the coordinators count as row data in the calls they receive (no Ray cluster needed)."""

from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("ray")

from chiray.spark_bridge.coordinator import row_bytes  # noqa: E402  (after the importorskip)
from chiray.spark_bridge.messages import Destination, Push  # noqa: E402
from chiray.spark_bridge.push import encode  # noqa: E402


def test_row_bytes_finds_row_data_however_deeply_it_is_nested_and_nothing_else():
    batch = pa.RecordBatch.from_pylist([{"k": f"k{i}", "v": i} for i in range(100)])
    data = encode(batch)
    destination = Destination(None, "src", 0, "src-p0", "token")
    assert row_bytes(((0, 1), destination, 7, "a string", None)) == 0  # what the coordinators do receive
    push = Push("token", (0, 1), 1, 2, 0, data, batch.num_rows)
    assert row_bytes(([push], {"x": batch})) == len(data) + batch.nbytes
    assert row_bytes((pa.py_buffer(data), bytearray(3), memoryview(b"ab"))) == len(data) + 5
