"""router.py: splits an instance's output batches over the channels of one output edge.

``forward`` (1:1), ``rebalance`` (round robin, per batch) and ``hash`` (by the
stable hash of a key column through a bin -> instance table). Rescale and
migration only ever replace a hash router's table.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from chiray.operators.errors import ChirayError
from chiray.operators.graph import InputEdge, Partition
from chiray.operators.hashing import bins_of

__all__ = ["Router", "ForwardRouter", "RebalanceRouter", "HashRouter", "make_router", "KeyColumnError"]


class KeyColumnError(ChirayError, KeyError):
    """A batch reaching a hash edge lacks the key column."""

    def __str__(self) -> str:
        return str(self.args[0])


class Router:
    """Maps a batch to ``[(target position, batch), ...]`` over ``num_targets`` channels."""

    num_targets: int
    port: str | None = None  # the upstream output this edge carries (None: the main one)

    def route(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        raise NotImplementedError


class ForwardRouter(Router):
    num_targets = 1

    def route(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        return [(0, batch)]


class RebalanceRouter(Router):
    def __init__(self, num_targets: int, start: int = 0):
        self.num_targets = num_targets
        self._next = start % num_targets

    def route(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        target = self._next
        self._next = (self._next + 1) % self.num_targets
        return [(target, batch)]


class HashRouter(Router):
    """Routes each row by ``table[bins_of(batch[key], num_bins)]``.

    Args:
        key: the key column.
        table: bin -> target position (length = number of bins, a power of two).
        operator: the downstream operator's name, for messages.
    """

    def __init__(self, key: str, table: Sequence[int], operator: str = ""):
        self.key = key
        self.table = np.asarray(table, dtype=np.int64)
        self.num_bins = len(self.table)
        self.num_targets = int(self.table.max()) + 1 if len(self.table) else 1
        self.operator = operator
        self.bin_counts = np.zeros(self.num_bins, dtype=np.int64)  # records routed per bin (load)

    def set_table(self, table: Sequence[int], num_targets: int) -> None:
        """Replace the routing table (rescale / migration)."""
        self.table = np.asarray(table, dtype=np.int64)
        self.num_targets = num_targets

    def route(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        try:
            keys = batch.column(self.key)
        except KeyError:
            raise KeyColumnError(
                f"operator {self.operator!r}: key column {self.key!r} is missing from its input; "
                f"the batch has columns {batch.schema.names}"
            ) from None
        bins = bins_of(keys, self.num_bins)
        self.bin_counts += np.bincount(bins, minlength=self.num_bins)
        dest = self.table[bins]
        if len(dest) == 0:
            return []
        first = dest[0]
        if (dest == first).all():
            return [(int(first), batch)]
        out: list[tuple[int, pa.RecordBatch]] = []
        for target in range(self.num_targets):
            rows = np.flatnonzero(dest == target)
            if len(rows):
                out.append((target, batch.take(rows)))
        return out


def make_router(edge: InputEdge, num_targets: int, table: Sequence[int] | None, operator: str,
                index: int = 0) -> Router:
    """The router for one output edge of an upstream instance ``index``."""
    router: Router
    if edge.partition is Partition.FORWARD:
        router = ForwardRouter()
    elif edge.partition is Partition.REBALANCE:
        router = RebalanceRouter(num_targets, start=index)
    else:
        assert table is not None and edge.key is not None, "bug in make_router: hash edge without table"
        router = HashRouter(edge.key, table, operator)
    router.port = edge.port
    return router
