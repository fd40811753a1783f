"""batch.py: small helpers over ``pyarrow.RecordBatch`` shared by operators."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import pyarrow as pa

__all__ = ["empty_batch", "to_batches", "batch_nbytes", "compacted", "concat_batches", "merge_runs"]


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A batch with ``schema`` and no rows."""
    return pa.RecordBatch.from_pylist([], schema=schema)


def batch_nbytes(batch: pa.RecordBatch) -> int:
    """Bytes a batch occupies in its buffers (what credits and bounds count)."""
    return int(batch.nbytes)


# A slice whose buffers hold this much more than the slice itself is copied before it is pickled.
_SLACK_BYTES = 1 << 20


def compacted(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch``, or a copy of it that holds only its own rows when it is a slice of much larger buffers.

    Pickling an Arrow slice (what Ray does to everything a call carries) writes the whole buffers it
    views, not only its rows: the 64K-row batches of a 1M-row table each travel as the whole table.
    A batch that leaves its process goes through this first; one that holds at most twice its rows'
    bytes (or 1 MiB more) is returned as it is, so the common case costs two size sums.
    """
    held = batch.get_total_buffer_size()
    own = batch.nbytes
    if held <= 2 * own or held - own <= _SLACK_BYTES:
        return batch
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


def to_batches(value: Any, schema: pa.Schema | None = None) -> list[pa.RecordBatch]:
    """Normalise what a user function returned into a list of RecordBatches.

    Accepts ``None``, a RecordBatch, a Table, a pandas DataFrame (its index
    dropped), a list of dicts (rows) or an iterable of RecordBatches / Tables.

    Raises:
        TypeError: for anything else, naming the type received.
    """
    if value is None:
        return []
    if isinstance(value, pa.RecordBatch):
        return [value]
    if isinstance(value, pa.Table):
        return value.to_batches()
    if type(value).__name__ == "DataFrame" and hasattr(value, "to_dict"):  # pandas, without importing it
        return pa.Table.from_pandas(value, schema=schema, preserve_index=False).to_batches()
    if isinstance(value, dict):
        raise TypeError("expected a RecordBatch, a Table, or a list of rows; got a dict")
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], dict):
        return [pa.RecordBatch.from_pylist(list(value), schema=schema)]
    if isinstance(value, (list, tuple)) and not value:
        return []
    if isinstance(value, Iterable):
        out: list[pa.RecordBatch] = []
        for item in value:
            if isinstance(item, pa.RecordBatch):
                out.append(item)
            elif isinstance(item, pa.Table):
                out.extend(item.to_batches())
            else:
                raise TypeError(
                    f"expected a RecordBatch, a Table, a pandas DataFrame, a list of rows (dicts) or an iterable "
                    f"of RecordBatches / Tables; got {type(value).__name__} with an item of type "
                    f"{type(item).__name__}")
        return out
    raise TypeError(f"expected a RecordBatch, a Table, or a list of rows; got {type(value).__name__}")


def concat_batches(batches: Sequence[pa.RecordBatch], schema: pa.Schema | None = None) -> pa.Table:
    """Concatenate batches into a Table (an empty table if there are none and a schema is given)."""
    if not batches:
        if schema is None:
            return pa.table({})
        return schema.empty_table()
    return pa.Table.from_batches(list(batches))


def merge_runs(outputs: Sequence[Any]) -> list[Any]:
    """Consecutive batches of one schema merged into one (anything else, e.g. a side output, kept in place).

    A function called once per key (or per timer) returns a few rows each time; sent as they come, each
    would cost a channel message. Order is kept.
    """
    out: list[Any] = []
    run: list[pa.RecordBatch] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.extend(pa.Table.from_batches(run).combine_chunks().to_batches())
        run.clear()

    for item in outputs:
        if isinstance(item, pa.RecordBatch):
            if run and not item.schema.equals(run[0].schema):
                flush()
            run.append(item)
        else:
            flush()
            out.append(item)
    flush()
    return out
