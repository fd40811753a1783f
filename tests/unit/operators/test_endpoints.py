"""SourceLogic: split assignment and offsets, especially after a restore."""

from __future__ import annotations

from operators.endpoints import SourceLogic, assign_splits
from operators.sources import from_items


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
