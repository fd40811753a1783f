"""Unit tests for operators/textsources.py: CSV and JSON lines against pandas, byte-range splits, resume, errors."""

from __future__ import annotations

import io
import json
import os

import cloudpickle
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from chiray.operators.textsources import from_csv, from_json
from tests.unit.operators.test_sources import read_split

SCHEMA = pa.schema([("name", pa.string()), ("n", pa.int64()), ("x", pa.float64())])


def rows(start: int, count: int) -> list[dict]:
    return [{"name": f"user {i % 13}", "n": i * 7 - 100, "x": i / 4} for i in range(start, start + count)]


def write_csv(path, records: list[dict], columns=("name", "n", "x"), end: str = "\n") -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write(",".join(columns) + end)
        f.writelines(",".join(str(r[c]) for c in columns) + end for r in records)


def write_json(path, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def read_table(source) -> pa.Table:
    """Every split of the (pickled, as in a host) source in order."""
    source = cloudpickle.loads(cloudpickle.dumps(source))
    batches = [b for split in source.splits() for b in read_split(source, split)[0]]
    return pa.Table.from_batches(batches, schema=source.schema())


def read_all(source) -> pd.DataFrame:
    return read_table(source).to_pandas()


def pandas_csv(paths) -> pd.DataFrame:
    """The oracle: pandas reads each file, in the order given."""
    frames = [pd.read_csv(p, dtype={"name": "str", "n": "int64", "x": "float64"}) for p in paths]
    return pd.concat(frames, ignore_index=True)[["name", "n", "x"]]


@pytest.fixture
def csv_dir(tmp_path):
    """Three CSV files (one in a subdirectory), with files a directory read must skip beside them."""
    layout = [("a.csv", rows(0, 120)), ("b.csv", rows(120, 45)), (os.path.join("sub", "c.csv"), rows(165, 80))]
    for name, records in layout:
        write_csv(str(tmp_path / name), records)
    (tmp_path / "README.txt").write_text("not csv")
    (tmp_path / "_SUCCESS.csv").write_text("")
    (tmp_path / ".hidden.csv").write_text("name,n,x\nghost,1,1.0\n")
    return tmp_path, [str(tmp_path / name) for name, _ in layout]


# --------------------------------------------------------------------------- CSV


def test_csv_directory_read_equals_pandas_in_many_splits_and_batches(csv_dir):
    root, paths = csv_dir
    source = from_csv(str(root), block_size=256, split_size=700)
    assert source.schema() == SCHEMA and source.bounded() is True
    splits = source.splits()
    assert {s.payload[0] for s in splits} == set(paths)
    assert len(splits) > len(paths)  # big files are cut into byte ranges
    pd.testing.assert_frame_equal(read_all(source), pandas_csv(paths))


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_csv_every_cut_of_a_file_reads_each_line_once(tmp_path, end):
    path = str(tmp_path / "t.csv")
    write_csv(path, rows(0, 40), end=end)
    with open(path, "ab") as f:  # a last line without a newline
        f.write(b"last,1,2.5")
    want = pd.concat([pandas_csv([path])], ignore_index=True)
    assert want["name"].iloc[-1] == "last"
    size = os.path.getsize(path)
    for split_size in [1, 2, 3, 5, 7, 11, 13, 17, 23, 29, 64, 97, size // 3, size - 1, size, size * 2]:
        got = read_all(from_csv(path, schema=SCHEMA, block_size=64, split_size=split_size))
        pd.testing.assert_frame_equal(got, want, obj=f"split_size={split_size}")


def test_csv_reopened_at_every_offset_reads_the_rest_as_pandas(tmp_path):
    path = str(tmp_path / "t.csv")
    write_csv(path, rows(0, 200))
    want = pandas_csv([path])
    source = from_csv(path, block_size=300, split_size=2_000)
    done = 0
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:
            done += batch.num_rows
            tail, _ = read_split(source, split, offset=reader.offset())  # a restore at this offset
            later = sum(b.num_rows for s in source.splits()[source.splits().index(split) + 1:]
                        for b in read_split(source, s)[0])
            got = pa.Table.from_batches(tail, schema=SCHEMA).to_pandas()
            expected = want.iloc[done:len(want) - later].reset_index(drop=True)
            pd.testing.assert_frame_equal(got, expected)
    assert done == len(want)


def test_csv_schema_picks_columns_from_headers_in_any_order(tmp_path):
    write_csv(str(tmp_path / "a.csv"), rows(0, 10), columns=("n", "name", "x"))
    write_csv(str(tmp_path / "b.csv"), rows(10, 5), columns=("x", "name", "n"))
    schema = pa.schema([("name", pa.string()), ("x", pa.float32())])
    got = read_all(from_csv(str(tmp_path), schema=schema))
    want = pandas_csv([tmp_path / "a.csv", tmp_path / "b.csv"])[["name", "x"]].astype({"x": "float32"})
    pd.testing.assert_frame_equal(got, want)


def test_csv_without_header_and_another_delimiter(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("".join(f"{r['name']};{r['n']};{r['x']}\n" for r in rows(0, 30)))
    got = read_all(from_csv(str(path), schema=SCHEMA, header=False, delimiter=";", split_size=100))
    want = pd.read_csv(path, sep=";", header=None, names=["name", "n", "x"])
    pd.testing.assert_frame_equal(got, want)
    inferred = from_csv(str(path), header=False, delimiter=";")
    assert inferred.schema().names == ["f0", "f1", "f2"]


def test_csv_a_line_longer_than_a_block_is_read_whole(tmp_path):
    path = str(tmp_path / "t.csv")
    records = rows(0, 5)
    records[2]["name"] = "w" * 5000
    write_csv(path, records)
    got = read_all(from_csv(path, block_size=16, split_size=64))
    pd.testing.assert_frame_equal(got, pandas_csv([path]))


def test_csv_blank_lines_and_a_header_only_file(tmp_path):
    (tmp_path / "a.csv").write_text("name,n,x\n\na,1,0.5\n\n\nb,2,1.5\n")
    (tmp_path / "b.csv").write_text("name,n,x\n")
    got = read_table(from_csv(str(tmp_path), block_size=8))
    assert got.to_pylist() == [{"name": "a", "n": 1, "x": 0.5}, {"name": "b", "n": 2, "x": 1.5}]


# --------------------------------------------------------------------------- JSON


def test_json_directory_read_equals_pandas(tmp_path):
    layout = [("a.jsonl", rows(0, 90)), ("b.json", rows(90, 33)), ("c.ndjson", rows(123, 50))]
    for name, records in layout:
        write_json(str(tmp_path / name), records)
    (tmp_path / "notes.txt").write_text("{}")
    source = from_json(str(tmp_path), block_size=200, split_size=900)
    assert source.schema() == SCHEMA and source.bounded() is True
    want = pd.concat([pd.read_json(tmp_path / name, lines=True, dtype={"name": "str", "n": "int64",
                                                                        "x": "float64"})
                      for name, _ in layout], ignore_index=True)
    pd.testing.assert_frame_equal(read_all(source), want)


def test_json_reopened_mid_split_reads_the_rest_as_pandas(tmp_path):
    path = tmp_path / "t.jsonl"
    write_json(str(path), rows(0, 150))
    want = pd.read_json(path, lines=True)
    source = from_json(str(path), block_size=250)
    (split,) = source.splits()
    head, offset = read_split(source, split, limit=3)
    assert 0 < offset < os.path.getsize(path)
    tail, _ = read_split(source, split, offset=offset)
    skipped = sum(b.num_rows for b in head)
    got = pa.Table.from_batches(tail).to_pandas()
    pd.testing.assert_frame_equal(got, want.iloc[skipped:].reset_index(drop=True), check_dtype=False)
    assert got["n"].dtype == "int64"


def test_json_schema_subset_nulls_and_unexpected_fields(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"name": "a", "n": 1, "extra": true}\n{"n": 2}\n')
    schema = pa.schema([("name", pa.string()), ("n", pa.int32())])
    got = read_table(from_json(str(path), schema=schema, unexpected_fields="ignore"))
    assert got.to_pylist() == [{"name": "a", "n": 1}, {"name": None, "n": 2}]
    with pytest.raises(ValueError, match=r"t.jsonl, line 1: .*unexpected field.*expected columns name: string"):
        read_all(from_json(str(path), schema=schema))


# --------------------------------------------------------------------------- errors


def test_a_missing_path_is_named():
    with pytest.raises(FileNotFoundError, match="from_csv: no such file or directory: '/no/such.csv'"):
        from_csv("/no/such.csv")
    with pytest.raises(FileNotFoundError, match="from_json: no such file or directory"):
        from_json(["/no/such.jsonl"])
    with pytest.raises(ValueError, match="from_csv: expected at least one path"):
        from_csv([])


def test_csv_a_value_of_another_type_names_file_line_and_schema(tmp_path):
    path = str(tmp_path / "t.csv")
    records = rows(0, 50)
    write_csv(path, records)
    with open(path, "a") as f:
        f.write("bad,not-a-number,1.0\n")
    with pytest.raises(ValueError) as info:
        read_all(from_csv(path, schema=SCHEMA, block_size=128))
    text = str(info.value)
    assert f"from_csv: {path}, line 52:" in text and "int64" in text and "not-a-number" in text
    assert "expected columns name: string, n: int64, x: double" in text


def test_csv_an_inferred_schema_says_where_it_came_from(tmp_path):
    path = str(tmp_path / "t.csv")
    write_csv(path, rows(0, 60_000))  # more than the MiB a schema is inferred from
    assert os.path.getsize(path) > 1 << 20
    with open(path, "a") as f:
        f.write("late,1.5,2.0\n")  # n was all ints in the sample
    with pytest.raises(ValueError, match=r"line 60002: .*inferred from the first 1048576 bytes .* pass schema="):
        read_all(from_csv(path))


def test_csv_a_row_that_does_not_parse_and_a_header_without_a_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,n,x\na,1,0.5\nb,2,0.5,extra\n")
    with pytest.raises(ValueError, match=r"t.csv, line 3: CSV parse error.*Expected 3 columns, got 4"):
        read_all(from_csv(str(path), schema=SCHEMA))
    (tmp_path / "u.csv").write_text("name,x\na,0.5\n")
    with pytest.raises(ValueError, match=r"from_csv: .*u.csv has no column 'n': its header names \['name', 'x'\]"):
        from_csv(str(tmp_path / "u.csv"), schema=SCHEMA).splits()


def test_json_a_line_that_does_not_parse_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"n": 1}\n{"n": 2}\n{"n": 3,\n{"n": 4}\n')
    with pytest.raises(ValueError, match=r"from_json: .*t.jsonl, line 3: JSON parse error.*the line: '\{\"n\": 3,'"):
        read_all(from_json(str(path), schema=pa.schema([("n", pa.int64())])))
    path.write_text('{"n": 1}\n{"n": "two"}\n')
    with pytest.raises(ValueError, match=r"t.jsonl, line 2: .*expected columns n: int64"):
        read_all(from_json(str(path), schema=pa.schema([("n", pa.int64())])))


def test_bad_arguments(tmp_path):
    path = str(tmp_path / "t.csv")
    write_csv(path, rows(0, 3))
    with pytest.raises(ValueError, match="from_csv: block_size"):
        from_csv(path, block_size=0)
    with pytest.raises(ValueError, match="from_json: split_size"):
        from_json(path, split_size=-1)
    with pytest.raises(ValueError, match="delimiter must be one character"):
        from_csv(path, delimiter=";;")
    with pytest.raises(ValueError, match="unexpected_fields must be"):
        from_json(path, unexpected_fields="infer")
    with pytest.raises(TypeError, match="schema must be a pyarrow.Schema"):
        from_csv(path, schema={"n": "int64"})
    source = from_csv(path)
    with pytest.raises(ValueError, match="offset for split .* byte position"):
        source.open_split(source.splits()[0], offset=-3)


# --------------------------------------------------------------------------- URIs and filesystems


def test_file_uris_and_a_subtree_filesystem(csv_dir):
    root, paths = csv_dir
    want = pandas_csv(paths)
    pd.testing.assert_frame_equal(read_all(from_csv(root.as_uri(), split_size=500)), want)
    pd.testing.assert_frame_equal(read_all(from_csv([(root / "a.csv").as_uri(), paths[1]])),
                                  pandas_csv(paths[:2]))
    sub = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    pd.testing.assert_frame_equal(read_all(from_csv("", filesystem=sub)), want)
    write_json(str(root / "j" / "e.jsonl"), rows(0, 20))
    got = read_all(from_json("j", filesystem=sub))
    pd.testing.assert_frame_equal(got, pd.read_json(io.StringIO((root / "j" / "e.jsonl").read_text()), lines=True))
    with pytest.raises(ValueError, match="from_csv: .* is a URI, which names its own filesystem"):
        from_csv(root.as_uri(), filesystem=sub)
    with pytest.raises(ValueError, match="from_json: .* not a URI pyarrow.fs understands"):
        from_json("nosuchscheme://x/y")
