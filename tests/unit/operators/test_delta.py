"""Unit tests for operators/delta.py: the Delta sink's staged commits against a local table, read back by deltalake."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pandas as pd
import pyarrow as pa
import pytest

from chiray.operators.logic import InstanceInfo
from chiray.operators.staging import OutputInUseError, new_run_id

deltalake = pytest.importorskip("deltalake")

from chiray.operators.delta import FINAL_VERSION, to_delta  # noqa: E402


def batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"i": pa.array(range(start, start + n), pa.int64()),
                            "k": [f"k{j % 3}" for j in range(start, start + n)]})


def oracle(*ranges: tuple[int, int]) -> pd.DataFrame:
    """The rows of ``batch(start, n)`` for each range, computed by pandas, sorted by ``i``."""
    frames = [pd.DataFrame({"i": range(s, s + n), "k": [f"k{j % 3}" for j in range(s, s + n)]}) for s, n in ranges]
    return pd.concat(frames, ignore_index=True).astype({"i": "int64"}).sort_values("i", ignore_index=True)


def table_rows(uri: str, columns=("i", "k")) -> pd.DataFrame:
    got = deltalake.DeltaTable(uri).to_pyarrow_table().to_pandas()
    return got[list(columns)].sort_values("i", ignore_index=True)


def bound(uri: str, run: str | None = None, **options):
    """A sink as the runtime binds it (name ``out``, a run) and as the hosts get it (pickled)."""
    sink = to_delta(uri, **options).bind_schema(batch(0, 1).schema).bind_output("/unused", "out", run or new_run_id())
    return cloudpickle.loads(cloudpickle.dumps(sink))


def writer(sink, index=0, parallelism=2):
    return cloudpickle.loads(cloudpickle.dumps(sink)).create_writer(InstanceInfo("out", index, parallelism))


def versions_by_checkpoint(uri: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for h in deltalake.DeltaTable(uri).history():
        if "chiray.checkpoint" in h and "chiray.take_back" not in h:
            out.setdefault(h["chiray.checkpoint"], []).append(h["version"])
    return out


def test_each_checkpoint_is_one_version_and_a_repeated_commit_adds_nothing(tmp_path):
    uri = str(tmp_path / "t")
    sink = bound(uri, max_rows_per_file=7)
    w0, w1 = writer(sink, 0), writer(sink, 1)
    w0.write(batch(0, 10))
    w1.write(batch(100, 5))
    staged1 = [w0.prepare_commit(1), w1.prepare_commit(1)]
    assert sink.commit(staged1) == [0]
    pd.testing.assert_frame_equal(table_rows(uri), oracle((0, 10), (100, 5)))
    assert sink.commit(staged1) == [] and deltalake.DeltaTable(uri).version() == 0  # replayed: nothing

    w0.write(batch(10, 4))
    staged2 = [w0.prepare_commit(2), w1.prepare_commit(2)]  # w1 wrote nothing: stages nothing
    assert staged2[1] is None
    w1.write(batch(105, 3))
    results = [w0.finish(), w1.finish()]
    assert sink.commit(staged2) == [1]
    assert sink.commit_final(results) == [2]
    assert sink.commit_final(results) == [] and sink.commit(staged2) == []
    pd.testing.assert_frame_equal(table_rows(uri), oracle((0, 14), (100, 8)))
    assert versions_by_checkpoint(uri) == {"1": [0], "2": [1], "final": [2]}
    table = deltalake.DeltaTable(uri)
    assert table.transaction_version(sink.app_id()) == FINAL_VERSION
    assert sink.combine(results) == [0, 1, 2]
    assert not [n for n in os.listdir(uri) if n.startswith(".") and not n.startswith(".live-")]


def test_a_writer_being_killed_and_its_replacement_never_write_one_file(tmp_path):
    """As for Parquet: a sink instance on a host being killed may still write while its replacement (same
    run and index) starts; each writes in-progress files of its own, so the replacement's rows commit whole."""
    uri = str(tmp_path / "t")
    sink = bound(uri, max_rows_per_file=100)
    old, new = writer(sink, 0), writer(sink, 0)
    old.write(batch(0, 50))
    new.write(batch(100, 30))  # the replacement starts while the old writer's file is open
    old.write(batch(50, 50))
    new.write(batch(130, 40))
    assert len([n for n in os.listdir(uri) if n.endswith(".inprogress")]) == 2
    old.abort()  # (the old writer's process ends; its files are never staged)
    assert sink.commit([new.prepare_commit(1)]) == [0]
    pd.testing.assert_frame_equal(table_rows(uri), oracle((100, 70)))


def test_a_checkpoint_commits_the_epochs_of_a_failed_one_before_it_once(tmp_path):
    uri = str(tmp_path / "t")
    sink = bound(uri)
    w = writer(sink)
    w.write(batch(0, 3))
    s1 = w.prepare_commit(1)  # checkpoint 1 failed after the barrier: never committed alone
    w.write(batch(3, 2))
    s2 = w.prepare_commit(2)
    assert sink.commit([s1, s2]) == [0]
    assert sink.commit([s1]) == [] and sink.commit([s2]) == []
    pd.testing.assert_frame_equal(table_rows(uri), oracle((0, 5)))
    (info,) = [h for h in deltalake.DeltaTable(uri).history() if h.get("chiray.checkpoint") == "2"]
    assert info["chiray.epochs"] == "1,2" and info["chiray.run"] == sink.run and info["chiray.sink"] == "out"


def test_recover_finishes_the_checkpoint_and_discards_only_this_runs_other_files(tmp_path):
    uri = str(tmp_path / "t")
    run = new_run_id()
    sink = bound(uri, run)
    w = writer(sink)
    w.write(batch(0, 4))
    s1 = w.prepare_commit(1)  # durable, but the commit never ran (the controller died)
    w.write(batch(4, 4))
    w.prepare_commit(2)  # staged after the checkpoint the recovery restores
    w.write(batch(8, 1))  # in progress
    other = bound(uri)  # another run's staged file, beside ours
    wo = writer(other)
    wo.write(batch(50, 2))
    wo.prepare_commit(1)
    before = set(os.listdir(uri))
    fresh = bound(uri, run)  # the recovery's copy of the sink
    fresh.recover([s1])
    pd.testing.assert_frame_equal(table_rows(uri), oracle((0, 4)))
    left = {n for n in os.listdir(uri) if n.startswith(".")}
    assert left == {n for n in before if n.startswith(f".out-{other.run}")}
    fresh.recover([s1])  # a recovery of the recovery: still once
    pd.testing.assert_frame_equal(table_rows(uri), oracle((0, 4)))


def test_take_back_removes_the_later_checkpoints_and_the_replay_adds_them_once(tmp_path):
    uri = str(tmp_path / "t")
    sink = bound(uri, partition_by="k")
    w = writer(sink)
    for epoch in (1, 2, 3):
        w.write(batch(epoch * 10, 5))
        sink.commit([w.prepare_commit(epoch)])
    pd.testing.assert_frame_equal(table_rows(uri), oracle((10, 5), (20, 5), (30, 5)))
    sink.take_back(1)  # checkpoints 2 and 3 are unreadable: the job falls back to 1
    pd.testing.assert_frame_equal(table_rows(uri), oracle((10, 5)))
    assert deltalake.DeltaTable(uri).transaction_version(sink.app_id()) == 1
    sink.take_back(1)  # again: nothing more goes
    replay = writer(sink)
    replay.write(batch(20, 5))
    replay.write(batch(30, 5))
    sink.commit([replay.prepare_commit(4)])
    pd.testing.assert_frame_equal(table_rows(uri), oracle((10, 5), (20, 5), (30, 5)))


def test_partitions_are_in_the_log_and_not_in_the_files(tmp_path):
    uri = str(tmp_path / "t")
    rows = pa.record_batch({"day": pa.array([1, 2, None, 1, 2], pa.int32()), "flag": [True, False, True, True, None],
                            "v": [1.5, 2.5, 3.5, 4.5, 5.5], "s": pa.array(list("abcde"), pa.large_string())})
    sink = to_delta(uri, partition_by=["day", "flag"]).bind_schema(rows.schema).bind_output("/x", "out", new_run_id())
    w = writer(sink)
    w.write(rows)
    sink.commit_final([w.finish()])
    table = deltalake.DeltaTable(uri)
    assert table.metadata().partition_columns == ["day", "flag"]
    got = table.to_pyarrow_table().to_pandas().sort_values("v", ignore_index=True)
    want = rows.to_pandas()
    pd.testing.assert_frame_equal(got[list(want.columns)], want, check_dtype=False)
    adds = pa.table(table.get_add_actions(flatten=False)).to_pylist()
    assert {(a["partition"]["day"], a["partition"]["flag"]) for a in adds} == {
        (1, True), (2, False), (None, True), (2, None)}
    assert len(adds) == 4
    for add in adds:
        assert set(pa.parquet.read_schema(os.path.join(uri, add["path"])).names) == {"v", "s"}


def test_types_become_deltas_and_a_file_uri_works(tmp_path):
    rows = pa.record_batch({"ts": pa.array([1_000_000_123, 2_000_000_456], pa.timestamp("ns")),
                            "u": pa.array([1, 2], pa.uint32()), "s": pa.array(["x", "y"], pa.large_string())})
    uri = (tmp_path / "t").as_uri()
    sink = to_delta(uri).bind_schema(rows.schema).bind_output("/x", "out", new_run_id())
    w = writer(sink)
    w.write(rows)
    sink.commit_final([w.finish()])
    got = deltalake.DeltaTable(uri).to_pyarrow_table()
    assert got.column("ts").to_pylist() == pa.array([1_000_000, 2_000_000], pa.timestamp("us")).to_pylist()
    assert got.column("u").to_pylist() == [1, 2] and got.column("s").to_pylist() == ["x", "y"]
    too_big = pa.record_batch({"ts": pa.array([0], pa.timestamp("ns")), "u": pa.array([2**32 - 1], pa.uint32()),
                               "s": pa.array(["z"], pa.large_string())})
    with pytest.raises(ValueError, match=r"delta sink out\[0\]: column 'u' of type uint32 does not fit the table's "
                                         r"type int32"):
        writer(sink).write(too_big)


def test_overwrite_replaces_the_table_at_the_runs_first_commit_only(tmp_path):
    uri = str(tmp_path / "t")
    deltalake.write_deltalake(uri, pa.table(batch(900, 3)))
    sink = bound(uri, mode="overwrite")
    w = writer(sink)
    w.write(batch(0, 2))
    s1 = w.prepare_commit(1)
    sink.commit([s1])
    w.write(batch(2, 2))
    sink.commit([w.prepare_commit(2)])
    sink.commit([s1])
    pd.testing.assert_frame_equal(table_rows(uri), oracle((0, 4)))


def test_claim_checks_the_table_and_refuses_a_second_run(tmp_path):
    uri = str(tmp_path / "t")
    deltalake.write_deltalake(uri, pa.table({"i": pa.array([1], pa.int32()), "k": ["a"]}))
    with pytest.raises(ValueError, match=r"to_delta\(.*\): the table's columns differ from the stream's at \['i'\]"):
        bound(uri).claim("job")
    deltalake.write_deltalake(uri, pa.table(batch(0, 1)), mode="overwrite", schema_mode="overwrite")
    with pytest.raises(ValueError, match=r"the table is partitioned by \[\], the sink by \['k'\]"):
        bound(uri, partition_by="k").claim("job")
    first = bound(uri)
    first.claim("job-a")
    with pytest.raises(OutputInUseError, match="job-a"):
        bound(uri).claim("job-b")
    first.release()
    bound(uri).claim("job-b")


def test_bad_arguments_and_columns_are_refused_early(tmp_path):
    uri = str(tmp_path / "t")
    with pytest.raises(ValueError, match="to_delta: mode must be one of"):
        to_delta(uri, mode="error")
    with pytest.raises(ValueError, match="to_delta: partition_by must be distinct column names"):
        to_delta(uri, partition_by=["k", "k"])
    with pytest.raises(ValueError, match="to_delta: max_rows_per_file"):
        to_delta(uri, max_rows_per_file=0)
    with pytest.raises(ValueError, match="to_delta: 'nosuchscheme://t' is not a URI pyarrow.fs understands"):
        to_delta("nosuchscheme://t")
    schema = batch(0, 1).schema
    with pytest.raises(ValueError, match="partition column 'day' is not in the stream"):
        to_delta(uri, partition_by="day").bind_schema(schema)
    with pytest.raises(TypeError, match="partition column 'v' has type double"):
        to_delta(uri, partition_by="v").bind_schema(pa.schema([("v", pa.float64()), ("i", pa.int64())]))
    with pytest.raises(TypeError, match="column 't' has type time64"):
        to_delta(uri).bind_schema(pa.schema([("t", pa.time64("us"))]))


def test_without_deltalake_the_sink_names_the_extra(monkeypatch):
    # that ``import chiray`` does not import deltalake: tests/unit/test_packaging.py
    monkeypatch.setitem(sys.modules, "deltalake", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"to_delta needs the deltalake package: pip install 'chiray\[delta\]'"):
        to_delta("/tmp/t")
