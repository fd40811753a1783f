"""oracles.py: the suite's per-key count oracle, computed independently of chiray (pandas over the input).

A keyed count's expected output is the number of records per key of the
batches its sources emit, read straight from the source's splits and counted
by pandas; :func:`assert_counts_equal` compares a job's committed output with
it and, on a mismatch, names the keys lost, the keys invented and the keys
counted wrong instead of printing two large dicts.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pyarrow as pa

__all__ = ["assert_counts_equal", "assert_in_order", "key_counts", "output_counts", "source_batches",
           "track_positions"]

_SHOWN = 10  # keys named per kind of difference


def source_batches(source: Any) -> list[pa.RecordBatch]:
    """Every batch a replayable source emits, split after split, read at once (pacing is advisory)."""
    batches = []
    for split in source.splits():
        reader = source.open_split(split)
        while (batch := reader.read()) is not None:
            batches.append(batch)
    return batches


def key_counts(data: Any, column: str = "key") -> dict[Any, int]:
    """Records per key of ``data``, counted by pandas: the oracle of a keyed count.

    Args:
        data: a replayable source (read with :func:`source_batches`), or an iterable of record
            batches or tables.
        column: the key column.

    Raises:
        ValueError: a key is null (pandas would drop it from the groups, hiding it from the oracle).
    """
    parts: Iterable[Any] = source_batches(data) if hasattr(data, "splits") else data
    tables = [pa.Table.from_batches([p]) if isinstance(p, pa.RecordBatch) else p for p in parts]
    if not tables:
        return {}
    keys = pa.concat_tables([t.select([column]) for t in tables]).to_pandas()[column]
    if keys.isna().any():
        raise ValueError(f"{int(keys.isna().sum())} null values in key column {column!r}: no oracle for them")
    sizes = keys.groupby(keys).size()
    return dict(zip(sizes.index.tolist(), sizes.tolist()))


def output_counts(table: pa.Table, key: str = "key", count: str = "count") -> dict[Any, int]:
    """A keyed count's committed output as ``{key: count}``.

    Raises:
        AssertionError: a key appears in more than one row (one key's count split or emitted twice).
    """
    keys, counts = table.column(key).to_pylist(), table.column(count).to_pylist()
    out = dict(zip(keys, counts))
    if len(out) != len(keys):
        seen: set = set()
        twice = sorted({k for k in keys if k in seen or seen.add(k)}, key=repr)
        raise AssertionError(f"{len(keys) - len(out)} duplicate output rows, e.g. keys {twice[:_SHOWN]}")
    return out


def assert_counts_equal(got: pa.Table | Mapping[Any, int], expected: Mapping[Any, int],
                        what: str = "the job's counts") -> None:
    """Assert a keyed count's output (a table with ``key`` and ``count`` columns, or a dict) equals
    ``expected`` exactly; the error names the keys missing, extra and counted wrong."""
    got = output_counts(got) if isinstance(got, pa.Table) else dict(got)
    if got == dict(expected):
        return
    missing = sorted(set(expected) - set(got), key=repr)
    extra = sorted(set(got) - set(expected), key=repr)
    wrong = sorted((k for k in set(got) & set(expected) if got[k] != expected[k]), key=repr)
    lines = [f"{what} differ from the oracle: {sum(got.values())} records counted over {len(got)} keys, "
             f"{sum(expected.values())} expected over {len(expected)} keys"]
    if missing:
        lines.append(f"  {len(missing)} keys lost: "
                     + ", ".join(f"{k!r} ({expected[k]})" for k in missing[:_SHOWN]))
    if extra:
        lines.append(f"  {len(extra)} keys not in the input: "
                     + ", ".join(f"{k!r} ({got[k]})" for k in extra[:_SHOWN]))
    if wrong:
        lines.append(f"  {len(wrong)} keys counted wrong (got vs expected): "
                     + ", ".join(f"{k!r} {got[k]} vs {expected[k]}" for k in wrong[:_SHOWN]))
    raise AssertionError("\n".join(lines))


def track_positions(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
    """A keyed ``process`` function whose output :func:`assert_in_order` checks: keeps each key's ``seq``
    values in its state, in arrival order, and emits each record's position in that list (columns ``key``,
    ``seq``, ``pos``). A record lost, applied twice or out of order, or state lost in a move, shows there."""
    seqs = state.value or []
    start = len(seqs)
    new = rows.column("seq").to_pylist()
    seqs.extend(new)
    state.value = seqs
    return pa.record_batch({"key": [key] * len(new), "seq": new, "pos": list(range(start, start + len(new)))})


def assert_in_order(positions: pa.Table, arrival: Mapping[Any, list[int]]) -> None:
    """Assert that :func:`track_positions`' output ``positions`` holds, for each key, the ``seq`` values of
    ``arrival`` (key -> its seqs in the order they were sent), each at its own position, in that order."""
    seen: dict[Any, dict[int, int]] = {}
    for row in positions.to_pylist():
        by_pos = seen.setdefault(row["key"], {})
        assert row["pos"] not in by_pos, f"key {row['key']}: position {row['pos']} twice"
        by_pos[row["pos"]] = row["seq"]
    lost, invented = set(arrival) - set(seen), set(seen) - set(arrival)
    assert not lost and not invented, f"keys lost: {sorted(lost, key=repr)}, invented: {sorted(invented, key=repr)}"
    for key, by_pos in seen.items():
        got = [by_pos.get(i) for i in range(len(by_pos))]
        assert got == list(arrival[key]), f"key {key}: state lost or reordered"
