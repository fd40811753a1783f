"""Rolling a streaming query's offset and commit logs back to the epoch a restored dataflow needs (no Spark)."""

from __future__ import annotations

import pathlib

import pytest

from chiray.spark_bridge.querylog import QueryLogError, rollback


def logs(root: pathlib.Path, offsets: range, commits: range, crc: bool = True) -> None:
    for name, batches in (("offsets", offsets), ("commits", commits)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for b in batches:
            (root / name / str(b)).write_text(f"{name} {b}")
            if crc:
                (root / name / f".{b}.crc").write_text("crc")
    (root / "metadata").write_text("{}")


def listing(root: pathlib.Path, name: str) -> list[str]:
    return sorted((p.name for p in (root / name).iterdir()), key=lambda n: (n.startswith("."), n))


def test_rollback_keeps_the_range_of_the_needed_epoch_and_drops_what_came_after(tmp_path):
    logs(tmp_path, range(0, 8), range(0, 7))  # batch 7 was planned, not committed
    done = rollback(str(tmp_path), 4)
    assert done.deleted == (5, 6, 7) and done.uncommitted == (4, 5, 6)
    assert listing(tmp_path, "offsets") == ["0", "1", "2", "3", "4", ".0.crc", ".1.crc", ".2.crc", ".3.crc", ".4.crc"]
    assert listing(tmp_path, "commits") == ["0", "1", "2", "3", ".0.crc", ".1.crc", ".2.crc", ".3.crc"]
    assert (tmp_path / "metadata").exists()


def test_nothing_changes_when_the_query_never_planned_the_needed_epoch(tmp_path):
    logs(tmp_path, range(0, 3), range(0, 2))
    assert rollback(str(tmp_path), 3).deleted == ()
    assert rollback(str(tmp_path / "fresh"), 0).deleted == ()  # a query that never ran
    assert listing(tmp_path, "offsets") == ["0", "1", "2", ".0.crc", ".1.crc", ".2.crc"]


def test_rollback_to_the_start_re_runs_batch_zero(tmp_path):
    logs(tmp_path, range(0, 3), range(0, 3), crc=False)
    done = rollback(str(tmp_path), 0)
    assert (done.deleted, done.uncommitted) == ((1, 2), (0, 1, 2))
    assert listing(tmp_path, "offsets") == ["0"] and listing(tmp_path, "commits") == []


def test_purged_logs_are_a_clear_error(tmp_path):
    logs(tmp_path, range(5, 9), range(5, 9))  # Spark purged batches before 5
    with pytest.raises(QueryLogError, match="needs micro-batch 5.*keeps batches 5..8"):
        rollback(str(tmp_path), 5)  # its start (batch 4's end offsets) is gone
    with pytest.raises(ValueError, match="next_epoch must be >= 0"):
        rollback(str(tmp_path), -1)
