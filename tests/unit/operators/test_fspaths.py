"""Unit tests for operators/fspaths.py: locations as paths or URIs, and the Parquet source and sink taking URIs."""

from __future__ import annotations

import cloudpickle
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from chiray.operators.fspaths import list_files, resolve, resolve_all
from chiray.operators.logic import InstanceInfo
from chiray.operators.sinks import to_parquet
from chiray.operators.sources import from_parquet
from tests.oracles import source_batches


def test_resolve_paths_and_uris(tmp_path):
    assert resolve("f", str(tmp_path), None) == (None, str(tmp_path))
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert resolve("f", "a/b", sub) == (sub, "a/b")
    fs, path = resolve("f", tmp_path.as_uri(), None)
    assert isinstance(fs, pafs.LocalFileSystem) and path == str(tmp_path)
    fs, path = resolve("f", "mock:///bucket/key", None)
    assert fs.type_name == "mock" and path == "bucket/key"
    with pytest.raises(ValueError, match="f: 'file:///x' is a URI, which names its own filesystem, and filesystem="):
        resolve("f", "file:///x", sub)
    with pytest.raises(TypeError, match="f: expected a path or a URI, got int"):
        resolve("f", 3, None)


def test_resolve_all_wants_one_filesystem(tmp_path):
    fs, paths = resolve_all("f", [str(tmp_path / "a"), (tmp_path / "b").as_uri()], None)
    assert isinstance(fs, pafs.LocalFileSystem) and paths == [str(tmp_path / "a"), str(tmp_path / "b")]
    with pytest.raises(ValueError, match="f: 'mock:///b' is on another filesystem \\(mock\\)"):
        resolve_all("f", [str(tmp_path), "mock:///b"], None)


def test_list_files_skips_hidden_and_underscore_files(tmp_path):
    for name in ["b.csv", "a.csv", "sub/c.csv", "_SUCCESS", "_x.csv", ".y.csv", "notes.txt"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    got = list_files("f", pafs.LocalFileSystem(), [str(tmp_path)], (".csv",))
    assert got == [str(tmp_path / n) for n in ("a.csv", "b.csv", "sub/c.csv")]
    with pytest.raises(ValueError, match=r"f: directory .* contains no \*.json, \*.jsonl files"):
        list_files("f", pafs.LocalFileSystem(), [str(tmp_path)], (".json", ".jsonl"))


def test_parquet_source_and_sink_take_file_uris_and_a_subtree_filesystem(tmp_path):
    table = pa.table({"k": [f"k{i % 5}" for i in range(50)], "v": list(range(50))})
    out_uri = (tmp_path / "out").as_uri()
    sink = cloudpickle.loads(cloudpickle.dumps(to_parquet(out_uri, max_rows_per_file=20)))
    writer = sink.create_writer(InstanceInfo("out", 0, 1))
    writer.write(table.to_batches()[0])
    files = sink.commit([writer.prepare_commit(1)])
    assert len(files) == 3 and all(f.startswith(str(tmp_path / "out")) for f in files)

    expected = table.to_pandas()
    got = pa.Table.from_batches(source_batches(from_parquet(out_uri))).to_pandas()
    pd.testing.assert_frame_equal(got.sort_values("v", ignore_index=True), expected)
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    got = pa.Table.from_batches(source_batches(from_parquet("out", filesystem=sub))).to_pandas()
    pd.testing.assert_frame_equal(got.sort_values("v", ignore_index=True), expected)

    sink = to_parquet("copy", filesystem=sub)
    writer = sink.create_writer(InstanceInfo("out", 0, 1))
    writer.write(table.to_batches()[0])
    (file,) = sink.commit([writer.finish()])
    assert pq.read_table(tmp_path / "copy" / file.rsplit("/", 1)[1]).equals(table)
    with pytest.raises(ValueError, match="to_parquet: .* is a URI"):
        to_parquet(out_uri, filesystem=sub)
    with pytest.raises(ValueError, match="from_parquet: .* is a URI"):
        from_parquet(out_uri, filesystem=sub)
