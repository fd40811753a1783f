"""aggregates.py: the built-in aggregate functions: their specs, output types, accumulators and results.

An aggregation is a list of :class:`AggSpec`. Each aggregate is computed from
a few shared :class:`~operators.accumulators.Accumulator` columns per key (row and
non-null counts, sums, extremes), which :class:`~operators.keyed.AggregateLogic`
keeps in a :class:`~operators.columnarstate.ColumnarAggState`; the output column is
derived from them when results are emitted.

Null semantics are SQL's: sum, min, max and mean skip null values and give
null for a key with no non-null value; ``count`` is never null. NaN is a
value (it propagates), not a null.

Example:
    >>> schema = pa.schema([("k", pa.string()), ("v", pa.int32())])
    >>> aggregate_output_schema(schema, "k", [AggSpec("n", "count"), AggSpec("m", "mean", "v")]).types
    [DataType(string), DataType(int64), DataType(double)]
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Sequence, TypeAlias, get_args

import numpy as np
import pyarrow as pa

from .accumulators import Accumulator, object_array

__all__ = [
    "AGG_FUNCS",
    "AggregateFunction",
    "Aggregate",
    "AggSpec",
    "Recipe",
    "aggregate_output_schema",
    "batch_partials",
    "result_column",
    "state_columns",
]

ArgFunction: TypeAlias = Literal["arg_min", "arg_max"]
"""The aggregates that give a value from the row where another column is least / greatest."""

AggregateFunction: TypeAlias = Literal["count", "sum", "min", "max", "mean", "first", "last", ArgFunction,
                                      "count_distinct"]
"""The name of a built-in aggregate function (``agg(total=("v", "sum"))``)."""

Aggregate: TypeAlias = (
    tuple[None, Literal["count"]] | tuple[str, AggregateFunction] | tuple[str, ArgFunction, str | None])
"""One aggregate of ``agg(**aggregates)``, as its output column's value:

* ``(column, function)``: ``("price", "sum")``; ``(None, "count")`` counts rows;
* ``(column, "arg_min" | "arg_max", give)``: ``("price", "arg_max", "bidder")`` gives column ``give``
  from the row where ``column`` is greatest (``give=None``: that whole row, as a struct, as
  ``(column, "arg_max")`` does).
"""

AGG_FUNCS: tuple[str, ...] = get_args(AggregateFunction)
"""The built-in aggregate functions."""

ARG_FUNCS: tuple[str, ...] = get_args(ArgFunction)
"""Aggregates that give a value from the row where another column is least / greatest."""


@dataclasses.dataclass(frozen=True, slots=True)
class AggSpec:
    """One output column of an aggregation.

    Attributes:
        name: the output column's name.
        func: one of :data:`AGG_FUNCS`.
        column: the input column; ``None`` only for ``count`` (count rows);
            ``count`` of a column counts its non-null values.
        of: ``arg_min`` / ``arg_max`` only: the column whose value they give
            from the row where ``column`` is least / greatest; ``None`` gives
            that whole row, as a struct.
    """

    name: str
    func: str
    column: str | None = None
    of: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"aggregate name must be a non-empty string, got {self.name!r}")
        if self.func not in AGG_FUNCS:
            raise ValueError(f"aggregate {self.name!r}: func must be one of {AGG_FUNCS}, got {self.func!r}")
        if self.column is None and self.func != "count":
            raise ValueError(f"aggregate {self.name!r}: {self.func} needs a column (only count may have none)")
        if self.of is not None and self.func not in ARG_FUNCS:
            raise ValueError(f"aggregate {self.name!r}: only arg_min and arg_max take a third item "
                             f"(the column to give), {self.func} does not")


def aggregate_output_schema(input_schema: pa.Schema, key: str, aggs: Sequence[AggSpec]) -> pa.Schema:
    """The schema an aggregation emits: the key, then one column per aggregate.

    count -> int64; sum of integers -> int64, of floats -> float64; min / max
    -> the input type; mean -> float64. sum and mean take integer, floating or decimal
    columns; min and max also take booleans and temporal types (not strings).

    Raises:
        ValueError: a column is missing, or an output name is repeated.
        TypeError: a column's type does not suit its aggregate.
    """
    names = input_schema.names
    if key not in names:
        raise ValueError(f"key column {key!r} is not in the input columns {names}")
    key_field = input_schema.field(key)
    out = [pa.field(key, key_field.type, key_field.nullable)]  # without the input's field metadata
    seen = {key}
    for agg in aggs:
        if agg.name in seen:
            raise ValueError(f"aggregate output name {agg.name!r} is used twice (the key is {key!r})")
        seen.add(agg.name)
        for column in (agg.column, agg.of):
            if column is not None and column not in names:
                raise ValueError(f"aggregate {agg.name!r}: column {column!r} is not in the input columns {names}")
        value_type = None if agg.column is None else input_schema.field(agg.column).type
        scale = value_type.scale if value_type is not None and pa.types.is_decimal(value_type) else None
        out.append(pa.field(agg.name, _output_type(agg, value_type, input_schema),
                            metadata={DECIMAL_SCALE: str(scale)} if agg.func == "mean" and scale else None))
    return pa.schema(out)


def _output_type(agg: AggSpec, t: pa.DataType | None, schema: pa.Schema) -> pa.DataType:
    if agg.func in ("count", "count_distinct"):
        if agg.func == "count_distinct" and t is not None and pa.types.is_nested(t):
            raise TypeError(f"aggregate {agg.name!r}: count_distinct needs a column of scalar values; "
                            f"column {agg.column!r} has type {t}")
        return pa.int64()
    assert t is not None
    if agg.func in ("first", "last"):
        return t
    if pa.types.is_decimal(t) and (not pa.types.is_decimal128(t) or t.precision > MAX_DECIMAL_PRECISION):
        raise TypeError(
            f"aggregate {agg.name!r}: column {agg.column!r} has type {t}; {agg.func} takes decimal128 up to "
            f"precision {MAX_DECIMAL_PRECISION} (kept exactly as 64-bit unscaled integers): cast it to "
            f"decimal128({MAX_DECIMAL_PRECISION}, {t.scale}) or to float64 first")
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
    if agg.func in ("sum", "mean"):
        if not numeric:
            raise TypeError(
                f"aggregate {agg.name!r}: {agg.func} needs an integer, floating or decimal column; "
                f"column {agg.column!r} has type {t}"
            )
        if agg.func == "sum" and pa.types.is_decimal(t):
            return pa.decimal128(38, t.scale)
        return pa.int64() if agg.func == "sum" and pa.types.is_integer(t) else pa.float64()
    if not (numeric or pa.types.is_boolean(t) or _is_temporal(t)):
        raise TypeError(
            f"aggregate {agg.name!r}: {agg.func} needs a numeric, boolean or temporal column "
            f"(strings are not supported); column {agg.column!r} has type {t}"
        )
    if agg.func in ARG_FUNCS:
        return _row_type(schema) if agg.of is None else schema.field(agg.of).type
    return t


def _row_type(schema: pa.Schema) -> pa.DataType:
    """The type of a whole input row (``arg_min`` / ``arg_max`` without a column to give)."""
    return pa.struct([pa.field(f.name, f.type, f.nullable) for f in schema])


def _is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_temporal(t) and t.bit_width in (32, 64)


def _state_dtype(t: pa.DataType) -> str:
    """The NumPy dtype that holds sums or extremes of a column of type ``t``."""
    if pa.types.is_floating(t):
        return "float64"
    return "uint64" if pa.types.is_uint64(t) else "int64"


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """How one accumulator's batch partial is computed: ``kind`` over ``column`` (``of``: the
    column an ``argmin`` / ``argmax`` gives, ``None`` for the whole row)."""

    kind: str
    column: str | None = None
    of: str | None = None


def state_columns(input_schema: pa.Schema, aggs: Sequence[AggSpec]) -> dict[str, tuple[Accumulator, Recipe]]:
    """The state columns the aggregates need (shared where two aggregates need the same), each
    with how a batch's partial for it is computed."""
    accs: dict[str, tuple[Accumulator, Recipe]] = {}

    def need(acc: Accumulator, recipe: Recipe) -> None:
        accs.setdefault(acc.name, (acc, recipe))

    for agg in aggs:
        if agg.column is None:
            need(Accumulator("rows", "sum", "int64"), Recipe("rows"))
            continue
        column, t = agg.column, input_schema.field(agg.column).type
        count = f"nn:{column}"
        need(Accumulator(count, "sum", "int64"), Recipe("nn", column))
        if agg.func in ("sum", "mean"):
            dtype = "float64" if pa.types.is_floating(t) else "int64"
            need(Accumulator(f"sum:{column}", "sum", dtype), Recipe("sum", column))
        elif agg.func in ("min", "max") or agg.func in ARG_FUNCS:
            op = "min" if agg.func in ("min", "arg_min") else "max"
            need(Accumulator(f"{op}:{column}", op, _state_dtype(t)), Recipe(op, column))
            if agg.func in ARG_FUNCS:
                given = _row_type(input_schema) if agg.of is None else input_schema.field(agg.of).type
                need(Accumulator(_acc_name(agg), "arg" + op, "object", given, count, f"{op}:{column}"),
                     Recipe("arg" + op, column, agg.of))
        elif agg.func in ("first", "last"):
            need(Accumulator(_acc_name(agg), agg.func, "object", t, count), Recipe(agg.func, column))
        elif agg.func == "count_distinct":
            need(Accumulator(_acc_name(agg), "union", "object", pa.list_(t)), Recipe("distinct", column))
    return accs


def _acc_name(agg: AggSpec) -> str:
    """The accumulator an object-valued aggregate reads."""
    if agg.func in ARG_FUNCS:
        return f"{agg.func.replace('_', '')}:{json.dumps([agg.column, agg.of])}"
    if agg.func == "count_distinct":
        return f"distinct:{agg.column}"
    return f"{agg.func}:{agg.column}"


def batch_partials(batch: pa.RecordBatch, codes: np.ndarray, n: int,
              accs: Sequence[tuple[Accumulator, Recipe]]) -> dict[str, np.ndarray]:
    """Per accumulator, the partial of each of the ``n`` keys of ``batch`` (``codes``: the key of each row)."""
    rows = np.bincount(codes, minlength=n)
    valid: dict[str, np.ndarray | None] = {}
    ranks: dict[str, np.ndarray] = {}
    partials = {}
    for acc, recipe in accs:
        if recipe.kind == "rows":
            partials[acc.name] = rows
            continue
        assert recipe.column is not None
        arr = batch.column(recipe.column)
        if recipe.column not in valid:
            valid[recipe.column] = ~arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
        ok = valid[recipe.column]
        kind = recipe.kind
        if kind == "nn":
            partials[acc.name] = rows if ok is None else np.bincount(codes[ok], minlength=n)
        elif kind == "distinct":
            partials[acc.name] = _distinct(arr, codes, n, ok)
        elif acc.dtype == "object":
            rank = None
            if kind in ("argmin", "argmax"):
                assert acc.rank is not None
                rank_acc = next(a for a, _ in accs if a.name == acc.rank)
                rank = ranks.get(acc.rank)
                if rank is None:
                    rank = ranks[acc.rank] = _values(arr, rank_acc.dtype, ok, rank_acc.identity())
            source = arr if kind in ("first", "last") else (
                batch.to_struct_array() if recipe.of is None else batch.column(recipe.of))
            partials[acc.name] = _take_objects(source, _pick_rows(kind, codes, n, ok, rank))
        else:
            values = _values(arr, acc.dtype, ok, acc.identity())
            ranks[acc.name] = values
            if kind == "sum" and acc.dtype == "float64":
                partials[acc.name] = np.bincount(codes, weights=values, minlength=n)
                continue
            out = np.full(n, acc.identity(), dtype=acc.dtype)
            {"sum": np.add, "min": np.minimum, "max": np.maximum}[kind].at(out, codes, values)
            partials[acc.name] = out
    return partials


def _pick_rows(kind: str, codes: np.ndarray, n: int, ok: np.ndarray | None,
               rank: np.ndarray | None) -> np.ndarray:
    """Per key, the row a pick aggregate takes from this batch (``-1``: none). Only rows with a
    value count; ``argmin`` / ``argmax`` take the earliest of the rows that tie."""
    rows = np.arange(len(codes)) if ok is None else np.flatnonzero(ok)
    keys = codes[rows]
    out = np.full(n, -1, dtype=np.int64)
    if kind in ("first", "last"):
        if kind == "last":
            rows, keys = rows[::-1], keys[::-1]
        found, index = np.unique(keys, return_index=True)
        out[found] = rows[index]
        return out
    assert rank is not None
    if kind == "argmin":
        order = np.lexsort((rows, rank[rows], keys))  # by key, then value, then row
        keys_sorted = keys[order]
        heads = np.flatnonzero(np.r_[True, keys_sorted[1:] != keys_sorted[:-1]])
    else:
        order = np.lexsort((-rows, rank[rows], keys))  # the last of a key's run: its greatest, earliest row
        keys_sorted = keys[order]
        heads = np.flatnonzero(np.r_[keys_sorted[1:] != keys_sorted[:-1], True])
    out[keys_sorted[heads]] = rows[order[heads]]
    return out


def _take_objects(source: pa.Array | pa.ChunkedArray, picked: np.ndarray) -> np.ndarray:
    """Per key, the value of ``source`` at its picked row as a Python object (``None`` where none)."""
    out = np.full(len(picked), None, dtype=object)
    where = np.flatnonzero(picked >= 0)
    if where.size:
        out[where] = object_array(source.take(pa.array(picked[where])).to_pylist())
    return out


def _distinct(arr: pa.Array, codes: np.ndarray, n: int, ok: np.ndarray | None) -> np.ndarray:
    """Per key, the frozenset of its distinct non-null values in this batch (``None`` where none)."""
    table = pa.table({"key": codes, "value": arr})
    if ok is not None:
        table = table.filter(pa.array(ok))
    grouped = table.group_by("key", use_threads=False).aggregate([("value", "distinct")])
    out = np.full(n, None, dtype=object)
    for key, values in zip(grouped.column("key").to_numpy(), grouped.column("value_distinct").to_pylist()):
        out[key] = frozenset(values)
    return out


DECIMAL_SCALE = b"chiray.decimal_scale"
"""Output field metadata of a decimal column's mean: the input's scale (its sum is kept unscaled)."""

MAX_DECIMAL_PRECISION = 18
"""Decimals are aggregated exactly as unscaled 64-bit integers: up to 18 digits."""


def _unscaled(arr: pa.Array) -> np.ndarray:
    """A decimal128 column's unscaled values as int64 (the low word of each 128-bit value).

    Raises:
        OverflowError: a value does not fit 64 bits.
    """
    words = np.frombuffer(arr.buffers()[1], dtype="<i8")[2 * arr.offset:2 * (arr.offset + len(arr))]
    low, high = words[0::2], words[1::2]
    fits = high == (low >> 63)
    if arr.null_count:
        fits |= ~arr.is_valid().to_numpy(zero_copy_only=False)
    if not fits.all():
        raise OverflowError(f"a {arr.type} value exceeds {MAX_DECIMAL_PRECISION} digits")
    return low.copy()


def _from_unscaled(unscaled: np.ndarray, t: pa.DataType, mask: np.ndarray | None) -> pa.Array:
    """A decimal128 array of type ``t`` from unscaled int64 values (``mask``: null where true)."""
    n = len(unscaled)
    words = np.empty(2 * n, dtype="<i8")
    words[0::2] = unscaled
    words[1::2] = unscaled >> 63  # sign extension to 128 bits
    validity = None if mask is None else pa.array(~mask).buffers()[1]
    nulls = 0 if mask is None else int(mask.sum())
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(words.tobytes())], null_count=nulls)


def _values(arr: pa.Array, dtype: str, valid: np.ndarray | None, fill: Any) -> np.ndarray:
    """A column as NumPy ``dtype``, nulls replaced by ``fill`` (decimals: their unscaled integers)."""
    t = arr.type
    if pa.types.is_decimal(t):
        values = _unscaled(arr).astype(dtype, copy=False)
        return values if valid is None else np.where(valid, values, fill)
    if pa.types.is_boolean(t):
        arr = arr.cast(pa.int8())
    elif _is_temporal(t):
        arr = arr.view(pa.int32() if t.bit_width == 32 else pa.int64())
    if arr.null_count:
        arr = arr.fill_null(0)
    values = arr.to_numpy().astype(dtype, copy=False)
    return values if valid is None else np.where(valid, values, fill)


def result_column(agg: AggSpec, field: pa.Field | pa.DataType, values: dict[str, np.ndarray]) -> pa.Array:
    """One aggregate's output column from the accumulators at some slots (a decimal mean's output field
    carries its input's scale in its metadata)."""
    scale = int((field.metadata or {}).get(DECIMAL_SCALE, 0)) if isinstance(field, pa.Field) else 0
    t = field.type if isinstance(field, pa.Field) else field
    if agg.func == "count":
        return pa.array(values["rows" if agg.column is None else f"nn:{agg.column}"], pa.int64())
    if agg.func == "count_distinct":
        return pa.array([0 if v is None else len(v) for v in values[_acc_name(agg)]], pa.int64())
    if agg.func in ("first", "last") or agg.func in ARG_FUNCS:
        return pa.array(list(values[_acc_name(agg)]), t)
    nn = values[f"nn:{agg.column}"]
    empty = nn == 0
    mask = empty if empty.any() else None
    if agg.func == "sum":
        if pa.types.is_decimal(t):
            return _from_unscaled(values[f"sum:{agg.column}"], t, mask)
        return pa.array(values[f"sum:{agg.column}"], t, mask=mask)
    if agg.func == "mean":
        sums = values[f"sum:{agg.column}"].astype(np.float64)
        means = np.divide(sums, nn, out=np.zeros(len(nn)), where=~empty)
        if scale:
            means = means / 10.0 ** scale
        return pa.array(means, t, mask=mask)
    extreme = values[f"{agg.func}:{agg.column}"]
    if pa.types.is_decimal(t):
        return _from_unscaled(extreme, t, mask)
    if pa.types.is_boolean(t):
        return pa.array(extreme.astype(bool), mask=mask)
    if _is_temporal(t):
        physical = np.int32 if t.bit_width == 32 else np.int64
        return pa.array(extreme.astype(physical), mask=mask).view(t)
    return pa.array(extreme, mask=mask).cast(t, safe=False)
