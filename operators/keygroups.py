"""keygroups.py: a batch grouped by key once, vectorised: the distinct keys, their bins and their rows.

What every per-key operator starts from (keyed ``process`` and ``process_batch``, ``reduce``, the joins'
and top-N's per-key panes): the key column is dictionary-encoded, the rows are put in key order with one
stable ``argsort`` and one gather, so each key's rows are a zero-copy slice of :attr:`KeyGroups.rows`.

Example:
    >>> groups = group_by_key(batch := pa.record_batch({"k": ["b", "a", "b"], "v": [1, 2, 3]}), batch["k"], 8)
    >>> groups.keys, groups.offsets.tolist(), groups.rows.column("v").to_pylist()
    (['b', 'a'], [0, 2, 3], [1, 3, 2])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from .hashing import bins_of
from .keyindex import encode_keys

__all__ = ["KeyGroups", "group_by_key"]


@dataclasses.dataclass(frozen=True, slots=True)
class KeyGroups:
    """A batch's rows grouped by key.

    Attributes:
        keys: the distinct keys as Python values, in order of first appearance.
        bins: per key, its bin (``int64``).
        rows: the batch's rows, key by key in the order of ``keys``, in arrival order within a key.
        offsets: ``len(keys) + 1`` row offsets (``int64``): key ``i``'s rows are
            ``rows.slice(offsets[i], offsets[i + 1] - offsets[i])``.
    """

    keys: list[Any]
    bins: np.ndarray
    rows: pa.RecordBatch
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def slices(self) -> Iterator[tuple[Any, int, pa.RecordBatch]]:
        """``(key, bin, rows)`` per key, in the order of :attr:`keys`."""
        rows, offsets = self.rows, self.offsets.tolist()
        for i, (key, b) in enumerate(zip(self.keys, self.bins.tolist())):
            yield key, b, rows.slice(offsets[i], offsets[i + 1] - offsets[i])


def group_by_key(batch: pa.RecordBatch, column: pa.Array, num_bins: int) -> KeyGroups:
    """Group ``batch`` by ``column``, its key column (null one key, NaNs one key:
    :func:`~operators.keyindex.encode_keys`)."""
    uniques, codes = encode_keys(column)
    offsets = np.zeros(len(uniques) + 1, dtype=np.int64)
    np.cumsum(np.bincount(codes, minlength=len(uniques)), out=offsets[1:])
    if len(uniques) == batch.num_rows or _sorted(codes):
        rows = batch  # already key by key: nothing to gather
    else:
        rows = batch.take(np.argsort(codes, kind="stable"))
    return KeyGroups(uniques.to_pylist(), bins_of(uniques, num_bins), rows, offsets)


def _sorted(codes: np.ndarray) -> bool:
    return len(codes) < 2 or bool((codes[1:] >= codes[:-1]).all())
