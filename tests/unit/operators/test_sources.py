"""Unit tests for operators/sources.py: full reads, resume from offsets, generator properties."""

from __future__ import annotations

import os

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chiray.operators.logic import Source, SourceSplit
from chiray.operators.sources import from_arrow, from_items, from_parquet, generate
from tests.clock import FakeClock


def read_split(source: Source, split: SourceSplit, offset=None, limit=None):
    """Read up to ``limit`` batches of ``split`` from ``offset``; return (batches, final offset)."""
    reader = source.open_split(split, offset)
    out = []
    while limit is None or len(out) < limit:
        batch = reader.read()
        if batch is None:
            break
        out.append(batch)
    off = reader.offset()
    reader.close()
    return out, off


def read_all(source: Source) -> pd.DataFrame:
    """All splits of a (pickled and unpickled) source, in split order, as one DataFrame."""
    source = cloudpickle.loads(cloudpickle.dumps(source))
    batches = [b for split in source.splits() for b in read_split(source, split)[0]]
    if not batches:
        return source.schema().empty_table().to_pandas()
    return pa.Table.from_batches(batches).to_pandas()


def assert_resume_equals_full_read(source: Source, stop_after: int) -> None:
    """For every split: read ``stop_after`` batches, reopen at the offset, finish; equals a full read."""
    for split in source.splits():
        full, _ = read_split(source, split)
        head, off = read_split(source, split, limit=stop_after)
        tail, _ = read_split(source, split, offset=off)
        assert len(head) == min(stop_after, len(full))
        got, want = (
            pa.Table.from_batches(bs, schema=source.schema()).to_pandas().drop(columns=["ts"], errors="ignore")
            for bs in (head + tail, full)
        )
        pd.testing.assert_frame_equal(got, want)


ROWS = [{"k": f"key{i % 7}", "v": i, "f": i / 3} for i in range(103)]


# --------------------------------------------------------------------------- from_items


@pytest.mark.parametrize("num_splits", [1, 2, 3, 200])
@pytest.mark.parametrize("batch_size", [1, 10, 1000])
def test_from_items_full_read_equals_input(num_splits, batch_size):
    source = from_items(ROWS, batch_size=batch_size, num_splits=num_splits)
    assert len(source.splits()) == num_splits
    pd.testing.assert_frame_equal(read_all(source), pd.DataFrame(ROWS))


def test_from_items_batches_respect_batch_size_and_offsets_count_rows():
    source = from_items(ROWS, batch_size=10)
    batches, off = read_split(source, source.splits()[0], limit=3)
    assert [b.num_rows for b in batches] == [10, 10, 10]
    assert off == 30


@pytest.mark.parametrize("num_splits", [1, 3])
def test_from_items_resume(num_splits):
    assert_resume_equals_full_read(from_items(ROWS, batch_size=8, num_splits=num_splits), stop_after=2)


def test_from_items_explicit_schema_and_empty():
    schema = pa.schema([("k", pa.string()), ("v", pa.int32())])
    source = from_items([{"k": "a", "v": 1}], schema=schema)
    assert source.schema() == schema
    assert read_all(source)["v"].tolist() == [1]
    empty = from_items([], schema=schema)
    assert read_all(empty).empty and empty.schema() == schema


def test_from_items_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        from_items(ROWS, batch_size=0)
    with pytest.raises(TypeError, match="dict"):
        from_items({"k": 1})


# --------------------------------------------------------------------------- from_arrow


def arrow_batches(sizes):
    start = 0
    out = []
    for n in sizes:
        idx = np.arange(start, start + n)
        out.append(pa.record_batch({"i": idx, "s": pa.array([f"s{j}" for j in idx], type=pa.string())}))
        start += n
    return out


@pytest.mark.parametrize("num_splits", [None, 1, 2, 4, 50])
@pytest.mark.parametrize("batch_size", [None, 1, 7, 100])
def test_from_arrow_full_read_equals_input(num_splits, batch_size):
    batches = arrow_batches([5, 0, 13, 8, 1])
    source = from_arrow(batches, num_splits=num_splits, batch_size=batch_size)
    expected = pa.Table.from_batches(batches).to_pandas()
    pd.testing.assert_frame_equal(read_all(source), expected)
    assert len(source.splits()) == (1 if num_splits is None else num_splits)


def test_from_arrow_emits_batches_as_given_and_zero_copy():
    batches = arrow_batches([4, 6, 3])
    source = from_arrow(batches, batch_size=None)
    (got,) = [read_split(source, s)[0] for s in source.splits()]
    assert [b.num_rows for b in got] == [4, 6, 3]
    for want, have in zip(batches, got):
        assert have.column(0).buffers()[1].address == want.column(0).buffers()[1].address


@pytest.mark.parametrize("parallelism", [1, 2, 3])
def test_from_arrow_cuts_one_row_range_per_instance_whatever_the_chunking(parallelism):
    table = pa.Table.from_batches(arrow_batches([10, 7, 13]))
    one_chunk = pa.Table.from_batches([table.combine_chunks().to_batches()[0]])
    cuts = []
    for data in (table, one_chunk):
        source = from_arrow(data, batch_size=4).for_parallelism(parallelism)
        splits = source.splits()
        assert [s.payload for s in splits] == [(30 * i // parallelism, 30 * (i + 1) // parallelism)
                                               for i in range(parallelism)]
        cuts.append([[b.to_pydict() for b in read_split(source, s)[0]] for s in splits])
    assert cuts[0] == cuts[1]  # the same batches, row for row


def test_from_arrow_rechunks_to_batch_size_across_input_batches():
    source = from_arrow(arrow_batches([4, 6, 3]), num_splits=1, batch_size=5)
    batches, off = read_split(source, source.splits()[0])
    assert [b.num_rows for b in batches] == [5, 5, 3]
    assert off == 13


def test_from_arrow_accepts_table_and_single_batch():
    table = pa.Table.from_batches(arrow_batches([3, 4]))
    pd.testing.assert_frame_equal(read_all(from_arrow(table)), table.to_pandas())
    one = arrow_batches([5])[0]
    pd.testing.assert_frame_equal(read_all(from_arrow(one)), one.to_pandas())


@pytest.mark.parametrize("num_splits,batch_size", [(None, None), (2, None), (1, 4), (30, 2)])
def test_from_arrow_resume(num_splits, batch_size):
    source = from_arrow(arrow_batches([5, 9, 2, 7]), num_splits=num_splits, batch_size=batch_size)
    assert_resume_equals_full_read(source, stop_after=1)


def test_from_arrow_schema_mismatch_names_batch_and_schemas():
    good = pa.record_batch({"i": [1, 2]})
    bad = pa.record_batch({"i": ["x"]})
    with pytest.raises(ValueError, match=r"batch 2 .*different schema") as info:
        from_arrow([good, good, bad])
    assert "int64" in str(info.value) and "string" in str(info.value)


def test_from_arrow_rejects_non_arrow():
    with pytest.raises(TypeError, match="RecordBatch"):
        from_arrow([{"i": 1}])
    with pytest.raises(TypeError, match="list|Table"):
        from_arrow(42)


# --------------------------------------------------------------------------- from_parquet


@pytest.fixture
def parquet_dir(tmp_path):
    """Three files (one in a subdirectory) with several row groups each, plus noise files."""
    frames = []
    layout = [("a.parquet", 23, 5), ("b.parquet", 17, 4), (os.path.join("sub", "c.parquet"), 9, 3)]
    rng = np.random.default_rng(1)
    for i, (name, n, rg) in enumerate(layout):
        df = pd.DataFrame({"id": np.arange(n) + 1000 * i, "x": rng.random(n), "name": [f"n{j}" for j in range(n)]})
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=rg)
        frames.append(df)
    (tmp_path / "README.txt").write_text("not parquet")
    (tmp_path / ".hidden.parquet.inprogress").write_text("staged")
    return tmp_path, layout, frames


def test_from_parquet_directory_full_read(parquet_dir):
    root, layout, frames = parquet_dir
    source = from_parquet(str(root))
    expected_splits = [
        f"{root / name}#{g}" for name, n, rg in sorted(layout) for g in range(-(-n // rg))
    ]
    assert [s.split_id for s in source.splits()] == expected_splits
    expected = pd.concat(frames, ignore_index=True)  # sorted file order is a, b, sub/c
    pd.testing.assert_frame_equal(read_all(source), expected)


def test_from_parquet_columns_and_file_list(parquet_dir):
    root, layout, frames = parquet_dir
    source = from_parquet([str(root / "b.parquet"), str(root / "a.parquet")], columns=["name", "id"])
    assert source.schema().names == ["name", "id"]
    expected = pd.concat([frames[1], frames[0]], ignore_index=True)[["name", "id"]]
    pd.testing.assert_frame_equal(read_all(source), expected)


@pytest.mark.parametrize("batch_size", [None, 2])
def test_from_parquet_resume(parquet_dir, batch_size):
    root, _, _ = parquet_dir
    source = from_parquet(str(root), batch_size=batch_size)
    assert_resume_equals_full_read(source, stop_after=1)
    split = source.splits()[0]
    batches, off = read_split(source, split, limit=2)
    assert off == len(batches) == (1 if batch_size is None else 2)


def test_from_parquet_errors(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        from_parquet(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no \\*.parquet"):
        from_parquet(str(tmp_path / "empty"))
    pq.write_table(pa.table({"a": [1]}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="columns \\['zz'\\]"):
        from_parquet(str(tmp_path / "t.parquet"), columns=["zz"]).schema()


def test_from_parquet_holds_no_open_file_before_open_split(parquet_dir):
    root, _, _ = parquet_dir
    source = from_parquet(str(root))
    source.splits()
    cloudpickle.loads(cloudpickle.dumps(source))  # picklable after splits() too


# --------------------------------------------------------------------------- generate


def gen_frame(source: Source) -> pd.DataFrame:
    return read_all(source).drop(columns=["ts"])


def test_generate_schema_sizes_and_seq_without_gaps():
    source = generate(1003, batch_size=100, num_splits=3, num_keys=50)
    df = read_all(source)
    assert source.schema().names == ["key", "value", "seq", "ts"]
    assert len(df) == 1003
    batches_per_split = [read_split(source, s)[0] for s in source.splits()]
    for batches in batches_per_split:
        seq = pa.Table.from_batches(batches).column("seq").to_numpy()
        np.testing.assert_array_equal(seq, np.arange(len(seq)))
    assert sorted(sum(b.num_rows for b in bs) for bs in batches_per_split) == [334, 334, 335]
    assert df["key"].str.fullmatch(r"k\d+").all()
    assert df["key"].str[1:].astype(int).between(0, 49).all()
    assert str(df["ts"].dtype).startswith("datetime64[ns")


def test_generate_is_deterministic_in_seed():
    a = gen_frame(generate(5000, batch_size=512, seed=7, num_splits=2))
    b = gen_frame(generate(5000, batch_size=512, seed=7, num_splits=2))
    c = gen_frame(generate(5000, batch_size=512, seed=8, num_splits=2))
    pd.testing.assert_frame_equal(a, b)
    assert not a["key"].equals(c["key"]) and not a["value"].equals(c["value"])


@pytest.mark.parametrize("key_type", ["string", "int"])
@pytest.mark.parametrize("dist", ["uniform", "zipf"])
def test_generate_resume(key_type, dist):
    source = generate(2500, batch_size=300, num_splits=2, key_type=key_type, dist=dist)
    assert_resume_equals_full_read(source, stop_after=3)


def test_generate_unbounded_resume_at_offset_reproduces_batch():
    source = generate(None, batch_size=64, key_type="int")
    split = source.splits()[0]
    first, off = read_split(source, split, limit=5)
    assert off == 5
    again, _ = read_split(source, split, offset=4, limit=1)
    assert again[0].drop_columns(["ts"]).equals(first[4].drop_columns(["ts"]))


def test_generate_formats_string_keys_per_batch_above_the_dictionary_bound(monkeypatch):
    """Above ``DICTIONARY_KEYS`` a reader builds no dictionary of every key (1.3 s and 100 MB at 8M keys,
    at every open), and its keys are the same: ``"k"`` and the id the same seed draws as an int key."""
    from chiray.operators import generator

    def refused(self):
        raise AssertionError("built a dictionary of every key")

    as_ints = gen_frame(generate(3000, batch_size=256, num_keys=10_000, num_splits=2, key_type="int"))
    with_dictionary = gen_frame(generate(3000, batch_size=256, num_keys=10_000, num_splits=2))
    monkeypatch.setattr(generator, "DICTIONARY_KEYS", 100)
    monkeypatch.setattr(generator.GenerateSource, "key_dictionary", refused)
    formatted = gen_frame(generate(3000, batch_size=256, num_keys=10_000, num_splits=2))
    assert formatted["key"].tolist() == [f"k{i}" for i in as_ints["key"]]
    pd.testing.assert_frame_equal(formatted, with_dictionary)


def test_generate_zipf_bounded_and_skewed():
    num_keys = 1000
    df = gen_frame(generate(200_000, dist="zipf", zipf_s=1.1, num_keys=num_keys, key_type="int", seed=3))
    assert df["key"].between(0, num_keys - 1).all()
    counts = df["key"].value_counts()
    uniform_share = 1 / num_keys
    assert counts.iloc[0] / len(df) > 50 * uniform_share
    weights = np.arange(1, num_keys + 1) ** -1.1  # independent: expected share of rank 0
    assert abs(counts.loc[0] / len(df) - weights[0] / weights.sum()) < 0.01


def test_generate_uniform_is_not_skewed():
    df = gen_frame(generate(100_000, num_keys=100, key_type="int"))
    share = df["key"].value_counts(normalize=True)
    assert share.max() < 2 / 100 and df["key"].nunique() == 100


def test_generate_rate_pacing_from_ready_at():
    source = generate(10_000, rate=2000.0, batch_size=250, num_splits=2, clock=FakeClock(100.0))
    reader = source.open_split(source.splits()[0])
    due = [reader.ready_at()]
    for _ in range(4):
        assert reader.read() is not None
        due.append(reader.ready_at())
    per_split_rate = 2000.0 / 2
    np.testing.assert_allclose(np.diff(due), 250 / per_split_rate)
    assert due[0] == 100.0
    assert generate(10).open_split(SourceSplit("generate-0", 0)).ready_at() is None


def test_generate_real_clock_ready_at_is_monotonic_time():
    import time

    source = generate(100, rate=10.0, batch_size=5)
    before = time.monotonic()
    reader = source.open_split(source.splits()[0])
    reader.read()
    assert before + 0.5 - 1e-6 <= reader.ready_at() <= time.monotonic() + 0.5


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_records": -1}, "num_records"),
        ({"batch_size": 0}, "batch_size"),
        ({"dist": "normal"}, "dist"),
        ({"key_type": "float"}, "key_type"),
        ({"rate": 0}, "rate"),
        ({"num_keys": 0}, "num_keys"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, match):
    args = {"num_records": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(args.pop("num_records"), **args)


def test_zipf_sampler_equals_plain_inverse_cdf():
    from chiray.operators.generator import _ZipfSampler

    num_keys, s = 5000, 1.3
    weights = np.arange(1, num_keys + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(weights) / weights.sum()
    u = np.concatenate([[0.0, np.nextafter(1.0, 0.0), cdf[0], cdf[10]], np.random.default_rng(5).random(100_000)])
    expected = np.minimum(np.array([np.searchsorted(cdf, x, side="right") for x in u[:2000]]), num_keys - 1)
    got = _ZipfSampler(num_keys, s).sample(u)
    np.testing.assert_array_equal(got[:2000], expected)
    assert got.min() >= 0 and got.max() < num_keys
    freq = np.bincount(got[:100_000], minlength=num_keys) / 100_000
    np.testing.assert_allclose(freq[:5], weights[:5] / weights.sum(), atol=0.01)


def test_from_items_with_mixed_types_names_the_field_and_the_rows():
    with pytest.raises(TypeError, match=r"from_items: field 'a' has values of types int \(first at row 0\), "
                                        r"str \(first at row 2\); every value of a field must have one type"):
        from_items([{"a": 1}, {"a": None}, {"a": "x"}])
    schema = pa.schema([("a", pa.int64())])
    with pytest.raises(TypeError, match=r"field 'a' has values of types str \(first at row 0\); "
                                        r"the schema gives it type int64"):
        from_items([{"a": "1"}], schema=schema)


def test_from_items_keeps_fields_that_only_later_rows_have_and_refuses_what_has_no_column():
    # pa.Table.from_pylist keeps only the first row's fields and reads a non-dict row as nulls
    assert from_items([{"a": 1}, {"a": 2, "b": "x"}]).schema().names == ["a", "b"]
    source = from_items([{"a": 1}, {"a": 2, "b": "x"}])
    reader = source.open_split(source.splits()[0])
    assert reader.read().to_pylist() == [{"a": 1, "b": None}, {"a": 2, "b": "x"}]
    with pytest.raises(TypeError, match=r"from_items: row 1 is a tuple \(\(1,\)\); expected dicts"):
        from_items([{"a": 1}, (1,)])
    with pytest.raises(ValueError, match=r"from_items: row 1 has field 'z', which the schema does not have"):
        from_items([{"a": 1}, {"a": 2, "z": 3}], schema=pa.schema([("a", pa.int64())]))
