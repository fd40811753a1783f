"""stateless.py: the stateless operator logics: map, filter, flat_map (batch and record level), union.

Batch-level functions receive a whole ``pyarrow.RecordBatch`` and are the fast
path. Given ``params`` (a dict), they are called as ``fn(batch, params)``; a
``Reconfigure`` control op changes ``params`` consistently while the job runs. Record-level variants (``*_records``) call the user function once per
row on Python dicts: convenient, and one to two orders of magnitude slower.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from .batch import to_batches
from .logic import OperatorLogic

__all__ = [
    "MapLogic",
    "FilterLogic",
    "FlatMapLogic",
    "MapRecordsLogic",
    "FilterRecordsLogic",
    "FlatMapRecordsLogic",
    "IdentityLogic",
]


class _BatchFunction(OperatorLogic):
    """A logic around a batch-level user function, with optional parameters."""

    def __init__(self, fn: Callable[..., Any], params: dict[str, Any] | None = None):
        self.fn = fn
        self.params = None if params is None else dict(params)

    def call(self, batch: pa.RecordBatch) -> Any:
        return self.fn(batch) if self.params is None else self.fn(batch, self.params)


class MapLogic(_BatchFunction):
    """``fn(batch) -> RecordBatch | Table | rows``; empty input batches are skipped."""

    def __init__(self, fn: Callable[..., Any], schema: pa.Schema | None = None,
                 params: dict[str, Any] | None = None):
        super().__init__(fn, params)
        self.schema = schema

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        return to_batches(self.call(batch), self.schema)


class FilterLogic(_BatchFunction):
    """``fn(batch) -> mask`` (a boolean Arrow array, NumPy array or list); keeps rows where true."""

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        mask = self.call(batch)
        if isinstance(mask, pa.ChunkedArray):
            mask = mask.combine_chunks()
        if not isinstance(mask, pa.Array):
            values = np.asarray(mask)
            if values.dtype != bool:
                raise TypeError(f"filter function {_name(self.fn)} returned a mask of {values.dtype} values; "
                                "expected booleans (e.g. pc.greater(batch['x'], 0), or a NumPy bool array)")
            mask = pa.array(values)
        if not pa.types.is_boolean(mask.type):
            raise TypeError(f"filter function {_name(self.fn)} returned a mask of type {mask.type}; expected "
                            "booleans (e.g. pc.greater(batch['x'], 0) or pc.equal(...))")
        if len(mask) != batch.num_rows:
            raise ValueError(
                f"filter function returned a mask of length {len(mask)} for a batch of {batch.num_rows} rows"
            )
        out = batch.filter(mask)
        return (out,) if out.num_rows else ()


class FlatMapLogic(_BatchFunction):
    """``fn(batch) -> iterable of RecordBatch / Table`` (or one of them, or None)."""

    def __init__(self, fn: Callable[..., Any], schema: pa.Schema | None = None,
                 params: dict[str, Any] | None = None):
        super().__init__(fn, params)
        self.schema = schema

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        return [b for b in to_batches(self.call(batch), self.schema) if b.num_rows]


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _rows_to_batches(rows: list[dict], schema: pa.Schema | None) -> Sequence[pa.RecordBatch]:
    if not rows:
        return ()
    return (pa.RecordBatch.from_pylist(rows, schema=schema),)


class MapRecordsLogic(OperatorLogic):
    """Slow path: ``fn(row: dict) -> dict`` per record."""

    def __init__(self, fn: Callable[[dict], dict], schema: pa.Schema | None = None):
        self.fn = fn
        self.schema = schema

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        rows = [self.fn(row) for row in batch.to_pylist()]
        for row in rows:
            if not isinstance(row, dict):
                raise TypeError(f"map_records function {_name(self.fn)} returned {type(row).__name__} "
                                f"{_short(row)}; expected a dict (one output record: {{'column': value, ...}})")
        return _rows_to_batches(rows, self.schema)


class FilterRecordsLogic(OperatorLogic):
    """Slow path: ``fn(row: dict) -> bool`` per record."""

    def __init__(self, fn: Callable[[dict], bool]):
        self.fn = fn

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        mask = pa.array([bool(self.fn(row)) for row in batch.to_pylist()], type=pa.bool_())
        out = batch.filter(mask)
        return (out,) if out.num_rows else ()


class FlatMapRecordsLogic(OperatorLogic):
    """Slow path: ``fn(row: dict) -> iterable of dicts`` per record."""

    def __init__(self, fn: Callable[[dict], Iterable[dict]], schema: pa.Schema | None = None):
        self.fn = fn
        self.schema = schema

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        rows: list[dict] = []
        for row in batch.to_pylist():
            out = self.fn(row)
            if out is not None:
                rows.extend(out)
        return _rows_to_batches(rows, self.schema)


class IdentityLogic(OperatorLogic):
    """Passes batches through unchanged (``union`` and explicit repartitioning)."""

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        return (batch,) if batch.num_rows else ()
