"""Every storage path of a job on an S3-compatible server (moto's, the session's ``s3_server``), without Ray:
checkpoints (incremental chains, retention deleting on S3, incomplete and torn ones), savepoints (copy, list,
restore, delete), the file sources and ``to_parquet`` given ``s3://`` URIs, and sink output staged under the
checkpoint root (what a job manager commits when a job stops). Oracles: the server's own listing (a pyarrow
S3 filesystem), pandas, and the plain-dict state oracle of ``test_incremental_checkpoints``."""

from __future__ import annotations

import json
import logging
import uuid

import cloudpickle
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from chiray.actors.jobs.harness import LocalRun
from chiray.actors.jobs.jobfiles import commit_stopped, copy_savepoint
from chiray.actors.jobs.jobvalues import CheckpointInfo
from chiray.actors.jobs.savepoints import delete_savepoint, find_savepoints, life_dir, savepoint_root
from chiray.actors.runtime.storage import MANIFEST, RETIRED, CheckpointError, CheckpointStorage, child_uri
from chiray.actors.jobs.submit import restore_point
from chiray.control.ops.chains import manifest_chains
from chiray.actors.config import JobConfig
from chiray.operators import Dataflow, collect, from_csv, from_items, from_json, from_parquet, to_parquet
from chiray.operators.graph import physical_plan
from chiray.operators.logic import InstanceInfo
from chiray.operators.staging import new_run_id
from tests.unit.actors.test_incremental_checkpoints import Run
from tests.unit.actors.test_savepoint_dirs import plan, save

BUCKET = "unit-storage"


@pytest.fixture
def s3(s3_server):
    """The server, with a fresh prefix of the test bucket: (server, root URI, root path in the filesystem)."""
    s3_server.make_bucket(BUCKET)
    prefix = uuid.uuid4().hex[:10]
    return s3_server, s3_server.uri(BUCKET, prefix), f"{BUCKET}/{prefix}"


def files(fs: pafs.FileSystem, root: str) -> dict[str, int]:
    """Oracle: every file under ``root`` on the server (relative path -> size)."""
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {i.path[len(root) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}


def test_incremental_checkpoints_restore_their_cut_and_retention_deletes_on_s3(s3):
    server, root, path = s3
    run = Run("aggregate", child_uri(root, "chk"), seed=7, parallelism=2)  # keeps 3 checkpoints
    for i in range(5):
        run.feed(40)
        if i == 1:
            run.move([0, 1, 2], 1)
        assert run.finish(*run.cut(full=i == 2))
    kept = run.storage.committed()
    assert kept == [3, 4, 5]
    chains = manifest_chains(run.storage.load(5))
    assert any(len(chain) > 1 for bins in chains.values() for chain in bins.values()), "no incremental chain"
    for checkpoint_id, parallelism in ((3, 1), (4, 1), (5, 1), (5, 3)):
        assert run.restore(checkpoint_id, parallelism) == run.at_cut[checkpoint_id]
    on_s3 = files(server.filesystem(), f"{path}/chk")
    needed = set().union(*(run.storage.files_of(run.storage.load(i)) for i in kept))
    assert needed <= set(on_s3)
    older = {f for f in on_s3 if int(f[4:10]) < kept[0]}
    assert older <= needed | {f"chk-{i:06d}/{RETIRED}" for i in range(1, kept[0])}, "retention left files"
    assert not any(f.startswith(("chk-000001/", "chk-000002/")) and f.endswith(MANIFEST) for f in on_s3)


def test_incomplete_and_torn_checkpoints_on_s3_are_skipped_or_refused(s3, caplog):
    server, root, path = s3
    storage = CheckpointStorage(child_uri(root, "chk"))
    rel = storage.write_state(1, "count", 0, {1: b"a", 2: b"b" * 100})
    storage.commit(1, {"state_files": {"count/0": rel}})
    storage.write_state(2, "count", 0, {1: b"c"})  # crashed before its manifest
    storage.commit(3, {"state_files": {"count/0": "chk-000003/state-count-0.arrow"}})  # its file missing
    with caplog.at_level(logging.WARNING, logger="chiray.actors.runtime.storage"):
        assert CheckpointStorage(child_uri(root, "chk"), create=False).committed() == [1]
    assert "checkpoint 2" in caplog.text and "checkpoint 3" in caplog.text
    assert ":testing@" not in caplog.text and ":***@" in caplog.text  # the secret key never reaches a log
    assert storage.read_state(rel) == {1: b"a", 2: b"b" * 100}
    assert not [f for f in files(server.filesystem(), path) if ".tmp-" in f]
    with server.filesystem().open_output_stream(f"{path}/chk/{rel}") as out:
        out.write(b"torn")
    with pytest.raises(CheckpointError, match=r"checkpoint 1 .* is corrupt: its state file .* is unreadable"):
        storage.verify(storage.load(1))
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        CheckpointStorage(child_uri(root, "nowhere"), create=False)


def test_savepoints_on_s3_are_copied_listed_restored_and_deleted(s3):
    server, root, path = s3
    chk = child_uri(root, "chk")
    save(chk, 1, "f")
    save(chk, 2, "f")
    storage = CheckpointStorage(chk)
    life = life_dir(savepoint_root(chk), "f", "r0123abcd")
    taken = [copy_savepoint(storage, CheckpointInfo(i, storage.chk_dir(i)), life) for i in (1, 2)]
    assert taken[1].path == child_uri(chk, "savepoints", "f-r0123abcd", "chk-000002")
    found = find_savepoints("f", [savepoint_root(chk)])
    on_s3 = files(server.filesystem(), f"{path}/chk/savepoints/f-r0123abcd")
    assert [(s.path, s.size_bytes) for s in found] == [
        (t.path, sum(n for f, n in on_s3.items() if f.startswith(f"chk-{t.id:06d}/"))) for t in taken]
    assert restore_point(savepoint_root(chk), plan()).checkpoint_id == 2  # one life: its newest
    assert restore_point(taken[0].path, plan()).checkpoint_id == 1
    delete_savepoint("f", taken[0].path, found, {})
    left = files(server.filesystem(), f"{path}/chk/savepoints/f-r0123abcd")
    assert sorted({f.split("/")[0] for f in left}) == ["chk-000002"]


def test_file_sources_and_to_parquet_take_s3_uris(s3):
    server, root, path = s3
    fs = server.filesystem()
    table = pa.table({"k": [f"k{i % 7}" for i in range(300)], "v": list(range(300))})
    pq.write_table(table.slice(0, 120), f"{path}/in/a.parquet", filesystem=fs, row_group_size=50)
    pq.write_table(table.slice(120), f"{path}/in/b.parquet", filesystem=fs, row_group_size=50)
    with fs.open_output_stream(f"{path}/csv/a.csv") as out:
        pcsv.write_csv(table, out)
    with fs.open_output_stream(f"{path}/json/a.jsonl") as out:
        out.write("".join(json.dumps(r) + "\n" for r in table.to_pylist()).encode())
    expected = table.to_pandas().groupby("k", as_index=False)["v"].sum().rename(columns={"v": "sum"})
    sources = {"parquet": from_parquet(child_uri(root, "in")), "csv": from_csv(child_uri(root, "csv")),
               "json": from_json(child_uri(root, "json"))}
    for name, source in sources.items():
        flow = Dataflow(f"s3-{name}")
        flow.source(source, name="src").key_by("k").sum("v").sink(to_parquet(child_uri(root, f"out-{name}")),
                                                                  name="out")
        written = LocalRun(flow, JobConfig(num_hosts=2)).run()["out"]
        assert written and all(p.startswith(f"{path}/out-{name}/part-out-") for p in written)
        got = pq.read_table(written, filesystem=fs).to_pandas().sort_values("k", ignore_index=True)
        pd.testing.assert_frame_equal(got, expected, check_dtype=False, obj=name)


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"i": list(range(start, start + n))})


def test_sink_output_staged_on_s3_commits_with_its_checkpoint_and_a_stop_discards_the_rest(s3):
    """Both sinks stage epochs on S3: ``to_parquet`` in its own directory, ``collect`` under the checkpoint
    root; a stop at checkpoint 1 (what a job manager runs) commits epoch 1 and discards epoch 2."""
    server, root, path = s3
    fs, run = server.filesystem(), new_run_id()
    flow = Dataflow("staged")
    items = flow.source(from_items([{"i": 0}]), name="src")
    items.sink(collect(), name="got")
    items.sink(to_parquet(child_uri(root, "pq")), name="pq")
    graph = physical_plan(flow.graph).graph
    storage = CheckpointStorage(child_uri(root, "chk"))
    staged: dict[str, list] = {}
    for name in ("got", "pq"):
        sink = graph.nodes[name].sink.bind_output(storage.output_dir(name), name, run)
        writer = cloudpickle.loads(cloudpickle.dumps(sink)).create_writer(InstanceInfo(name, 0, 1))
        writer.write(batch(0, 3))
        staged[name] = [writer.prepare_commit(1)]
        writer.write(batch(3, 2))
        writer.prepare_commit(2)  # checkpoint 2 never completes
    staged_got = [f for f in files(fs, f"{path}/chk/output/got") if f.startswith(".")]
    assert staged_got, "collect staged nothing on S3"
    storage.commit(1, {"job": {"name": "staged"}, "sink_staged": {f"{n}/0": s for n, s in staged.items()}})
    results = commit_stopped(graph, storage, 1, run)
    assert results["got"].column("i").to_pylist() == [0, 1, 2]
    assert pq.read_table(results["pq"], filesystem=fs).column("i").to_pylist() == [0, 1, 2]
    for where in ("chk/output/got", "pq"):
        names = files(fs, f"{path}/{where}")
        assert not [n for n in names if n.startswith(".") and "staged" in n], f"{where}: epoch 2 left staged"
        assert [n for n in names if n.startswith("part-")], f"{where}: epoch 1 not committed"
