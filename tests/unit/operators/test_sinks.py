"""Unit tests for operators/sinks.py: collect and the staged/committed Parquet sink."""

from __future__ import annotations

import os

import cloudpickle
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from chiray.operators.logic import InstanceInfo
from chiray.operators.sinks import _PART, ParquetSink, collect, to_parquet
from chiray.operators.staging import OutputInUseError, new_run_id


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"i": list(range(start, start + n)), "s": [f"v{j}" for j in range(start, start + n)]})


def writer(sink, index=0, parallelism=2, op="out"):
    sink = cloudpickle.loads(cloudpickle.dumps(sink))  # as in a host actor
    return sink.create_writer(InstanceInfo(op, index, parallelism))


# --------------------------------------------------------------------------- collect


def test_collect_combines_in_instance_order():
    sink = collect()
    w0, w1 = writer(sink, 0), writer(sink, 1)
    w1.write(batch(100, 3))
    w0.write(batch(0, 2))
    w0.write(batch(2, 4))
    results = [w0.finish(), w1.finish()]
    assert all(isinstance(b, pa.RecordBatch) for r in results for b in r["batches"])
    table = sink.combine(results)
    expected = pd.DataFrame({"i": [0, 1, 2, 3, 4, 5, 100, 101, 102]})
    expected["s"] = [f"v{i}" for i in expected["i"]]
    pd.testing.assert_frame_equal(table.to_pandas(), expected)


def test_collect_empty_results():
    assert collect().combine([[], []]).equals(pa.table({}))
    schema = pa.schema([("i", pa.int64())])
    assert collect(schema).combine([[]]).schema == schema
    w = writer(collect())
    w.write(batch(0, 0))
    table = collect().combine([w.finish()])
    assert table.num_rows == 0 and table.schema == batch(0, 0).schema


def test_collect_schema_mismatch():
    w = writer(collect())
    w.write(batch(0, 1))
    with pytest.raises(ValueError, match="expected:\n.*i: int64") as info:
        w.write(pa.record_batch({"i": ["x"]}))
    assert "out[0]" in str(info.value) and "string" in str(info.value)


def test_collect_abort_discards():
    w = writer(collect())
    w.write(batch(0, 3))
    w.abort()
    assert w.finish() == {"batches": [], "staged": []}


def test_durable_collect_commits_epochs_and_the_unconfirmed_rest_at_the_end(tmp_path):
    sink = collect().bind_output(str(tmp_path / "out"), "out")
    w = writer(sink)
    w.write(batch(0, 2))
    sink.commit([w.prepare_commit(1)])  # checkpoint 1 committed
    w.write(batch(2, 3))
    w.prepare_commit(2)  # checkpoint 2's barrier passed, but it never completed
    w.write(batch(5, 1))
    results = [w.finish()]
    sink.commit_final(results)  # every instance finished: all of this run's output is final
    assert sink.combine(results).column("i").to_pylist() == list(range(6))
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith(".")]


# --------------------------------------------------------------------------- to_parquet


def visible_parquet(directory) -> list[str]:
    return sorted(f for f in os.listdir(directory) if not f.startswith("."))


def test_parquet_files_appear_only_after_finish(tmp_path):
    out = tmp_path / "out"
    sink = to_parquet(str(out), max_rows_per_file=5)
    w0, w1 = writer(sink, 0), writer(sink, 1)
    written = {0: [batch(0, 3), batch(3, 4), batch(7, 6)], 1: [batch(100, 2)]}
    for b in written[0]:
        w0.write(b)
    w1.write(written[1][0])
    assert out.is_dir() and visible_parquet(out) == []
    assert any(f.endswith(".inprogress") for f in os.listdir(out))

    staged = [w0.finish(), w1.finish()]
    assert visible_parquet(out) == []  # staged, not yet visible
    sink.commit(staged)
    sink.commit(staged)  # idempotent: a re-created controller may repeat it
    paths = sink.combine([])
    assert paths == sorted(paths) and len(paths) == 4  # 13 rows / 5 per file -> 3 files, + 1
    assert sorted(os.listdir(out)) == [os.path.basename(p) for p in paths]
    assert all(os.path.basename(p).startswith("part-out-") for p in paths)
    for p in paths:
        assert pq.read_metadata(p).num_rows <= 5

    for index, batches in written.items():
        mine = sorted((p for p in paths if f"-{index}-" in os.path.basename(p)),
                      key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
        got = pd.concat([pq.read_table(p).to_pandas() for p in mine], ignore_index=True)
        want = pa.Table.from_batches(batches).to_pandas()
        pd.testing.assert_frame_equal(got, want)


def test_a_writer_being_killed_and_its_replacement_never_write_one_file(tmp_path):
    """A sink instance on a host being killed may still write for a moment while its replacement (same
    operator, run and index) starts: each writes in-progress files of its own, so the replacement's output
    reads back whole (with one name, the replacement truncated the file under the old writer, both wrote
    into it, and a committed file could not be read)."""
    out = tmp_path / "out"
    sink = to_parquet(str(out), max_rows_per_file=100)
    old, new = writer(sink, 0), writer(sink, 0)
    old.write(batch(0, 50))
    new.write(batch(100, 30))  # the replacement starts while the old writer's file is open
    old.write(batch(50, 50))
    new.write(batch(130, 40))
    assert len([f for f in os.listdir(out) if f.endswith(".inprogress")]) == 2
    old.abort()  # (the old writer's process ends; its files are never staged)
    sink.commit([new.finish()])
    got = pa.concat_tables([pq.read_table(p) for p in sink.combine([])]).to_pandas()
    pd.testing.assert_frame_equal(got, pa.Table.from_batches([batch(100, 30), batch(130, 40)]).to_pandas())


def test_parquet_abort_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    w = writer(to_parquet(str(out), max_rows_per_file=2))
    for i in range(3):
        w.write(batch(i * 3, 3))
    assert os.listdir(out)
    w.abort()
    w.abort()  # idempotent
    assert os.listdir(out) == []


def test_parquet_abort_keeps_committed_files(tmp_path):
    sink = to_parquet(str(tmp_path))
    w = writer(sink)
    w.write(batch(0, 3))
    committed = sink.commit([w.prepare_commit(1)])  # checkpoint 1 commits epoch 1
    w.write(batch(3, 3))
    w.abort()
    assert visible_parquet(tmp_path) == [os.path.basename(p) for p in committed]
    assert pq.read_table(committed[0]).to_pandas().equals(batch(0, 3).to_pandas())


def test_parquet_epochs_commit_separately_and_recover_discards_the_rest(tmp_path):
    sink = to_parquet(str(tmp_path)).bind_output("", "out")
    w = writer(sink)
    w.write(batch(0, 3))
    epoch1 = w.prepare_commit(1)
    w.write(batch(3, 2))
    epoch2 = w.prepare_commit(2)  # staged, but checkpoint 2 never commits
    w.write(batch(5, 1))
    assert visible_parquet(tmp_path) == []
    sink.recover([epoch1])  # roll back to checkpoint 1
    files = sink.combine([])
    assert [os.path.basename(p) for p in files] == ["part-out-0-e000001-0.parquet"]
    assert not any(os.path.exists(p) for p in epoch2)
    assert pq.read_table(files[0]).to_pandas().equals(batch(0, 3).to_pandas())


def test_parquet_writes_later_epochs_ahead_and_stages_each_with_its_own_epoch(tmp_path):
    """What came after one or two pending barriers goes to files of its own at once; each prepare_commit
    stages exactly one epoch's rows, and an abort deletes the files of every epoch not staged."""
    sink = to_parquet(str(tmp_path / "out"), max_rows_per_file=4)
    w = writer(sink)
    w.write(batch(0, 3))
    assert w.write_ahead(batch(100, 5), 1) and w.write_ahead(batch(200, 2), 2)
    w.write(batch(3, 3))
    assert w.write_ahead(batch(105, 1), 1)
    epoch1 = w.prepare_commit(1)
    w.write(batch(106, 2))  # epoch 2 is now the one written
    assert w.write_ahead(batch(202, 1), 1)
    epoch2 = w.prepare_commit(2)
    assert w.write_ahead(batch(300, 2), 1)  # epoch 4, ahead of 3
    epoch3 = w.prepare_commit(3)
    assert rows_of(epoch1) == list(range(0, 6))
    assert rows_of(epoch2) == list(range(100, 108))
    assert rows_of(epoch3) == list(range(200, 203))
    assert len(epoch2) == 2  # a new file every 4 rows, ahead as well
    inprogress = [f for f in os.listdir(tmp_path / "out") if f.endswith(".inprogress")]
    assert len(inprogress) == 1  # epoch 4's
    w.abort()
    assert not [f for f in os.listdir(tmp_path / "out") if f.endswith(".inprogress")]
    visible = sink.commit([epoch1, epoch2, epoch3])
    assert rows_of(visible) == list(range(0, 6)) + list(range(100, 108)) + list(range(200, 203))


def test_parquet_schema_mismatch(tmp_path):
    w = writer(to_parquet(str(tmp_path)))
    w.write(batch(0, 1))
    with pytest.raises(ValueError, match="parquet sink out\\[0\\].*schema"):
        w.write(pa.record_batch({"i": [1.5]}))


def test_parquet_empty_writer_commits_nothing(tmp_path):
    sink = to_parquet(str(tmp_path / "x"))
    w = writer(sink)
    w.write(batch(0, 0))
    assert sink.combine([w.finish()]) == []


def test_parquet_with_pyarrow_filesystem(tmp_path):
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    sink = to_parquet("nested/dir", filesystem=fs)
    w = writer(sink)
    w.write(batch(0, 4))
    assert not [f for f in os.listdir(tmp_path / "nested" / "dir") if f.endswith(".parquet")]
    paths = sink.commit([w.finish()])
    assert paths == ["nested/dir/part-out-0-efinal-0.parquet"]
    got = pq.read_table(paths[0], filesystem=fs).to_pandas()
    pd.testing.assert_frame_equal(got, batch(0, 4).to_pandas())


def test_parquet_rejects_bad_max_rows(tmp_path):
    with pytest.raises(ValueError, match="max_rows_per_file"):
        to_parquet(str(tmp_path), max_rows_per_file=0)


# -- runs: one life of a job each; they share directories without touching each other's files ----------------


def rows_of(paths) -> list[int]:
    return sorted(v for p in paths for v in pq.read_table(p).column("i").to_pylist())


@pytest.mark.parametrize("make", [lambda d: to_parquet(d), lambda d: collect()], ids=["parquet", "collect"])
def test_two_runs_in_one_directory_never_replace_or_discard_each_others_files(tmp_path, make):
    """A job stopped at epoch 1 and the job restored from it into the same directory both stage epoch 1
    of sink ``out`` instance 0: the same name without the run (the restored job replaced the first
    one's file). The restored run's recovery discards its own hidden files only."""
    first_run, second_run = new_run_id(), new_run_id()
    first = make(str(tmp_path)).bind_output(str(tmp_path), "out", first_run)
    second = make(str(tmp_path)).bind_output(str(tmp_path), "out", second_run)
    a = writer(first)
    a.write(batch(0, 3))
    first.commit([a.prepare_commit(1)])
    a.write(batch(3, 2))
    a_pending = a.prepare_commit(2)  # staged by the first run, not committed (yet)
    b = writer(second)
    b.write(batch(10, 4))
    second.commit([b.prepare_commit(1)])  # the same operator, instance and epoch as the first run's
    b.write(batch(20, 1))
    b.prepare_commit(2)  # never committed: the second run recovers from epoch 1
    second.recover([])
    assert all(os.path.exists(p) for p in a_pending), "a recovery discarded another run's staged file"
    first.commit([a_pending])
    if isinstance(first, ParquetSink):
        assert rows_of(first.combine([])) == [0, 1, 2, 3, 4]  # each run's result is its own files
        assert rows_of(second.combine([])) == [10, 11, 12, 13]
        names = sorted(os.listdir(tmp_path))
        assert f"part-out-{first_run}-0-e000001-0.parquet" in names
        assert f"part-out-{second_run}-0-e000001-0.parquet" in names
    else:
        assert sorted(first.combine([]).column("i").to_pylist()) == [0, 1, 2, 3, 4]
        assert sorted(second.combine([]).column("i").to_pylist()) == [10, 11, 12, 13]


def test_committed_names_parse_with_and_without_a_run():
    run = new_run_id()
    for op in ("out", "my-op", "r-1"):
        m = _PART.match(f"part-{op}-{run}-3-e000007-0.parquet")
        assert m and (m["op"], m["run"], m["index"], m["epoch"]) == (op, run, "3", "000007")
        m = _PART.match(f"part-{op}-3-efinal-2.arrow")  # written before runs had names
        assert m and (m["op"], m["run"], m["index"], m["epoch"], m["n"]) == (op, None, "3", "final", "2")


def test_a_directory_claimed_by_another_run_is_refused_naming_both_jobs(tmp_path):
    first = to_parquet(str(tmp_path)).bind_output("", "clicks", new_run_id())
    other = to_parquet(str(tmp_path)).bind_output("", "views", new_run_id())
    first.claim("job-a")
    first.claim("job-a")  # a run's own claim (a recovery, a manager restart) is no conflict
    with pytest.raises(OutputInUseError, match=rf"sink 'views' of job 'job-b': directory {tmp_path} holds "
                                               rf"the output of job 'job-a' \(run {first.run}, sink 'clicks'\)"):
        other.claim("job-b")
    first.release()
    other.claim("job-b")  # the first job ended: its directory is free
    other.release()
    other.release()  # idempotent
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".live-")]


def test_run_ids_are_checked():
    with pytest.raises(ValueError, match="run id must be 'r' and 8 hex digits"):
        to_parquet("/x").bind_output("", "out", "run-1")
