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
    "keep_input_types",
    "MapLogic",
    "FilterLogic",
    "FlatMapLogic",
    "MapRecordsLogic",
    "FilterRecordsLogic",
    "FlatMapRecordsLogic",
    "IdentityLogic",
]


class _SteadySchema:
    """The output schema of a function without a declared one: what its first non-empty output had.

    A later batch with other columns or types fails here, naming the function and the column, instead
    of downstream (where the error would name the wrong operator). Two changes that lose nothing are
    absorbed: columns in another order, and a column of all nulls (typed ``null`` when inferred).
    """

    def __init__(self, verb: str, fn: Any) -> None:
        self.verb, self.fn = verb, fn
        self.schema: pa.Schema | None = None

    def check(self, batches: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
        out = []
        for batch in batches:
            if self.schema is None:
                if batch.num_rows:
                    self.schema = batch.schema
            elif not batch.schema.equals(self.schema):
                if batch.num_rows == 0:
                    continue
                batch = self._conform(batch)
            out.append(batch)
        return out

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        first = self.schema
        assert first is not None
        names = batch.schema.names
        missing = [n for n in first.names if n not in names]
        extra = [n for n in names if n not in first.names]
        if missing or extra:
            raise TypeError(
                f"{self.verb} function {_name(self.fn)} changed its output columns between batches: first "
                f"{first.names}, now {names}; every output batch must have the same columns (or declare schema=)")
        for field in first:
            now = batch.schema.field(field.name).type
            if now != field.type and not pa.types.is_null(now):
                raise TypeError(
                    f"{self.verb} function {_name(self.fn)} changed the type of column {field.name!r} between "
                    f"batches: first {field.type}, now {now}; cast it (pc.cast) or declare schema= so every "
                    f"batch has one type")
        return pa.RecordBatch.from_arrays([batch.column(n).cast(first.field(n).type) for n in first.names],
                                          schema=first)


def _same_family(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether a column of type ``a`` may be the same values as one of type ``b`` in another width or unit."""
    kinds = (pa.types.is_timestamp, pa.types.is_integer, pa.types.is_floating, pa.types.is_date,
             lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
             lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t))
    return pa.types.is_null(a) or any(kind(a) and kind(b) for kind in kinds)


def keep_input_types(batch: pa.RecordBatch, out: pa.RecordBatch) -> pa.RecordBatch:
    """``out`` (a map's output for ``batch``) with each column it passes through unchanged in its input's type.

    A function without a declared schema may change a column's type without meaning to: rows rebuilt from
    dicts turn ``timestamp[ms]`` into ``timestamp[us]`` and ``int32`` into ``int64``. Where an output column
    of an input's name holds the same values (row for row) in another type of the same kind, the input's
    column is used, so the types that operators downstream were built for hold. A column whose values
    changed keeps its new type.
    """
    if out.num_rows != batch.num_rows:
        return out
    names = batch.schema.names
    arrays, fields, changed = list(out.columns), list(out.schema), False
    for i, field in enumerate(out.schema):
        if field.name not in names:
            continue
        before = batch.column(field.name)
        if field.type == before.type or not _same_family(field.type, before.type):
            continue
        try:
            same = out.column(i).cast(before.type, safe=True).equals(before)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            same = False
        if same:
            arrays[i], fields[i], changed = before, batch.schema.field(field.name), True
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, out.schema.metadata)) if changed else out


class _Upgradable:
    """What an upgrade (``job.upgrade``) swaps in a stateless logic: its user function and, where it has one, the
    output schema it declares; the first-output schema check starts again with the new function."""

    fn: Any

    def replace_code(self, fn: Callable[..., Any], on_timer: Any = None,
                     schema: pa.Schema | None = None) -> tuple[Any, Any, Any]:
        """Call ``fn`` from the next batch on; returns the code replaced, ``(fn, on_timer, schema)``."""
        old = (self.fn, None, getattr(self, "schema", None))
        self.fn = fn
        steady = getattr(self, "_steady", None)
        if steady is not None:
            self.schema = schema
            self._steady = _SteadySchema(steady.verb, fn)
        return old


class _BatchFunction(_Upgradable, OperatorLogic):
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
        self._steady = _SteadySchema("map", fn)

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        out = to_batches(self.call(batch), self.schema)
        if self.schema is not None:
            return out
        return self._steady.check([keep_input_types(batch, b) for b in out])


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
        self._steady = _SteadySchema("flat_map", fn)

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        out = [b for b in to_batches(self.call(batch), self.schema) if b.num_rows]
        return out if self.schema is not None else self._steady.check(out)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _rows_to_batches(rows: list[dict], schema: pa.Schema | None) -> Sequence[pa.RecordBatch]:
    if not rows:
        return ()
    return (pa.RecordBatch.from_pylist(rows, schema=schema),)


class MapRecordsLogic(_Upgradable, OperatorLogic):
    """Slow path: ``fn(row: dict) -> dict`` per record."""

    def __init__(self, fn: Callable[[dict], dict], schema: pa.Schema | None = None):
        self.fn = fn
        self.schema = schema
        self._steady = _SteadySchema("map_records", fn)

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        rows = [self.fn(row) for row in batch.to_pylist()]
        for row in rows:
            if not isinstance(row, dict):
                raise TypeError(f"map_records function {_name(self.fn)} returned {type(row).__name__} "
                                f"{_short(row)}; expected a dict (one output record: {{'column': value, ...}})")
        out = _rows_to_batches(rows, self.schema)
        if self.schema is not None:
            return out
        return self._steady.check([keep_input_types(batch, b) for b in out])


class FilterRecordsLogic(_Upgradable, OperatorLogic):
    """Slow path: ``fn(row: dict) -> bool`` per record."""

    def __init__(self, fn: Callable[[dict], bool]):
        self.fn = fn

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        if batch.num_rows == 0:
            return ()
        mask = pa.array([bool(self.fn(row)) for row in batch.to_pylist()], type=pa.bool_())
        out = batch.filter(mask)
        return (out,) if out.num_rows else ()


class FlatMapRecordsLogic(_Upgradable, OperatorLogic):
    """Slow path: ``fn(row: dict) -> iterable of dicts`` per record."""

    def __init__(self, fn: Callable[[dict], Iterable[dict]], schema: pa.Schema | None = None):
        self.fn = fn
        self.schema = schema
        self._steady = _SteadySchema("flat_map_records", fn)

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        rows: list[dict] = []
        for row in batch.to_pylist():
            out = self.fn(row)
            if out is not None:
                rows.extend(out)
        batches = _rows_to_batches(rows, self.schema)
        return batches if self.schema is not None else self._steady.check(batches)


class IdentityLogic(OperatorLogic):
    """Passes batches through unchanged (``union`` and explicit repartitioning)."""

    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        return (batch,) if batch.num_rows else ()
