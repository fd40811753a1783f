"""Tests for operators.hashing: stable key hash, key -> bin, key grouping and the key index."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators.hashing import (
    DEFAULT_NUM_BINS,
    NULL_HASH,
    bins_from_hashes,
    bins_of,
    check_num_bins,
    hash_keys,
)
from chiray.operators.keyindex import KeyIndex, encode_keys

REPO = Path(__file__).resolve().parents[3]


def _string_keys(n: int, distinct: int, seed: int = 0) -> pa.Array:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"key-{i}" for i in range(distinct)], dtype=object)
    values = vocab[rng.integers(0, distinct, n)].tolist()
    for i in rng.integers(0, n, n // 50):
        values[i] = None
    return pa.array(values)


KEY_COLUMNS = {
    "string": _string_keys(2000, 300),
    "large_string": _string_keys(2000, 300).cast(pa.large_string()),
    "binary": pa.array([b"a", b"bb", None, b"", b"a"] * 10),
    "int64": pa.array([1, -5, None, 2**62, 0] * 10),
    "uint64": pa.array([1, 2**64 - 1, None, 7] * 10, pa.uint64()),
    "float64": pa.array([1.5, -0.0, 0.0, float("nan"), None, 1e300] * 10),
    "bool": pa.array([True, False, None] * 10),
    "timestamp": pa.array([datetime.datetime(2024, 1, d) for d in range(1, 11)] + [None], pa.timestamp("us")),
    "date32": pa.array([datetime.date(2024, 1, d) for d in range(1, 11)] + [None], pa.date32()),
    "decimal": pa.array([1, 2, None], pa.decimal128(10, 2)),
    "null": pa.nulls(5),
}


@pytest.mark.parametrize("n", [1, 2, 4, 1024, 1 << 20])
def test_check_num_bins_accepts_powers_of_two(n: int) -> None:
    assert check_num_bins(n) == n


@pytest.mark.parametrize("n", [0, -1, -4, 3, 6, 1000, 2.0, True, "8", None])
def test_check_num_bins_rejects_others_with_expected_and_got(n: object) -> None:
    with pytest.raises(ValueError) as info:
        check_num_bins(n)  # type: ignore[arg-type]
    assert "power of two" in str(info.value) and repr(n) in str(info.value)


def test_default_num_bins_is_valid() -> None:
    assert check_num_bins(DEFAULT_NUM_BINS) == 1024


@pytest.mark.parametrize("name", sorted(KEY_COLUMNS))
@pytest.mark.parametrize("num_bins", [1, 2, 64, 1024])
def test_bins_of_is_int64_in_range(name: str, num_bins: int) -> None:
    bins = bins_of(KEY_COLUMNS[name], num_bins)
    assert bins.dtype == np.int64 and len(bins) == len(KEY_COLUMNS[name])
    assert ((bins >= 0) & (bins < num_bins)).all()


@pytest.mark.parametrize("name", sorted(KEY_COLUMNS))
def test_hash_of_a_value_does_not_depend_on_the_rest_of_the_column(name: str) -> None:
    column = KEY_COLUMNS[name]
    whole = hash_keys(column)
    assert whole.dtype == np.uint64
    one_by_one = np.array([hash_keys(column.slice(i, 1))[0] for i in range(len(column))], dtype=np.uint64)
    np.testing.assert_array_equal(whole, one_by_one)


@pytest.mark.parametrize("name", sorted(KEY_COLUMNS))
def test_nulls_hash_to_the_null_hash(name: str) -> None:
    column = KEY_COLUMNS[name]
    nulls = column.is_null().to_numpy(zero_copy_only=False)
    assert nulls.any()
    assert (hash_keys(column)[nulls] == NULL_HASH).all()


def test_equal_strings_hash_equal_and_distinct_strings_differ() -> None:
    column = _string_keys(5000, 1000, seed=3)
    hashes = hash_keys(column)
    by_value: dict[object, set[int]] = {}
    for value, h in zip(column.to_pylist(), hashes.tolist()):
        by_value.setdefault(value, set()).add(h)
    assert all(len(hs) == 1 for hs in by_value.values())
    assert len({next(iter(hs)) for hs in by_value.values()}) == len(by_value)


def test_one_value_hashes_the_same_at_every_integer_width() -> None:
    values = [0, 1, 7, 100, None]
    expected = hash_keys(pa.array(values, pa.int64()))
    for t in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()):
        np.testing.assert_array_equal(hash_keys(pa.array(values, t)), expected)


def test_string_encodings_hash_alike() -> None:
    column = _string_keys(500, 50)
    expected = hash_keys(column)
    np.testing.assert_array_equal(hash_keys(column.cast(pa.large_string())), expected)
    np.testing.assert_array_equal(hash_keys(column.dictionary_encode()), expected)
    chunked = pa.chunked_array([column.slice(0, 100), column.slice(100)])
    np.testing.assert_array_equal(hash_keys(chunked), expected)


def test_float_zero_signs_and_nans_are_one_key() -> None:
    h = hash_keys(pa.array([0.0, -0.0, float("nan"), -float("nan")]))
    assert h[0] == h[1] and h[2] == h[3] and h[0] != h[2]


def test_empty_columns_hash_to_empty_arrays() -> None:
    assert hash_keys(pa.array([], pa.string())).shape == (0,)
    assert hash_keys(pa.chunked_array([], pa.int64())).shape == (0,)
    assert bins_of(pa.array([], pa.int64()), 16).shape == (0,)


def test_hash_keys_rejects_non_arrow_input() -> None:
    with pytest.raises(TypeError, match="pyarrow"):
        hash_keys(["a", "b"])  # type: ignore[arg-type]


@pytest.mark.parametrize("column", [pa.array([f"user-{i}" for i in range(64_000)]), pa.array(np.arange(64_000))])
def test_bins_are_balanced(column: pa.Array) -> None:
    counts = np.bincount(bins_of(column, 64), minlength=64)
    mean = len(column) / 64
    assert counts.min() > 0.85 * mean and counts.max() < 1.15 * mean


def test_bins_from_hashes_uses_top_bits() -> None:
    hashes = np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)
    assert bins_from_hashes(hashes, 2).tolist() == [0, 1, 1]
    assert bins_from_hashes(hashes, 1024).tolist() == [0, 512, 1023]
    assert bins_from_hashes(hashes, 1).tolist() == [0, 0, 0]


_CHILD = """
import json, sys
import numpy as np
import pyarrow as pa
sys.path.insert(0, {repo!r})
from chiray.operators.hashing import bins_of, hash_keys
keys = pa.array([f"key-{{i}}" for i in range(2000)] + [None])
print(json.dumps([bins_of(keys, 1024).tolist(), [str(h) for h in hash_keys(keys)], hash("key-1")]))
"""


def test_hash_is_stable_across_processes_with_different_hash_seeds() -> None:
    keys = pa.array([f"key-{i}" for i in range(2000)] + [None])
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _CHILD.format(repo=str(REPO))], env=env,
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    assert results[0][2] != results[1][2], "the children's str hashes should differ (salted)"
    for child_bins, child_hashes, _ in results:
        assert child_bins == bins_of(keys, 1024).tolist()
        assert child_hashes == [str(h) for h in hash_keys(keys)]


_M64 = (1 << 64) - 1


def _splitmix_loop(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _hash_loop(value: bytes | int | None) -> int:
    """The documented hash, one value at a time in plain Python: an integer through splitmix64; bytes
    seeded by their length, then folded 8 little-endian bytes at a time (the last word zero-padded)."""
    if value is None:
        return int(NULL_HASH)
    if isinstance(value, int):
        return _splitmix_loop(value & _M64)
    h = _splitmix_loop(len(value) ^ 0x6368697261790001)
    for k in range(0, len(value), 8):
        h = _splitmix_loop(h ^ int.from_bytes(value[k:k + 8], "little"))
    return h


@pytest.mark.parametrize("kind", ["string", "large_binary", "int64"])
def test_long_columns_hash_as_a_plain_loop_does_across_steps(kind: str, monkeypatch) -> None:
    """A column longer than ``HASH_CHUNK_ROWS`` is hashed in steps (lowered here to 64 rows): every row,
    on either side of a step's edge, in a slice that starts inside a step, and the column's last value
    (whose last word runs past the data buffer's end), hashes as the plain loop says."""
    from chiray.operators import hashing

    monkeypatch.setattr(hashing, "HASH_CHUNK_ROWS", 64)
    rng = np.random.default_rng(11)
    n = 1000
    if kind == "int64":
        values: list = [None if rng.random() < 0.05 else int(v) for v in rng.integers(-2**63, 2**63 - 1, n)]
        column = pa.array(values, pa.int64())
    else:
        values = [None if rng.random() < 0.05 else rng.bytes(int(rng.choice([0, 1, 5, 8, 9, 16, 23, 40])))
                  for _ in range(n)]
        values[-1] = b"last-value-of-13"[:13]
        column = pa.array(values, pa.large_binary()) if kind == "large_binary" else pa.array(
            [None if v is None else v.hex() for v in values], pa.string())
        if kind == "string":
            values = [None if v is None else v.hex().encode() for v in values]
    expected = np.array([_hash_loop(v) for v in values], dtype=np.uint64)
    assert (hash_keys(column) == expected).all()
    assert (hash_keys(column.slice(37, 700)) == expected[37:737]).all()
    assert (hash_keys(pa.chunked_array([column.slice(0, 500), column.slice(500)])) == expected).all()


def test_encode_keys_groups_in_first_appearance_order() -> None:
    column = pa.array(["b", None, "a", "b", None, "c"])
    uniques, codes = encode_keys(column)
    assert uniques.to_pylist() == ["b", None, "a", "c"]
    assert codes.tolist() == [0, 1, 2, 0, 1, 3]


def test_encode_keys_makes_one_key_of_float_zeros_and_nans() -> None:
    uniques, codes = encode_keys(pa.array([0.0, -0.0, float("nan"), 1.0, float("nan"), None]))
    assert len(uniques) == 4
    assert codes[0] == codes[1] and codes[2] == codes[4]


def test_encode_keys_accepts_chunked_and_dictionary_columns() -> None:
    column = _string_keys(300, 20)
    expected = encode_keys(column)
    for variant in (pa.chunked_array([column.slice(0, 7), column.slice(7)]), column.dictionary_encode()):
        uniques, codes = encode_keys(variant)
        assert uniques.to_pylist() == expected[0].to_pylist()
        np.testing.assert_array_equal(codes, expected[1])


@pytest.mark.parametrize("table_hash_bits", [64, 3])
@pytest.mark.parametrize("kind", ["string", "int", "float"])
def test_key_index_matches_a_dict(table_hash_bits: int, kind: str) -> None:
    rng = np.random.default_rng(7)
    index = KeyIndex({"string": pa.string(), "int": pa.int64(), "float": pa.float64()}[kind],
                     table_hash_bits=table_hash_bits)
    oracle: dict[object, int] = {}
    for _ in range(8):
        raw = rng.integers(0, 400, 300)
        values: list = {"string": [f"k{v}" for v in raw], "int": raw.tolist(), "float": (raw / 4).tolist()}[kind]
        values[0] = None
        uniques, _ = encode_keys(pa.array(values))
        slots, new = index.upsert(uniques)
        for i, key in enumerate(uniques.to_pylist()):
            if key not in oracle:
                assert i in set(new.tolist())
                oracle[key] = len(oracle)
            assert slots[i] == oracle[key]
    assert len(index) == len(oracle)
    assert index.keys_at(np.arange(len(oracle))).to_pylist() == list(oracle)


@pytest.mark.parametrize("table_hash_bits", [64, 2])
def test_key_index_compact_renumbers_and_forgets(table_hash_bits: int) -> None:
    index = KeyIndex(pa.string(), table_hash_bits=table_hash_bits)
    keys = [f"k{i}" for i in range(50)]
    index.upsert(pa.array(keys))
    keep = np.arange(0, 50, 3)
    index.compact(keep)
    kept = [keys[i] for i in keep]
    assert index.keys_at(np.arange(len(keep))).to_pylist() == kept
    slots, new = index.upsert(pa.array(["k1", "k0", "k3"]))
    assert slots.tolist() == [len(kept), 0, 1] and new.tolist() == [0]
    np.testing.assert_array_equal(index.hashes(np.arange(len(kept))), hash_keys(pa.array(kept)))


@pytest.mark.parametrize("seed", range(8))
def test_key_index_compact_keeps_every_kept_key_findable_under_clashes(seed: int) -> None:
    """With 3 hash bits nearly every key clashes: a kept key whose entry's holder was dropped
    must still be found after the compaction (it takes the entry), and a dropped key is new."""
    rng = np.random.default_rng(seed)
    index = KeyIndex(pa.string(), table_hash_bits=3)
    keys = [f"key-{i}" for i in range(60)]
    index.upsert(pa.array(keys))
    keep = np.flatnonzero(rng.random(60) < 0.4)
    index.compact(keep)
    kept = [keys[i] for i in keep]
    slots, new = index.upsert(pa.array(keys))
    assert slots[keep].tolist() == list(range(len(keep)))
    dropped = np.setdiff1d(np.arange(60), keep)
    assert new.tolist() == dropped.tolist()
    assert index.keys_at(np.arange(len(index))).to_pylist() == kept + [keys[i] for i in dropped]
