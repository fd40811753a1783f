"""ops.py: the keyed count + sum of ``keyed_count`` written with each of chiray's keyed paths (``--op``).

* ``agg``: the built-in vectorised ``agg(count, sum)``.
* ``process``: a Python function per key and batch, as a user writes one: it reads its rows' values, adds
  them to the key's ``(count, total)`` state and emits the key's new totals.
* ``process_batch``: the same over every key of a batch at once (``np.add.reduceat`` over the offsets).
* ``reduce``: a Python function per record, ``fn(acc, row)``, over records that carry a ``count`` of 1.
* ``map_records``: a Python function per record (``map_records``: the record with a ``count`` of 1), then
  one per record again (``filter_records``: keep non-negative values), then ``agg(sum, sum)``.

Every op's result, through :func:`final_counts`, is one row per key: ``key``, ``count``, ``total``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["OPS", "count_flow", "final_counts"]

OPS = ("agg", "process", "process_batch", "reduce", "map_records")
_OUT = pa.schema([("key", pa.string()), ("count", pa.int64()), ("total", pa.int64())])


def count_sum(key: str, rows: pa.RecordBatch, state: Any) -> list[dict]:
    """Per key: its rows' values added to its (count, total)."""
    count, total = state.value or (0, 0)
    values = rows.column(1).to_pylist()
    state.value = count, total = count + len(values), total + sum(values)
    return [{"key": key, "count": count, "total": total}]


def count_sum_batch(batch: Any) -> pa.RecordBatch:
    """Every key of a batch at once: counts and sums by ``reduceat``, states updated in one pass."""
    counts = np.diff(batch.offsets).tolist()
    sums = np.add.reduceat(batch.rows.column(1).to_numpy(), batch.offsets[:-1]).tolist()
    states = [(c + s[0], t + s[1]) if s else (c, t) for s, c, t in zip(batch.states, counts, sums)]
    batch.states = states
    return pa.RecordBatch.from_arrays(
        [pa.array(batch.keys, pa.string()), pa.array([s[0] for s in states], pa.int64()),
         pa.array([s[1] for s in states], pa.int64())], schema=_OUT)


def add(acc: dict, row: dict) -> dict:
    return {"key": acc["key"], "value": acc["value"] + row["value"], "count": acc["count"] + 1}


def with_count(row: dict) -> dict:
    return {"key": row["key"], "value": row["value"], "count": 1}


def non_negative(row: dict) -> bool:
    return row["value"] >= 0


def _with_count_column(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("count", pa.array(np.ones(batch.num_rows, dtype=np.int64)))


def count_flow(batches: list[pa.RecordBatch], parallelism: int, op: str) -> Any:
    """The dataflow of ``op``: ``from_arrow`` (parallelism 1) -> the count and sum (``parallelism``) -> collect."""
    from chiray.operators import Dataflow, from_arrow

    flow = Dataflow("keyed_count")
    if op == "reduce":  # the count column is made before timing, as the batches are
        batches = [_with_count_column(b) for b in batches]
    source = flow.source(from_arrow(batches, batch_size=None), parallelism=1, name="source")  # the batches as made
    if op == "map_records":
        source = (source.map_records(with_count, name="with_count", parallelism=parallelism)
                        .filter_records(non_negative, name="non_negative", parallelism=parallelism))
    keyed = source.key_by("key")
    if op in ("agg", "map_records"):
        counts = (None, "count") if op == "agg" else ("count", "sum")
        out = keyed.agg(count=counts, total=("value", "sum"), parallelism=parallelism, name="count")
    elif op == "process":
        out = keyed.process(count_sum, schema=_OUT, parallelism=parallelism, name="count")
    elif op == "process_batch":
        out = keyed.process_batch(count_sum_batch, schema=_OUT, parallelism=parallelism, name="count")
    elif op == "reduce":
        out = keyed.reduce(add, emit="final", parallelism=parallelism, name="count")
    else:
        raise ValueError(f"--op must be one of {OPS}, got {op!r}")
    out.collect(name="out")
    return flow


def final_counts(result: pa.Table, op: str) -> pa.Table:
    """``key``, ``count``, ``total`` per key: for the ops that emit each key's totals per batch, its last."""
    if op == "reduce":
        return result.select(["key", "count", "value"]).rename_columns(["key", "count", "total"])
    if op in ("process", "process_batch"):  # a key's totals only grow: its last row has the largest count
        frame = result.to_pandas().sort_values("count").drop_duplicates("key", keep="last")
        return pa.Table.from_pandas(frame[["key", "count", "total"]], preserve_index=False)
    return result
