"""Savepoints of several jobs in one directory: each job life has its own subdirectory, and a restore from
the shared directory takes the one life's newest savepoint or refuses, naming them."""

from __future__ import annotations

import pytest

from chiray.actors.runtime.storage import CheckpointError, CheckpointStorage
from chiray.actors.jobs.submit import restore_point
from chiray.operators import Dataflow, collect, from_items
from chiray.operators.graph import physical_plan


def plan():
    flow = Dataflow("f")
    flow.source(from_items([{"k": "a"}]), name="src").sink(collect(), name="out")
    return physical_plan(flow.graph)


def save(root: str, checkpoint_id: int, job: str) -> None:
    CheckpointStorage(root).commit(checkpoint_id, {"job": {"name": job, "operators": {
        "src": {"kind": "source", "uid": "src"}, "out": {"kind": "sink", "uid": "out"}}},
        "state_files": {}, "state_bins": {}, "sources": {}, "sink_staged": {}})


def test_one_life_in_the_directory_restores_its_newest_and_two_are_refused(tmp_path):
    sp = str(tmp_path / "sp")
    save(f"{sp}/a-r00000001", 1, "a")
    save(f"{sp}/a-r00000001", 3, "a")
    assert restore_point(sp, plan()).checkpoint_id == 3
    assert restore_point(f"{sp}/a-r00000001/chk-000001", plan()).checkpoint_id == 1
    save(f"{sp}/b-r00000002", 1, "b")  # another job's savepoint 1: beside a's, never over it
    assert CheckpointStorage(f"{sp}/a-r00000001").load(1)["job"]["name"] == "a"
    with pytest.raises(CheckpointError, match=r"holds the savepoints of 2 jobs \(\['a-r00000001', 'b-r00000002'\]\)"):
        restore_point(sp, plan())
    assert restore_point(f"{sp}/b-r00000002", plan()).manifest["job"]["name"] == "b"
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint under"):
        restore_point(str(tmp_path / "empty"), plan())


def test_a_root_named_like_a_checkpoint_restores_its_newest(tmp_path):
    """A checkpoint root may be called ``chk-0`` (a job manager that restarts restores from its job's root):
    a directory that holds checkpoints is a root, whatever its name; one that holds none and is named
    ``chk-N`` is that checkpoint."""
    root = str(tmp_path / "chk-0")
    save(root, 1, "a")
    save(root, 2, "a")
    assert restore_point(root, plan()).checkpoint_id == 2
    assert restore_point(f"{root}/chk-000001", plan()).checkpoint_id == 1
    with pytest.raises(CheckpointError, match="incomplete or missing"):
        restore_point(f"{root}/chk-000007", plan())


def test_a_uri_with_a_query_string_restores_a_checkpoint_and_a_savepoint_directory(tmp_path):
    """``restore_from`` as a ``pyarrow.fs`` URI whose options follow the path (as an S3 endpoint's do): the
    checkpoint's own directory and the one job life under a savepoint directory are found before the query."""
    sp = tmp_path / "sp"
    save(f"{sp}/a-r00000001", 1, "a")
    save(f"{sp}/a-r00000001", 2, "a")
    query = "?use_mmap=false"
    assert restore_point(f"file://{sp}{query}", plan()).checkpoint_id == 2
    assert restore_point(f"file://{sp}/a-r00000001/chk-000001{query}", plan()).checkpoint_id == 1
    assert restore_point(f"file://{sp}/a-r00000001{query}", plan()).checkpoint_id == 2
