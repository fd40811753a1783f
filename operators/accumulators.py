"""accumulators.py: the state columns of a columnar aggregation, and how partials combine into them.

An :class:`Accumulator` names one NumPy column of a
:class:`~operators.columnarstate.ColumnarAggState` (indexed by slot: one
row per key) and the operation that folds a batch's per-key partials into it:
``sum`` / ``min`` / ``max`` for numbers, and for Python values the *pick*
operations (keep one value per key: ``first``, ``last``, ``argmin``,
``argmax``) and ``union`` (a set of distinct values). :func:`combine` applies
a batch to the columns.

Separate from the state so that the aggregate functions
(:mod:`operators.aggregates`), the state and its bin format
(:mod:`operators.statecodec`) share one vocabulary of columns without
importing each other.

Example:
    >>> acc = Accumulator("lo", "min", "int64")
    >>> column = np.array([5, 7]); combine([acc], {"lo": column}, np.array([1]), {"lo": np.array([3])})
    >>> column.tolist(), int(acc.identity()) == np.iinfo(np.int64).max
    ([5, 3], True)
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["Accumulator", "PICK_OPS", "combine", "object_array"]

PICK_OPS = ("first", "last", "argmin", "argmax")
"""Object accumulators that keep one value per key, replaced when a batch's value wins."""


@dataclasses.dataclass(frozen=True, slots=True)
class Accumulator:
    """One NumPy state column of a :class:`~operators.columnarstate.ColumnarAggState`.

    Numeric columns combine partials with ``op`` ``"sum"``, ``"min"`` or
    ``"max"``. Object columns (``dtype="object"``) hold Python values of the
    Arrow type ``value_type``, ``None`` for none:

    * ``"first"`` / ``"last"``: the key's first / latest value. ``count`` names
      the numeric (sum) accumulator counting the key's values; a batch's value
      is taken where it has values, and for ``"first"`` only where the key had none.
    * ``"argmin"`` / ``"argmax"``: the value beside the key's extreme. ``rank``
      names the min / max accumulator; a batch's value is taken where its rank
      is strictly better (ties keep the earlier value) or the key had none.
    * ``"union"``: a frozenset of distinct values (``value_type`` is a list type).

    Pick columns are compared against the state before any column is updated.

    Attributes:
        name: unique within the state.
        op: how partials combine.
        dtype: ``"int64"``, ``"uint64"``, ``"float64"`` or ``"object"``.
        value_type: object columns: the Arrow type of what they hold.
        count: pick columns: the accumulator counting values per key.
        rank: ``"argmin"`` / ``"argmax"``: the accumulator they follow.
    """

    name: str
    op: str
    dtype: str
    value_type: pa.DataType | None = None
    count: str | None = None
    rank: str | None = None

    def __post_init__(self) -> None:
        numeric = self.dtype in ("int64", "uint64", "float64")
        if self.dtype != "object" and not numeric:
            raise ValueError(
                f"accumulator {self.name!r}: dtype must be int64, uint64, float64 or object, got {self.dtype!r}")
        if numeric and self.op not in ("sum", "min", "max"):
            raise ValueError(f"accumulator {self.name!r}: op must be sum, min or max, got {self.op!r}")
        if not numeric:
            if self.op not in PICK_OPS + ("union",):
                raise ValueError(f"accumulator {self.name!r}: an object column's op must be one of "
                                 f"{PICK_OPS + ('union',)}, got {self.op!r}")
            if self.value_type is None:
                raise ValueError(f"accumulator {self.name!r}: an object column needs its value_type")
            if self.op in PICK_OPS and self.count is None:
                raise ValueError(f"accumulator {self.name!r}: {self.op} needs the name of its count accumulator")
            if self.op in ("argmin", "argmax") and self.rank is None:
                raise ValueError(f"accumulator {self.name!r}: {self.op} needs the name of its rank accumulator")

    def identity(self) -> np.generic | None:
        """The neutral value of ``op`` (what a new slot starts with, what null partials use)."""
        if self.dtype == "object":
            return None
        dtype = np.dtype(self.dtype)
        if self.op == "sum":
            return dtype.type(0)
        if dtype.kind == "f":
            return dtype.type(np.inf if self.op == "min" else -np.inf)
        info = np.iinfo(dtype)
        return dtype.type(info.max if self.op == "min" else info.min)

    def spec(self) -> list[str | None]:
        """What a bin's header records (the value type travels as the column's type)."""
        return [self.name, self.op, self.dtype, self.count, self.rank]

    def column_type(self) -> pa.DataType:
        """The Arrow type of this column in a serialised bin."""
        return self.value_type if self.value_type is not None else pa.from_numpy_dtype(np.dtype(self.dtype))

    def to_arrow(self, values: np.ndarray) -> pa.Array:
        """A state column (or part of one) as an Arrow array of :meth:`column_type`."""
        if self.dtype != "object":
            return pa.array(values)
        if self.op == "union":
            return pa.array([None if v is None else list(v) for v in values], self.value_type)
        return pa.array(list(values), self.value_type)

    def from_arrow(self, array: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The inverse of :meth:`to_arrow`."""
        if self.dtype != "object":
            return array.to_numpy()
        values = array.to_pylist()
        if self.op == "union":
            values = [None if v is None else frozenset(v) for v in values]
        return object_array(values)


def object_array(values: Sequence[object]) -> np.ndarray:
    """A 1-d object array of ``values`` as they are (lists, dicts and tuples stay one element each)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def combine(accumulators: Sequence[Accumulator], columns: Mapping[str, np.ndarray], slots: np.ndarray,
            partials: Mapping[str, np.ndarray]) -> None:
    """Fold per-key partials into the state columns at ``slots``, in place, each by its accumulator's op.

    Args:
        accumulators: the columns to update (``columns`` may hold others, left alone).
        columns: per accumulator name, its column indexed by slot.
        slots: distinct slots, one per key of the batch.
        partials: per accumulator name, one value per slot (the identity where a key contributes nothing).
    """
    taken = {acc.name: _taken(acc, columns, slots, partials) for acc in accumulators if acc.op in PICK_OPS}
    for acc in accumulators:
        column, part = columns[acc.name], partials[acc.name]
        if acc.op == "sum":
            column[slots] += part
        elif acc.op == "min":
            column[slots] = np.minimum(column[slots], part)
        elif acc.op == "max":
            column[slots] = np.maximum(column[slots], part)
        elif acc.op == "union":  # new sets, never changed in place: snapshots share them
            for slot, values in zip(slots.tolist(), part):
                if values:
                    old = column[slot]
                    column[slot] = frozenset(values) if old is None else old | values
        else:
            take = taken[acc.name]
            column[slots[take]] = part[take]


def _taken(acc: Accumulator, columns: Mapping[str, np.ndarray], slots: np.ndarray,
           partials: Mapping[str, np.ndarray]) -> np.ndarray:
    """Where a pick column takes the batch's value (decided on the columns before this update)."""
    assert acc.count is not None
    offered = partials[acc.count] > 0
    if acc.op == "last":
        return offered
    empty = columns[acc.count][slots] == 0
    if acc.op == "first":
        return offered & empty
    assert acc.rank is not None
    current, part = columns[acc.rank][slots], partials[acc.rank]
    better = part < current if acc.op == "argmin" else part > current
    return offered & (empty | better)
