"""sources.py: the built-in replayable sources (items, Arrow, Parquet, generator).

Every source here is a :class:`logic.Source`: ``splits()`` runs on the driver,
the source object is cloudpickled into the host actors, and ``open_split``
runs there. No source holds an open file before ``open_split``.

Offsets, per source (each counts what the reader has already emitted):

- ``from_items`` / ``from_arrow``: rows of the split;
- ``from_parquet``: batches of the row group;
- ``generate``: batches of the split.

Example:
    >>> src = from_items([{"x": 1}, {"x": 2}, {"x": 3}], batch_size=2)
    >>> reader = src.open_split(src.splits()[0])
    >>> reader.read().num_rows, reader.offset()
    (2, 2)
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import numbers
import os
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from operators.logic import Source, SourceSplit, SplitReader

__all__ = [
    "from_items",
    "from_arrow",
    "from_parquet",
    "generate",
    "ArrowSource",
    "ParquetSource",
    "GenerateSource",
]


def _require(name: str, value: Any, *, integer: bool = True, minimum: int = 1, allow_none: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is an int ``>= minimum`` (``integer``) or a number ``> 0``.

    ``None`` passes when ``allow_none``; bools never pass.
    """
    if value is None and allow_none:
        return
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok or (value < minimum if integer else not value > 0):
        what = f"an int >= {minimum}" if integer else "a number > 0"
        raise ValueError(f"{name} must be {what}{' or None' if allow_none else ''}, got {value!r}")


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
    ) -> None:
        self._batches = list(batches)
        self._schema = schema
        self._spans = list(spans)
        self._batch_size = batch_size
        self._name = name
        self._starts = list(itertools.accumulate((b.num_rows for b in self._batches), initial=0))

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
    table = pa.Table.from_pylist(list(items), schema=schema)
    batch = table.combine_chunks().to_batches()
    spans = _row_ranges(table.num_rows, int(num_splits))
    return ArrowSource(batch, table.schema, spans, int(batch_size), "from_items")


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
    batch_size: int | None = None,
) -> Source:
    """A zero-copy source over Arrow data.

    By default each input batch is its own split, so parallelism up to the
    number of batches is usable. With ``num_splits`` the batches are grouped
    into that many contiguous runs (or, if there are fewer batches than
    splits, the rows are divided into contiguous ranges).

    Args:
        data: a Table, a RecordBatch or a sequence of RecordBatches.
        num_splits: number of splits; ``None``: one per batch.
        batch_size: re-chunk the output to this many rows per batch;
            ``None``: emit the batches as given.

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
    bounds = list(itertools.accumulate((b.num_rows for b in batches), initial=0))
    if num_splits is None:
        spans = list(zip(bounds[:-1], bounds[1:]))
    elif num_splits <= len(batches):
        groups = np.array_split(np.arange(len(batches)), int(num_splits))
        spans = [(bounds[g[0]], bounds[g[-1] + 1]) for g in groups]
    else:
        spans = _row_ranges(bounds[-1], int(num_splits))
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


def _list_parquet(fs: pafs.FileSystem, paths: Sequence[str]) -> list[str]:
    """Expand files and directories (recursively, ``*.parquet``, sorted) into file paths."""
    files: list[str] = []
    for path in paths:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"from_parquet: no such file or directory: {path!r}")
        if info.type == pafs.FileType.Directory:
            found = sorted(
                f.path
                for f in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                if f.type == pafs.FileType.File
                and f.base_name.endswith(".parquet")
                and not f.base_name.startswith((".", "_"))
            )
            if not found:
                raise ValueError(f"from_parquet: directory {path!r} contains no *.parquet files")
            files.extend(found)
        else:
            files.append(path)
    return files


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
        out = []
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
            skipping names starting with ``.`` or ``_``), or a list of them.
        columns: read only these columns.
        filesystem: a ``pyarrow.fs`` filesystem; ``None``: the local one.
        batch_size: rows per emitted batch; ``None``: a row group per batch.

    Returns:
        A source whose split offsets count batches already emitted.

    Raises:
        FileNotFoundError: a path does not exist (naming it).
        ValueError: a directory holds no Parquet file.

    Example:
        >>> src = from_parquet("data/")  # doctest: +SKIP
    """
    _require("from_parquet: batch_size", batch_size, allow_none=True)
    fs = filesystem if filesystem is not None else pafs.LocalFileSystem()
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise ValueError("from_parquet: expected at least one path, got none")
    files = _list_parquet(fs, [os.fspath(p) for p in paths])
    return ParquetSource(files, columns, fs, batch_size)


# --------------------------------------------------------------------------- generator


class _ZipfSampler:
    """Maps uniform draws in ``[0, 1)`` to ranks ``0..num_keys-1`` with weight ``(rank+1)**-s``.

    Inverse-CDF sampling, exact; a guide table over ``2**16`` equal buckets of
    ``[0, 1)`` answers draws whose bucket lies within one rank without a
    binary search (most draws: the mass is on the few top ranks).
    """

    _BUCKETS = 1 << 16  # a power of two, so ``u * _BUCKETS`` is exact

    def __init__(self, num_keys: int, s: float) -> None:
        cdf = np.cumsum(np.arange(1, num_keys + 1, dtype=np.float64) ** -s)
        self._cdf = cdf / cdf[-1]
        self._last = num_keys - 1
        edges = self._rank(np.arange(self._BUCKETS + 1, dtype=np.float64) / self._BUCKETS)
        self._guide = edges[:-1]
        self._exact = edges[:-1] == edges[1:]

    def _rank(self, u: np.ndarray) -> np.ndarray:
        ranks = np.searchsorted(self._cdf, u, side="right")
        return np.minimum(ranks, self._last, out=ranks)

    def sample(self, u: np.ndarray) -> np.ndarray:
        """The rank of each draw in ``u`` (int64)."""
        bucket = np.minimum((u * self._BUCKETS).astype(np.int64), self._BUCKETS - 1)
        ranks = self._guide[bucket]
        slow = ~self._exact[bucket]
        ranks[slow] = self._rank(u[slow])
        return ranks.astype(np.int64, copy=False)


class _GenerateReader(SplitReader):
    """Emits the deterministic batches of one generator split; offset = batches emitted."""

    def __init__(self, source: GenerateSource, split: int, offset: int) -> None:
        self._src = source
        self._schema = source.schema()
        self._split = split
        self._batch_index = offset
        n, rem = divmod(source.num_records or 0, source.num_splits)
        self._total = None if source.num_records is None else n + (1 if split < rem else 0)
        self._rate = None if source.rate is None else source.rate / source.num_splits
        self._t0 = source.clock()
        self._rows_since_open = 0
        self._keys = source.key_dictionary() if source.key_type == "string" else None
        self._zipf = _ZipfSampler(source.num_keys, source.zipf_s) if source.dist == "zipf" else None

    def ready_at(self) -> float | None:
        if self._rate is None:
            return None
        return self._t0 + self._rows_since_open / self._rate

    def _key_column(self, rng: np.random.Generator, n: int) -> pa.Array:
        if self._zipf is None:
            ids = rng.integers(0, self._src.num_keys, n, dtype=np.int64)
        else:
            ids = self._zipf.sample(rng.random(n))
        if self._keys is None:
            return pa.array(ids.astype(np.int64, copy=False))
        return self._keys.take(pa.array(ids))

    def read(self) -> pa.RecordBatch | None:
        src, b = self._src, self._batch_index
        first = b * src.batch_size
        n = src.batch_size if self._total is None else min(src.batch_size, self._total - first)
        if n <= 0:
            return None
        rng = np.random.default_rng([src.seed, self._split, b])
        key = self._key_column(rng, n)
        value = rng.integers(0, 1_000_000, n, dtype=np.int64)
        seq = np.arange(first, first + n, dtype=np.int64)
        ts = np.full(n, time.time_ns(), dtype=np.int64).view("datetime64[ns]")
        self._batch_index += 1
        self._rows_since_open += n
        return pa.RecordBatch.from_arrays([key, pa.array(value), pa.array(seq), pa.array(ts)], schema=self._schema)

    def offset(self) -> int:
        return self._batch_index


@dataclasses.dataclass(frozen=True)
class GenerateSource(Source):
    """A deterministic, seedable, rate-controlled synthetic source (for benchmarks).

    Columns: ``key`` (``"k<id>"`` strings or int64 ids), ``value`` (int64),
    ``seq`` (per-split record sequence from 0) and ``ts`` (ingestion time,
    ``time.time_ns()`` when the batch is emitted). ``key``, ``value`` and
    ``seq`` of batch ``b`` of split ``s`` depend only on ``(seed, s, b)``.

    Pacing is open loop: batch ``j`` after ``open_split`` is due at
    ``t_open + rows_before_j / (rate / num_splits)``; a reader that fell behind
    catches up at full speed. Fields are as in :func:`generate`.
    """

    num_records: int | None
    rate: float | None
    batch_size: int
    num_keys: int
    dist: str
    zipf_s: float
    seed: int
    num_splits: int
    key_type: str
    clock: Callable[[], float] = time.monotonic

    def schema(self) -> pa.Schema:
        key_type = pa.string() if self.key_type == "string" else pa.int64()
        return pa.schema(
            [("key", key_type), ("value", pa.int64()), ("seq", pa.int64()), ("ts", pa.timestamp("ns"))]
        )

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit(f"generate-{i}", i) for i in range(self.num_splits)]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        offset = 0 if offset is None else int(offset)
        if offset < 0 or not 0 <= split.payload < self.num_splits:
            raise ValueError(
                f"generate: expected a split index in [0, {self.num_splits}) and an offset >= 0, "
                f"got split {split.payload!r} and offset {offset}"
            )
        return _GenerateReader(self, int(split.payload), offset)

    def key_dictionary(self) -> pa.Array:
        """The string keys ``["k0", "k1", ...]``, built vectorised."""
        ids = pc.cast(pa.array(np.arange(self.num_keys, dtype=np.int64)), pa.string())
        return pc.binary_join_element_wise("k", ids, "")

    def describe(self) -> str:
        return f"generate({self.dist})"


def generate(
    num_records: int | None,
    *,
    rate: float | None = None,
    batch_size: int = 10_000,
    num_keys: int = 100_000,
    dist: str = "uniform",
    zipf_s: float = 1.1,
    seed: int = 0,
    num_splits: int = 1,
    key_type: str = "string",
    clock: Callable[[], float] = time.monotonic,
) -> Source:
    """A synthetic source for benchmarks: deterministic, seedable, optionally rate-limited.

    Args:
        num_records: total records over all splits; ``None``: unbounded.
        rate: records per second for the whole source (split evenly across
            splits); ``None``: as fast as it is pulled.
        batch_size: records per batch.
        num_keys: keys are drawn from ``num_keys`` distinct values.
        dist: ``"uniform"`` or ``"zipf"`` (rank ``r`` has weight ``(r+1)**-zipf_s``).
        zipf_s: the Zipf exponent.
        seed: the random seed.
        num_splits: number of splits.
        key_type: ``"string"`` (``"k123"``) or ``"int"`` (int64).
        clock: the monotonic clock used for pacing (injectable for tests).

    Returns:
        A source whose split offsets count batches already emitted.

    Raises:
        ValueError: an argument is out of range (naming it and its value).

    Example:
        >>> r = generate(25, batch_size=10).open_split(SourceSplit("generate-0", 0))
        >>> [r.read().num_rows for _ in range(3)]
        [10, 10, 5]
    """
    _require("generate: num_records", num_records, minimum=0, allow_none=True)
    _require("generate: rate", rate, integer=False, allow_none=True)
    _require("generate: batch_size", batch_size)
    _require("generate: num_keys", num_keys)
    _require("generate: num_splits", num_splits)
    _require("generate: zipf_s", zipf_s, integer=False)
    if dist not in ("uniform", "zipf"):
        raise ValueError(f"generate: dist must be 'uniform' or 'zipf', got {dist!r}")
    if key_type not in ("string", "int"):
        raise ValueError(f"generate: key_type must be 'string' or 'int', got {key_type!r}")
    return GenerateSource(
        None if num_records is None else int(num_records),
        None if rate is None else float(rate),
        int(batch_size), int(num_keys), dist, float(zipf_s), int(seed), int(num_splits), key_type, clock,
    )
