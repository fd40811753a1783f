"""A job's savepoints without Ray: where they go (a URI keeps its query), which there are (checked against the
directories on disk), and deleting one (refused for another job's, and while a running job was restored from it)."""

from __future__ import annotations

import json
import os

import pytest

from chiray.actors.jobs.jobfiles import copy_savepoint
from chiray.actors.jobs.jobvalues import CheckpointInfo
from chiray.actors.jobs.savepoints import (SavepointError, delete_savepoint, find_savepoints, life_dir,
                                      savepoint_root)
from chiray.actors.runtime.storage import CheckpointStorage, child_uri


def checkpoint(root: str, checkpoint_id: int, job: str, payload: bytes = b"state") -> str:
    """A complete checkpoint of ``job`` (one state file) under ``root``; its directory."""
    storage = CheckpointStorage(root)
    rel = storage.write_state(checkpoint_id, "count", 0, {1: payload})
    storage.commit(checkpoint_id, {"job": {"name": job}, "created": 1000.0 + checkpoint_id,
                                   "state_files": {"count/0": rel}})
    return storage.chk_dir(checkpoint_id)


def on_disk(root) -> dict[str, tuple[str, int]]:
    """Oracle: every chk-N directory under ``root`` -> (the job its manifest names, the bytes of its files)."""
    out = {}
    for path, _, files in os.walk(root):
        if "_MANIFEST.json" in files:
            with open(os.path.join(path, "_MANIFEST.json")) as f:
                job = json.load(f)["job"]["name"]
            out[path] = (job, sum(os.path.getsize(os.path.join(path, n)) for n in files))
    return out


def test_a_savepoint_of_a_uri_with_a_query_goes_under_its_path_and_keeps_the_query(tmp_path):
    root = f"file://{tmp_path}/chk?foo=bar"  # LocalFileSystem takes (and ignores) the query, as S3 takes options
    storage = CheckpointStorage(root)
    checkpoint(root, 1, "wc")
    assert savepoint_root(root) == f"file://{tmp_path}/chk/savepoints?foo=bar"
    life = life_dir(savepoint_root(root), "wc", "r0123abcd")
    taken = copy_savepoint(storage, CheckpointInfo(1, storage.chk_dir(1)), life)
    copied = tmp_path / "chk" / "savepoints" / "wc-r0123abcd" / "chk-000001"
    assert (copied / "_MANIFEST.json").is_file() and (copied / "state-count-0.arrow").is_file()
    assert taken.path == f"file://{copied}?foo=bar" and taken.root == life
    assert sorted(os.listdir(tmp_path / "chk")) == ["chk-000001", "savepoints"]  # nothing beside them
    assert savepoint_root(root, "s3://b/sp?scheme=http") == "s3://b/sp?scheme=http"
    assert child_uri("s3://b/chk?endpoint_override=127.0.0.1:9000&scheme=http", "savepoints") == (
        "s3://b/chk/savepoints?endpoint_override=127.0.0.1:9000&scheme=http")


def test_a_jobs_savepoints_are_those_on_disk_in_its_lives_and_where_it_took_them(tmp_path):
    sp = str(tmp_path / "sp")
    checkpoint(f"{sp}/wc-r00000001", 1, "wc")
    checkpoint(f"{sp}/wc-r00000001", 2, "wc", b"x" * 5000)
    checkpoint(f"{sp}/wc-r00000002", 3, "wc")
    checkpoint(f"{sp}/wc2-r00000003", 1, "wc2")  # another job whose name starts alike
    checkpoint(f"{sp}/wc-r00000004", 5, "other")  # a life directory named like wc's, holding another job's
    os.makedirs(f"{sp}/wc-r00000001/chk-000009")  # incomplete: no manifest
    elsewhere = checkpoint(str(tmp_path / "mine" / "wc-r00000002"), 4, "wc")
    gone = str(tmp_path / "deleted" / "wc-r00000002" / "chk-000006")
    found = find_savepoints("wc", [sp, str(tmp_path / "missing")], [elsewhere, gone, elsewhere + "/"])
    expected = {path: size for path, (job, size) in on_disk(tmp_path).items() if job == "wc"}
    assert {s.path: s.size_bytes for s in found} == expected
    assert [(s.checkpoint_id, s.run) for s in found] == [(1, "r00000001"), (2, "r00000001"), (3, "r00000002"),
                                                         (4, "r00000002")]  # oldest first
    assert [s.created_at for s in found] == [1001.0, 1002.0, 1003.0, 1004.0]
    assert found[0].to_json()["path"] == found[0].path


def test_deleting_a_savepoint_refuses_another_jobs_and_one_a_running_job_was_restored_from(tmp_path):
    sp = str(tmp_path / "sp")
    first = checkpoint(f"{sp}/wc-r00000001", 1, "wc")
    second = checkpoint(f"{sp}/wc-r00000001", 2, "wc")
    alone = checkpoint(f"{sp}/wc-r00000002", 3, "wc")
    own = checkpoint(str(tmp_path / "chk"), 7, "wc")  # a checkpoint of the job, not a savepoint
    listed = find_savepoints("wc", [sp])
    with pytest.raises(SavepointError, match=rf"'{own}' is not a savepoint of job 'wc' \(its savepoints: "):
        delete_savepoint("wc", own, listed, {})
    with pytest.raises(SavepointError, match="in use: the running job 'wc-2' was restored from"):
        delete_savepoint("wc", first, listed, {"wc-2": sp})  # a directory that holds it
    with pytest.raises(SavepointError, match="in use: the running job 'wc' was restored from"):
        delete_savepoint("wc", second + "/", listed, {"wc": second})
    assert delete_savepoint("wc", first, listed, {"wc-2": f"{sp}/wc-r00000002"}).checkpoint_id == 1
    deleted = delete_savepoint("wc", alone, listed, {})
    assert deleted.path == alone and deleted.run == "r00000002"
    assert sorted(on_disk(tmp_path)) == sorted([second, own])  # the directories left on disk
    assert sorted(os.listdir(sp)) == ["wc-r00000001"]  # the emptied life's directory went too
    assert [s.path for s in find_savepoints("wc", [sp])] == [second]
