"""sources.py: the built-in replayable sources (items, Arrow, Parquet; re-exports the generator).

Every source here is a :class:`logic.Source`: ``splits()`` runs on the driver,
the source object is cloudpickled into the host actors, and ``open_split``
runs there. No source holds an open file before ``open_split``.

Offsets, per source (each counts what the reader has already emitted):

- ``from_items`` / ``from_arrow``: rows of the split;
- ``from_parquet``: batches of the row group;
- ``from_csv`` / ``from_json`` (``textsources``): the byte position of the next line;
- ``generate``: batches of the split.

Example:
    >>> src = from_items([{"x": 1}, {"x": 2}, {"x": 3}], batch_size=2)
    >>> reader = src.open_split(src.splits()[0])
    >>> reader.read().num_rows, reader.offset()
    (2, 2)
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chiray.operators.fspaths import list_files, resolve_all
from chiray.operators.generator import GenerateSource, generate
from chiray.operators.logic import Source, SourceSplit, SplitReader
from chiray.operators.validation import _require

__all__ = [
    "from_items",
    "from_arrow",
    "from_parquet",
    "generate",
    "ArrowSource",
    "ParquetSource",
    "GenerateSource",
]


DEFAULT_BATCH_ROWS = 65_536
"""``from_arrow``'s rows per batch unless told otherwise."""


def _row_ranges(total: int, num_splits: int) -> list[tuple[int, int]]:
    """``num_splits`` contiguous ``[start, stop)`` row ranges covering ``range(total)`` evenly."""
    bounds = [total * i // num_splits for i in range(num_splits + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


# --------------------------------------------------------------------------- in-memory


class _RowRangeReader(SplitReader):
    """Reads rows ``[start, stop)`` of an in-memory list of batches; offset = rows emitted."""

    def __init__(self, source: ArrowSource, span: tuple[int, int], offset: int) -> None:
        self._batches = source._batches
        self._starts = source._starts  # starts[i] = global row of batches[i][0]; starts[-1] = total
        self._start, self._stop = span
        self._batch_size = source._batch_size
        self._emitted = offset

    def _piece(self, row: int, limit: int) -> pa.RecordBatch:
        """The longest zero-copy slice of one input batch starting at global ``row``."""
        i = bisect.bisect_right(self._starts, row) - 1  # the last batch starting at or before row: non-empty
        end = min(self._starts[i + 1], limit)
        return self._batches[i].slice(row - self._starts[i], end - row)

    def read(self) -> pa.RecordBatch | None:
        row = self._start + self._emitted
        if row >= self._stop:
            return None
        if self._batch_size is None:
            out = self._piece(row, self._stop)
        else:
            limit = min(self._stop, row + self._batch_size)
            pieces = []
            while row < limit:
                pieces.append(self._piece(row, limit))
                row += pieces[-1].num_rows
            out = pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)
        self._emitted += out.num_rows
        return out

    def offset(self) -> int:
        return self._emitted


class ArrowSource(Source):
    """In-memory Arrow batches; a split is a contiguous row range, its offset a row count.

    The batches travel with the (pickled) source object, so this is meant for
    data that fits comfortably in every source host's memory.
    """

    def __init__(
        self,
        batches: Sequence[pa.RecordBatch],
        schema: pa.Schema,
        spans: Sequence[tuple[int, int]],
        batch_size: int | None,
        name: str,
        per_instance: bool = False,
    ) -> None:
        self._batches = list(batches)
        self._schema = schema
        self._spans = list(spans)
        self._batch_size = batch_size
        self._name = name
        self._per_instance = per_instance
        self._starts = list(itertools.accumulate((b.num_rows for b in self._batches), initial=0))

    def for_parallelism(self, parallelism: int) -> "ArrowSource":
        """Cut into one contiguous row range per instance (when no ``num_splits`` was given)."""
        if not self._per_instance:
            return self
        return ArrowSource(self._batches, self._schema, _row_ranges(self._starts[-1], parallelism),
                           self._batch_size, self._name)

    def schema(self) -> pa.Schema:
        return self._schema

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit(f"{self._name}-{i}", span) for i, span in enumerate(self._spans)]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        start, stop = split.payload
        offset = 0 if offset is None else int(offset)
        if not 0 <= offset <= stop - start:
            raise ValueError(
                f"{self.describe()}: offset for split {split.split_id!r} must be in [0, {stop - start}], got {offset}"
            )
        return _RowRangeReader(self, (start, stop), offset)

    def bounded(self) -> bool:
        return True

    def describe(self) -> str:
        return self._name


def from_items(
    items: Iterable[dict],
    *,
    schema: pa.Schema | None = None,
    batch_size: int = 10_000,
    num_splits: int = 1,
) -> Source:
    """A source over Python rows (dicts), split into contiguous row ranges.

    Args:
        items: the rows; materialised into Arrow once, on the driver.
        schema: the rows' schema; inferred from the rows when ``None``.
        batch_size: rows per emitted batch.
        num_splits: number of contiguous row ranges (splits).

    Returns:
        A source whose split offsets count rows already emitted.

    Raises:
        ValueError: ``batch_size`` or ``num_splits`` is not positive.

    Example:
        >>> from_items([{"k": "a", "v": 1}], num_splits=1).schema()
        k: string
        v: int64
    """
    _require("from_items: batch_size", batch_size)
    _require("from_items: num_splits", num_splits)
    if isinstance(items, dict):
        raise TypeError("from_items: expected an iterable of dicts (rows), got a dict")
    rows = list(items)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"from_items: row {i} is a {type(row).__name__} ({row!r:.60}); expected dicts")
    # every field of every row (pa.Table.from_pylist keeps only the first row's fields)
    names = list(dict.fromkeys(k for row in rows for k in row))
    if schema is not None:
        extra = [n for n in names if n not in schema.names]
        if extra:
            at = next(i for i, row in enumerate(rows) if extra[0] in row)
            raise ValueError(f"from_items: row {at} has field {extra[0]!r}, which the schema does not have "
                             f"(it has {schema.names}); add it to the schema or leave it out of the rows")
        names = schema.names
    columns = {name: [row.get(name) for row in rows] for name in names}
    try:
        table = pa.Table.from_pydict(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise _items_error(columns, schema, exc) from None
    batch = table.combine_chunks().to_batches()
    spans = _row_ranges(table.num_rows, int(num_splits))
    return ArrowSource(batch, table.schema, spans, int(batch_size), "from_items")


def _items_error(columns: dict[str, list[Any]], schema: pa.Schema | None, exc: Exception) -> Exception:
    """Why ``from_items`` could not make a table: the field whose values do not fit one type, with the
    rows where each type first appears."""
    for name, values in columns.items():
        try:
            pa.array(values, type=None if schema is None else schema.field(name).type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as field_exc:
            kinds: dict[str, int] = {}
            for i, value in enumerate(values):
                if value is not None:
                    kinds.setdefault(type(value).__name__, i)
            if schema is not None:
                expected = f"the schema gives it type {schema.field(name).type}"
            else:
                expected = "every value of a field must have one type (or pass schema=)"
            seen = ", ".join(f"{kind} (first at row {i})" for kind, i in kinds.items())
            return TypeError(f"from_items: field {name!r} has values of types {seen}; {expected} ({field_exc})")
    return TypeError(f"from_items: the rows do not make a table: {exc}")


def _arrow_batches(data: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Normalise ``from_arrow``'s input into a non-empty list of batches with one schema."""
    if isinstance(data, pa.Table):
        batches = data.to_batches() or [pa.RecordBatch.from_pylist([], schema=data.schema)]
    elif isinstance(data, pa.RecordBatch):
        batches = [data]
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        batches = list(data)
        if not batches:
            raise ValueError("from_arrow: expected at least one RecordBatch, got an empty sequence")
        for i, b in enumerate(batches):
            if not isinstance(b, pa.RecordBatch):
                raise TypeError(f"from_arrow: expected RecordBatch at index {i}, got {type(b).__name__}")
    else:
        raise TypeError(
            f"from_arrow: expected a Table, a RecordBatch or a sequence of RecordBatches, got {type(data).__name__}"
        )
    first = batches[0].schema
    for i, b in enumerate(batches):
        if not b.schema.equals(first):
            raise ValueError(
                f"from_arrow: batch {i} has a different schema from batch 0\n"
                f"batch 0 schema:\n{first}\nbatch {i} schema:\n{b.schema}"
            )
    return batches


def from_arrow(
    data: pa.Table | pa.RecordBatch | Sequence[pa.RecordBatch],
    *,
    num_splits: int | None = None,
    batch_size: int | None = DEFAULT_BATCH_ROWS,
) -> Source:
    """A zero-copy source over Arrow data.

    The rows are cut into contiguous row ranges: by default one per source
    instance (``flow.source(from_arrow(t), parallelism=p)`` reads p ranges),
    or ``num_splits`` of them. Batches are cut at every ``batch_size`` rows of
    a range, so what the dataflow sees, event-time results included, does not
    depend on how the input was chunked (a table from ``pd.concat``,
    ``pa.concat_tables`` or a multi-row-group read has many chunks); a batch is
    a zero-copy slice unless it spans two input chunks.

    Args:
        data: a Table, a RecordBatch or a sequence of RecordBatches.
        num_splits: number of splits; ``None``: one per source instance.
        batch_size: rows per emitted batch (default 65,536); ``None``: the
            input chunks as given (then batch boundaries follow the chunking).

    Returns:
        A source whose split offsets count rows already emitted.

    Raises:
        TypeError: ``data`` is not Arrow data.
        ValueError: the batches' schemas differ (naming the first mismatching
            batch and both schemas), or a size argument is not positive.

    Example:
        >>> t = pa.table({"x": [1, 2, 3]})
        >>> len(from_arrow(t, num_splits=3).splits())
        3
    """
    _require("from_arrow: num_splits", num_splits, allow_none=True)
    _require("from_arrow: batch_size", batch_size, allow_none=True)
    batches = _arrow_batches(data)
    total = sum(b.num_rows for b in batches)
    if num_splits is None:
        return ArrowSource(batches, batches[0].schema, [(0, total)], batch_size, "from_arrow", per_instance=True)
    spans = _row_ranges(total, int(num_splits))
    return ArrowSource(batches, batches[0].schema, spans, batch_size, "from_arrow")


# --------------------------------------------------------------------------- parquet


class _ParquetReader(SplitReader):
    """Reads one row group of one Parquet file; offset = batches emitted."""

    def __init__(self, source: ParquetSource, path: str, row_group: int, offset: int) -> None:
        self._file = source._filesystem.open_input_file(path)
        parquet = pq.ParquetFile(self._file)
        batch_size = source._batch_size or max(1, parquet.metadata.row_group(row_group).num_rows)
        self._batches: Iterator[pa.RecordBatch] = parquet.iter_batches(
            batch_size=batch_size, row_groups=[row_group], columns=source._columns
        )
        for _ in range(offset):
            if next(self._batches, None) is None:
                raise ValueError(f"from_parquet: offset {offset} is past the end of {path}#{row_group}")
        self._emitted = offset

    def read(self) -> pa.RecordBatch | None:
        if self._file is None:
            return None
        out = next(self._batches, None)
        if out is None:
            self.close()
            return None
        self._emitted += 1
        return out

    def offset(self) -> int:
        return self._emitted

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ParquetSource(Source):
    """Parquet files; a split is one row group of one file (``"{file}#{row_group}"``)."""

    def __init__(
        self,
        files: Sequence[str],
        columns: Sequence[str] | None,
        filesystem: pafs.FileSystem,
        batch_size: int | None,
    ) -> None:
        self._files = list(files)
        self._columns = None if columns is None else list(columns)
        self._filesystem = filesystem
        self._batch_size = batch_size

    def _file_schema(self, path: str) -> pa.Schema:
        with self._filesystem.open_input_file(path) as f:
            schema = pq.ParquetFile(f).schema_arrow
        if self._columns is None:
            return schema
        missing = [c for c in self._columns if c not in schema.names]
        if missing:
            raise ValueError(f"from_parquet: columns {missing} not in {path!r}; it has {schema.names}")
        return pa.schema([schema.field(c) for c in self._columns], metadata=schema.metadata)

    def schema(self) -> pa.Schema:
        return self._file_schema(self._files[0])

    def splits(self) -> list[SourceSplit]:
        first = self.schema()
        out: list[SourceSplit] = []
        for path in self._files:
            schema = self._file_schema(path)
            if not schema.equals(first):
                raise ValueError(
                    f"from_parquet: {path!r} has a different schema from {self._files[0]!r}\n"
                    f"expected:\n{first}\ngot:\n{schema}"
                )
            with self._filesystem.open_input_file(path) as f:
                num_row_groups = pq.ParquetFile(f).metadata.num_row_groups
            out.extend(SourceSplit(f"{path}#{rg}", (path, rg)) for rg in range(num_row_groups))
        return out

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        path, row_group = split.payload
        return _ParquetReader(self, path, row_group, 0 if offset is None else int(offset))

    def bounded(self) -> bool:
        return True

    def describe(self) -> str:
        return "from_parquet"


def from_parquet(
    path: str | Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    filesystem: pafs.FileSystem | None = None,
    batch_size: int | None = None,
) -> Source:
    """A source over Parquet files: one split per row group.

    Args:
        path: a file, a directory (searched recursively for ``*.parquet``,
            skipping names starting with ``.`` or ``_``), or a list of them;
            each a local path, a path in ``filesystem``, or a ``pyarrow.fs``
            URI (``file:///data/in``, ``s3://bucket/in?region=eu-west-1``).
        columns: read only these columns.
        filesystem: a ``pyarrow.fs`` filesystem for plain paths; ``None``:
            the local one (or the one a URI names).
        batch_size: rows per emitted batch; ``None``: a row group per batch.

    Returns:
        A source whose split offsets count batches already emitted.

    Raises:
        FileNotFoundError: a path does not exist (naming it).
        ValueError: a directory holds no Parquet file, a URI was given with
            ``filesystem=``, or the paths lie on different filesystems.

    Example:
        >>> src = from_parquet("s3://my-bucket/clicks/")  # doctest: +SKIP
    """
    _require("from_parquet: batch_size", batch_size, allow_none=True)
    fs, paths = resolve_all("from_parquet", path, filesystem)
    return ParquetSource(list_files("from_parquet", fs, paths, (".parquet",)), columns, fs, batch_size)
