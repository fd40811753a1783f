"""processbatch.py: keyed ``process_batch``: one call per batch with every key's rows and state at once.

``key_by(k).process_batch(fn)`` runs :class:`ProcessBatchLogic`: the batch is grouped by key once
(:func:`~operators.keygroups.group_by_key`) and ``fn`` gets a :class:`KeyedBatch`, every key of the batch
with its rows and its state, so it can work across keys with NumPy or pyarrow (``np.add.reduceat`` over
``offsets``, a vectorised update of the states) where ``process`` calls Python once per key. The state is
``process``'s: one value per key, in bins (checkpointed, moved by a rescale, any picklable object).

Example:
    >>> import numpy as np
    >>> def count(batch):
    ...     seen = np.diff(batch.offsets)
    ...     batch.states = [(s or 0) + int(n) for s, n in zip(batch.states, seen)]
    ...     return pa.record_batch({"k": batch.keys, "seen": batch.states})
    >>> logic = ProcessBatchLogic("k", count, 8)
    >>> logic.process(pa.record_batch({"k": ["a", "b", "a"]}), 0)[0].to_pylist()
    [{'k': 'a', 'seen': 2}, {'k': 'b', 'seen': 1}]
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from .keyed import ProcessLogic, _fn_name
from .keygroups import group_by_key

__all__ = ["KeyedBatch", "ProcessBatchLogic"]


@dataclasses.dataclass(slots=True)
class KeyedBatch:
    """What a ``process_batch`` function gets: a batch's keys, their rows and their states.

    Valid only during the call it was handed to.

    Attributes:
        keys: the batch's distinct keys (Python values), in order of first appearance.
        rows: the batch's rows key by key, in the order of ``keys``, in arrival order within a key.
        offsets: ``len(keys) + 1`` row offsets (``int64``): key ``i``'s rows are ``rows[offsets[i]:offsets[i + 1]]``.
        states: per key, its state (``None`` if it has none). Change it in place (``states[i] = x``) or
            assign a new list of ``len(keys)`` values; a ``None`` forgets that key's state. What it holds when
            the call returns is stored.
    """

    keys: list[Any]
    rows: pa.RecordBatch
    offsets: np.ndarray
    states: list[Any]

    def __len__(self) -> int:
        return len(self.keys)

    def rows_of(self, i: int) -> pa.RecordBatch:
        """Key ``i``'s rows (a zero-copy slice of ``rows``)."""
        start = int(self.offsets[i])
        return self.rows.slice(start, int(self.offsets[i + 1]) - start)


class ProcessBatchLogic(ProcessLogic):
    """Keyed process over whole batches: ``fn(batch: KeyedBatch)`` once per input batch (see the module).

    ``fn`` returns what a ``process`` function may (``None``, a RecordBatch or Table, a list of row dicts);
    the output schema is the declared one (results are cast to it), else the first output's, as for
    ``process``. A batch changes the state wholly or not at all: if ``fn`` raises, no state is written.
    """

    def __init__(self, key: str, fn: Callable[[KeyedBatch], Any], num_bins: int,
                 output_schema: pa.Schema | None = None) -> None:
        super().__init__(key, fn, num_bins, output_schema)

    def process(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        column = self._key_column(batch)
        if batch.num_rows == 0:
            return []
        groups = group_by_key(batch, column, self.num_bins)
        keyed = KeyedBatch(groups.keys, groups.rows, groups.offsets,
                           self._state.get_many(groups.keys, groups.bins.tolist()))
        result = self.fn(keyed)
        states = keyed.states
        if not isinstance(states, list) or len(states) != len(groups.keys):
            got = f"{len(states)} values" if isinstance(states, list) else type(states).__name__
            raise TypeError(f"process_batch function {_fn_name(self.fn)} left batch.states as {got}; expected a "
                            f"list of {len(groups.keys)} values, one per key of batch.keys (None: no state)")
        self._state.write_many(groups.keys, groups.bins, states)
        return self._outputs([] if result is None else [result])
