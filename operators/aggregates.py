"""aggregates.py: the built-in aggregate functions: their specs, output types, accumulators and results.

An aggregation is a list of :class:`AggSpec`. Each aggregate is computed from
a few shared :class:`~operators.state.Accumulator` columns per key (row and
non-null counts, sums, extremes), which :class:`~operators.keyed.AggregateLogic`
keeps in a :class:`~operators.state.ColumnarAggState`; the output column is
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
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from .state import Accumulator

__all__ = [
    "AGG_FUNCS",
    "AggSpec",
    "aggregate_output_schema",
]

AGG_FUNCS = ("count", "sum", "min", "max", "mean")
"""The built-in aggregate functions."""


@dataclasses.dataclass(frozen=True, slots=True)
class AggSpec:
    """One output column of an aggregation.

    Attributes:
        name: the output column's name.
        func: one of :data:`AGG_FUNCS`.
        column: the input column; ``None`` only for ``count`` (count rows);
            ``count`` of a column counts its non-null values.
    """

    name: str
    func: str
    column: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"aggregate name must be a non-empty string, got {self.name!r}")
        if self.func not in AGG_FUNCS:
            raise ValueError(f"aggregate {self.name!r}: func must be one of {AGG_FUNCS}, got {self.func!r}")
        if self.column is None and self.func != "count":
            raise ValueError(f"aggregate {self.name!r}: {self.func} needs a column (only count may have none)")


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
        if agg.column is not None and agg.column not in names:
            raise ValueError(f"aggregate {agg.name!r}: column {agg.column!r} is not in the input columns {names}")
        value_type = None if agg.column is None else input_schema.field(agg.column).type
        scale = value_type.scale if value_type is not None and pa.types.is_decimal(value_type) else None
        out.append(pa.field(agg.name, _output_type(agg, value_type),
                            metadata={DECIMAL_SCALE: str(scale)} if agg.func == "mean" and scale else None))
    return pa.schema(out)


def _output_type(agg: AggSpec, t: pa.DataType | None) -> pa.DataType:
    if agg.func == "count":
        return pa.int64()
    assert t is not None
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
    return t


def _is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_temporal(t) and t.bit_width in (32, 64)


def _state_dtype(t: pa.DataType) -> str:
    """The NumPy dtype that holds sums or extremes of a column of type ``t``."""
    if pa.types.is_floating(t):
        return "float64"
    return "uint64" if pa.types.is_uint64(t) else "int64"


def _accumulators(input_schema: pa.Schema, aggs: Sequence[AggSpec]) -> list[Accumulator]:
    """The state columns the aggregates need (shared where two aggregates need the same)."""
    accs: dict[str, Accumulator] = {}
    for agg in aggs:
        if agg.column is None:
            accs["rows"] = Accumulator("rows", "sum", "int64")
            continue
        t = input_schema.field(agg.column).type
        accs[f"nn:{agg.column}"] = Accumulator(f"nn:{agg.column}", "sum", "int64")
        if agg.func in ("sum", "mean"):
            dtype = "float64" if pa.types.is_floating(t) else "int64"
            accs[f"sum:{agg.column}"] = Accumulator(f"sum:{agg.column}", "sum", dtype)
        elif agg.func in ("min", "max"):
            name = f"{agg.func}:{agg.column}"
            accs[name] = Accumulator(name, agg.func, _state_dtype(t))
    return list(accs.values())


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


def _finalise(agg: AggSpec, field: pa.Field | pa.DataType, values: dict[str, np.ndarray]) -> pa.Array:
    """One aggregate's output column from the accumulators at some slots (a decimal mean's output field
    carries its input's scale in its metadata)."""
    scale = int((field.metadata or {}).get(DECIMAL_SCALE, 0)) if isinstance(field, pa.Field) else 0
    t = field.type if isinstance(field, pa.Field) else field
    if agg.func == "count":
        return pa.array(values["rows" if agg.column is None else f"nn:{agg.column}"], pa.int64())
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
