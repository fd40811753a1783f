"""SourceLogic: split assignment and offsets, especially after a restore."""

from __future__ import annotations

import pyarrow as pa
import pytest

from chiray.operators.endpoints import SourceLogic, assign_splits
from chiray.operators.logic import InstanceInfo, Source, SourceSplit, SplitAddress, SplitReader
from chiray.operators.sources import from_items


def test_a_restored_instance_keeps_and_reports_only_its_own_splits_offsets():
    source = from_items([{"x": i} for i in range(40)], batch_size=5, num_splits=4)
    splits = source.splits()
    mine = assign_splits(splits, 2, 1)  # splits 1 and 3
    everything = {s.split_id: 5 for s in splits}  # a restore hands every instance the whole operator's offsets
    logic = SourceLogic(source, mine, everything)
    assert set(logic.offsets()) == {s.split_id for s in mine}
    rows = []
    while (batch := logic.poll()) is not None:
        rows.extend(batch.column("x").to_pylist())
    # Each of its splits holds 10 rows and resumes after its first 5.
    expected = [x for s in (1, 3) for x in range(s * 10 + 5, s * 10 + 10)]
    assert rows == expected
    assert set(logic.offsets()) == {s.split_id for s in mine}


class _Fed(SplitReader):
    """A reader fed from outside: ``receive`` appends a value; ``read`` yields them, then the end at 'eof'."""

    def __init__(self, log: list, split: SourceSplit, offset: int) -> None:
        self.log, self.split, self.emitted = log, split, offset
        self.values: list = []

    def bind(self, address: SplitAddress) -> None:
        self.log.append(("bind", address))

    def receive(self, message):
        self.values.append(message)
        return len(self.values)

    def read(self):
        if not self.values:
            return pa.RecordBatch.from_pylist([], schema=SCHEMA)
        value = self.values.pop(0)
        if value == "eof":
            return None
        self.emitted += 1
        return pa.RecordBatch.from_pylist([{"x": value}], schema=SCHEMA)

    def offset(self) -> int:
        return self.emitted


class _FedSource(Source):
    def __init__(self, splits: int, ahead: int) -> None:
        self.n, self.ahead, self.log = splits, ahead, []

    def schema(self):
        return SCHEMA

    def splits(self):
        return [SourceSplit(f"fed-{i}", i) for i in range(self.n)]

    def open_split(self, split, offset=None):
        self.log.append(("open", split.split_id, offset))
        return _Fed(self.log, split, offset or 0)

    def read_ahead(self) -> int:
        return self.ahead


SCHEMA = pa.schema([("x", pa.int64())])


def test_readers_open_ahead_are_bound_and_take_messages_before_their_turn():
    source = _FedSource(splits=4, ahead=2)
    logic = SourceLogic(source, source.splits(), {"fed-1": 3})
    logic.open(InstanceInfo("src", 1, 2))
    assert logic.ready_at() is None
    opened = [entry[1:] for entry in source.log if entry[0] == "open"]
    assert opened == [("fed-0", None), ("fed-1", 3), ("fed-2", None)]  # the current split and two ahead
    assert [e[1] for e in source.log if e[0] == "bind"] == [SplitAddress("src", 1, f"fed-{i}") for i in range(3)]
    assert logic.receive("fed-2", 20) == 1  # data for a later split waits in its reader
    with pytest.raises(LookupError, match="fed-3"):
        logic.receive("fed-3", 30)  # not open yet
    for split, value in [("fed-0", 1), ("fed-0", "eof"), ("fed-1", 10), ("fed-1", "eof"), ("fed-2", "eof")]:
        logic.receive(split, value)
    got = [logic.poll() for _ in range(3)]
    assert [b.column("x").to_pylist() for b in got] == [[1], [10], [20]]
    assert logic.offsets() == {"fed-0": 1, "fed-1": 4, "fed-2": 1}  # fed-1 resumed at its offset 3
    with pytest.raises(LookupError, match="fed-0"):
        logic.receive("fed-0", 2)  # finished and closed
    logic.receive("fed-3", "eof")
    assert logic.poll() is None and logic.exhausted
