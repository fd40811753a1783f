"""textsources.py: CSV and newline-delimited JSON files as replayable, splittable sources.

A split is a byte range ``[start, stop)`` of one file, and it owns the lines
that *start* in it: a reader whose range starts mid-line skips to the next
line, and reads its last line to its end even past ``stop``. So the ranges of
a file, cut anywhere, read every line exactly once. A file gives one split per
``split_size`` bytes (at least one, an empty file included).

A reader reads a block of about ``block_size`` bytes cut after its last whole
line, parses it with ``pyarrow.csv`` / ``pyarrow.json`` against the source's
schema and returns it as one batch; its offset is the byte position of the
next line, so a restore reopens the file there (memory is bounded by the
block, or by the longest line, never by the file).

The price of cutting at newlines: a CSV value must not hold a newline, even
quoted (newline-delimited JSON escapes them anyway).

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
    >>> _ = open(path, "w").write("k,v\\na,1\\nb,2\\n")
    >>> src = from_csv(path)
    >>> reader = src.open_split(src.splits()[0])
    >>> reader.read().to_pylist(), reader.offset()
    ([{'k': 'a', 'v': 1}, {'k': 'b', 'v': 2}], 12)
"""

from __future__ import annotations

import abc
import io
import os
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.fs as pafs
import pyarrow.json as pjson

from chiray.operators.fspaths import list_files, resolve_all
from chiray.operators.logic import Source, SourceSplit, SplitReader
from chiray.operators.validation import _require

__all__ = ["from_csv", "from_json", "CsvSource", "JsonSource"]

DEFAULT_BLOCK_SIZE = 1 << 20
"""Bytes of text per batch unless told otherwise (1 MiB)."""

DEFAULT_SPLIT_SIZE = 64 << 20
"""Bytes of a file per split unless told otherwise (64 MiB)."""

SAMPLE_SIZE = 1 << 20
"""Bytes at the start of the first file that a schema is inferred from (more if ``block_size`` is larger)."""

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


# --------------------------------------------------------------------------- lines of a file


def _line_start_after(file: pa.NativeFile, at: int, block: int) -> int:
    """The position after the first newline at or after ``at`` (the file's size if there is none)."""
    while True:
        data = file.read_at(block, at)
        found = data.find(b"\n")
        if found >= 0:
            return at + found + 1
        if len(data) < block:
            return at + len(data)
        at += len(data)


def _lines_before(file: pa.NativeFile, position: int, block: int) -> int:
    """How many lines end before ``position`` (for messages: the line at ``position`` is this + 1)."""
    count, at = 0, 0
    while at < position:
        data = file.read_at(min(block, position - at), at)
        if not data:
            break
        count += data.count(b"\n")
        at += len(data)
    return count


def _next_block(file: pa.NativeFile, position: int, stop: int, block: int) -> bytes:
    """The whole lines from ``position`` on, about ``block`` bytes of them, that start before ``stop``.

    Empty when no line starts in ``[position, stop)``. A line longer than
    ``block`` is returned whole (the read grows until it ends).
    """
    if position >= stop:
        return b""
    size = block
    while True:
        data = file.read_at(size, position)
        last = stop - position - 1  # the byte before stop: the line holding it is the last one owned
        end = data.find(b"\n", last) if last < len(data) else -1
        if end < 0:
            end = data.rfind(b"\n")
        if end >= 0:
            return data[:end + 1]
        if len(data) < size:  # the file ends without a newline
            return data
        size *= 2


# --------------------------------------------------------------------------- the source


class TextSource(Source, abc.ABC):
    """Files of lines, each split a byte range read a block at a time (see the module docstring).

    Subclasses say how a block of lines becomes a table (:meth:`_parse`), what
    a file's first line is (:meth:`_file_columns`) and what a directory holds.
    """

    kind = ""  # "from_csv" / "from_json": the function, for messages
    suffixes: tuple[str, ...] = ()

    def __init__(self, files: Sequence[str], filesystem: pafs.FileSystem, schema: pa.Schema, inferred: bool,
                 block_size: int, split_size: int) -> None:
        self._files = list(files)
        self._filesystem = filesystem
        self._schema = schema
        self._inferred = inferred
        self._block_size = block_size
        self._split_size = split_size

    def schema(self) -> pa.Schema:
        return self._schema

    def bounded(self) -> bool:
        return True

    def describe(self) -> str:
        return self.kind

    def splits(self) -> list[SourceSplit]:
        """``split_size`` byte ranges of each file (at least one), named ``"{file}#{i}"``."""
        out: list[SourceSplit] = []
        for path in self._files:
            info = self._filesystem.get_file_info(path)
            if info.type != pafs.FileType.File:
                raise FileNotFoundError(f"{self.kind}: no such file: {path!r} (it was there at {self.kind}())")
            columns, first = self._file_columns(path)
            size = info.size or 0
            n = max(1, -(-size // self._split_size))
            bounds = [size * i // n for i in range(n + 1)]
            bounds[0] = first
            out.extend(SourceSplit(f"{path}#{i}", (path, max(first, bounds[i]), max(first, bounds[i + 1]), columns))
                       for i in range(n))
        return out

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        path, start, stop, columns = split.payload
        if offset is not None and (isinstance(offset, bool) or not isinstance(offset, int) or offset < start):
            raise ValueError(f"{self.kind}: offset for split {split.split_id!r} must be a byte position "
                             f">= {start}, got {offset!r}")
        return _LinesReader(self, path, start, stop, columns, offset)

    def _file_columns(self, path: str) -> tuple[list[str] | None, int]:
        """The columns of ``path`` as its first line names them (``None``: no header) and where its data starts."""
        return None, 0

    @abc.abstractmethod
    def _parse(self, block: bytes, columns: list[str] | None) -> pa.Table:
        """The rows of ``block`` (whole lines) as a table of the source's schema; raises pyarrow's errors."""

    def _where(self, path: str, line: int | None) -> str:
        return f"{self.kind}: {path}" + (f", line {line}" if line is not None else "")

    def _expected(self) -> str:
        fields = ", ".join(f"{f.name}: {f.type}" for f in self._schema)
        hint = (f" (inferred from the first {_sample_size(self._block_size)} bytes of {self._files[0]}; pass schema= "
                f"to say what the columns hold)" if self._inferred else "")
        return f"expected columns {fields}{hint}"

    def bad_block(self, exc: Exception, path: str, file: pa.NativeFile, position: int, block: bytes,
                  columns: list[str] | None) -> ValueError:
        """The error for a block that does not parse: the file, the first line that fails, what was expected."""
        lines = block.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()

        def fails(n: int) -> bool:
            try:
                self._parse(b"\n".join(lines[:n]) + b"\n", columns)
            except _ARROW_ERRORS:
                return True
            return False

        lo, hi = 1, len(lines)  # the first n whose prefix fails: each line parses alone against the schema
        if not fails(hi):
            hi = 0
        while 0 < lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fails(mid) else (mid + 1, hi)
        before = _lines_before(file, position, self._block_size)
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if hi:
            text = lines[hi - 1].decode("utf-8", "replace")
            return ValueError(f"{self._where(path, before + hi)}: {message}; {self._expected()}; "
                              f"the line: {text!r:.200}")
        return ValueError(f"{self._where(path, None)}, lines {before + 1}-{before + len(lines)}: {message}; "
                          f"{self._expected()}")


class _LinesReader(SplitReader):
    """Reads the lines that start in ``[start, stop)`` of one file, a block a batch; offset = the next line's byte."""

    def __init__(self, source: TextSource, path: str, start: int, stop: int, columns: list[str] | None,
                 offset: int | None) -> None:
        self._source = source
        self._path = path
        self._stop = stop
        self._columns = columns
        try:
            self._file: pa.NativeFile | None = source._filesystem.open_input_file(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{source.kind}: no such file: {path!r}") from None
        if offset is not None:
            self._position = offset
        elif start == 0 or start >= stop:
            self._position = start
        else:  # the line holding byte start - 1 belongs to the split before
            self._position = _line_start_after(self._file, start - 1, source._block_size)

    def read(self) -> pa.RecordBatch | None:
        while self._file is not None:
            block = _next_block(self._file, self._position, self._stop, self._source._block_size)
            if not block:
                self.close()
                return None
            try:
                table = self._source._parse(block, self._columns)
            except _ARROW_ERRORS as exc:
                raise self._source.bad_block(exc, self._path, self._file, self._position, block,
                                             self._columns) from exc
            self._position += len(block)
            if table.num_rows:  # a block of blank lines gives nothing
                return table.combine_chunks().to_batches()[0]
        return None

    def offset(self) -> int:
        return self._position

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _sample_size(block_size: int) -> int:
    return max(block_size, SAMPLE_SIZE)


def _sample(where: str, fs: pafs.FileSystem, path: str, start: int, block_size: int) -> bytes:
    """The whole lines of about :data:`SAMPLE_SIZE` bytes of ``path`` from byte ``start``, to infer a schema from."""
    try:
        with fs.open_input_file(path) as f:
            return _next_block(f, start, f.size(), _sample_size(block_size))
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file: {path!r}") from None


def _infer(where: str, path: str, parse: Callable[[], pa.Table]) -> pa.Schema:
    try:
        return parse().schema
    except _ARROW_ERRORS as exc:
        raise ValueError(f"{where}: could not infer a schema from the start of {path} ({exc}); "
                         f"pass schema=") from exc


# --------------------------------------------------------------------------- CSV


class CsvSource(TextSource):
    """CSV files; a split is a byte range of one file (``"{file}#{i}"``), its offset a byte position."""

    kind = "from_csv"
    suffixes = (".csv",)

    def __init__(self, files: Sequence[str], filesystem: pafs.FileSystem, schema: pa.Schema, inferred: bool,
                 block_size: int, split_size: int, header: bool, delimiter: str) -> None:
        super().__init__(files, filesystem, schema, inferred, block_size, split_size)
        self._header = header
        self._delimiter = delimiter

    def _file_columns(self, path: str) -> tuple[list[str] | None, int]:
        """The header's column names (each schema column must be one) and the position after the header."""
        if not self._header:
            return None, 0
        columns, end = _read_header(self.kind, self._filesystem, path, self._delimiter, self._block_size)
        missing = [n for n in self._schema.names if n not in columns]
        if missing:
            raise ValueError(f"{self.kind}: {path} has no column {missing[0]!r}: its header names {columns}, "
                             f"the schema {self._schema.names}")
        return columns, end

    def _parse(self, block: bytes, columns: list[str] | None) -> pa.Table:
        names = columns if columns is not None else self._schema.names
        return pcsv.read_csv(
            io.BytesIO(block),
            read_options=pcsv.ReadOptions(column_names=names, use_threads=False, block_size=len(block) + 1),
            parse_options=pcsv.ParseOptions(delimiter=self._delimiter),
            convert_options=pcsv.ConvertOptions(column_types=self._schema, include_columns=self._schema.names),
        ).cast(self._schema)


def _read_header(where: str, fs: pafs.FileSystem, path: str, delimiter: str, block: int) -> tuple[list[str], int]:
    """The column names on the first line of ``path`` and the position after that line."""
    try:
        with fs.open_input_file(path) as f:
            end = _line_start_after(f, 0, block)
            line = f.read_at(end, 0)
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file: {path!r}") from None
    if not line.strip():
        raise ValueError(f"{where}: {path} has no header line (pass header=False and schema= for a file "
                         f"without one)")
    try:
        names = pcsv.read_csv(io.BytesIO(line), read_options=pcsv.ReadOptions(use_threads=False),
                              parse_options=pcsv.ParseOptions(delimiter=delimiter)).column_names
    except _ARROW_ERRORS as exc:
        raise ValueError(f"{where}: {path}, line 1: the header does not parse ({exc})") from exc
    return names, end


def from_csv(
    path: str | Sequence[str],
    *,
    schema: pa.Schema | None = None,
    header: bool = True,
    delimiter: str = ",",
    filesystem: pafs.FileSystem | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    split_size: int = DEFAULT_SPLIT_SIZE,
) -> Source:
    """A source over CSV files, read with ``pyarrow.csv`` a block of lines at a time.

    A split is a byte range of one file (``split_size`` bytes, at least one
    per file) owning the lines that start in it; a batch is the rows of about
    ``block_size`` bytes of whole lines; a split's offset is the byte position
    of its next line, so a recovery resumes right after the last batch read.
    Values must not hold newlines, even quoted. Each file's header names its
    columns (in any order, more than the schema's are ignored).

    Args:
        path: a file, a directory (searched recursively for ``*.csv``, skipping
            names starting with ``.`` or ``_``), or a list of them; each a
            local path, a path in ``filesystem``, or a ``pyarrow.fs`` URI
            (``file:///data/in``, ``s3://bucket/in?region=eu-west-1``).
        schema: the columns to read and their types; ``None``: inferred by
            pyarrow, at this call, from the first MiB of the first file (all
            of its columns).
        header: whether each file's first line names the columns; without
            one, ``schema`` names them in file order (or they are ``f0``,
            ``f1``... when inferred).
        delimiter: the character between values.
        filesystem: a ``pyarrow.fs`` filesystem for plain paths; ``None``: the
            local one (or the one a URI names).
        block_size: bytes of text per batch (a longer line makes a longer one).
        split_size: bytes of a file per split.

    Returns:
        A :class:`CsvSource` (``bounded()``: True).

    Raises:
        FileNotFoundError: a path does not exist (naming it).
        ValueError: a directory holds no CSV file; a header lacks a schema
            column; a URI with ``filesystem=``; a size that is not a positive
            int. While running, a line that does not parse or a value that is
            not of its column's type raises ``ValueError`` naming the file,
            the line and the expected columns.

    Example:
        >>> src = from_csv("s3://my-bucket/clicks/", schema=pa.schema([("user", pa.string())]))  # doctest: +SKIP
    """
    _check_sizes("from_csv", block_size, split_size)
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise ValueError(f"from_csv: delimiter must be one character, got {delimiter!r}")
    fs, files = _files("from_csv", path, filesystem, CsvSource.suffixes)
    inferred = schema is None
    if schema is None:
        schema = _infer_csv(fs, files[0], header, delimiter, block_size)
    else:
        _check_schema("from_csv", schema)
    return CsvSource(files, fs, schema, inferred, int(block_size), int(split_size), bool(header), delimiter)


def _infer_csv(fs: pafs.FileSystem, path: str, header: bool, delimiter: str, block: int) -> pa.Schema:
    columns, start = (_read_header("from_csv", fs, path, delimiter, block) if header else (None, 0))
    sample = _sample("from_csv", fs, path, start, block)
    options = pcsv.ReadOptions(column_names=columns, autogenerate_column_names=columns is None, use_threads=False)
    return _infer("from_csv", path, lambda: pcsv.read_csv(
        io.BytesIO(sample), read_options=options, parse_options=pcsv.ParseOptions(delimiter=delimiter)))


# --------------------------------------------------------------------------- JSON


class JsonSource(TextSource):
    """Newline-delimited JSON files; a split is a byte range of one file, its offset a byte position."""

    kind = "from_json"
    suffixes = (".json", ".jsonl", ".ndjson")

    def __init__(self, files: Sequence[str], filesystem: pafs.FileSystem, schema: pa.Schema, inferred: bool,
                 block_size: int, split_size: int, unexpected_fields: str) -> None:
        super().__init__(files, filesystem, schema, inferred, block_size, split_size)
        self._unexpected_fields = unexpected_fields

    def _parse(self, block: bytes, columns: list[str] | None) -> pa.Table:
        table = pjson.read_json(
            io.BytesIO(block),
            read_options=pjson.ReadOptions(use_threads=False, block_size=len(block) + 1),
            parse_options=pjson.ParseOptions(explicit_schema=self._schema,
                                              unexpected_field_behavior=self._unexpected_fields),
        )
        return table.select(self._schema.names).cast(self._schema)


def from_json(
    path: str | Sequence[str],
    *,
    schema: pa.Schema | None = None,
    unexpected_fields: str = "error",
    filesystem: pafs.FileSystem | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    split_size: int = DEFAULT_SPLIT_SIZE,
) -> Source:
    """A source over newline-delimited JSON files (one object a line), read with ``pyarrow.json``.

    Splits, batches and offsets are as in :func:`from_csv`: a split is a byte
    range of one file owning the lines that start in it, a batch the rows of
    about ``block_size`` bytes of whole lines, an offset the byte position of
    the next line. A field missing from a line is null.

    Args:
        path: a file, a directory (searched recursively for ``*.json``,
            ``*.jsonl`` and ``*.ndjson``, skipping names starting with ``.`` or
            ``_``), or a list of them; each a local path, a path in
            ``filesystem``, or a ``pyarrow.fs`` URI.
        schema: the fields to read and their types; ``None``: inferred by
            pyarrow, at this call, from the first MiB of the first file.
        unexpected_fields: what a field the schema lacks does: ``"error"``
            (the default) or ``"ignore"`` (it is dropped).
        filesystem: a ``pyarrow.fs`` filesystem for plain paths; ``None``: the
            local one (or the one a URI names).
        block_size: bytes of text per batch (a longer line makes a longer one).
        split_size: bytes of a file per split.

    Returns:
        A :class:`JsonSource` (``bounded()``: True).

    Raises:
        FileNotFoundError: a path does not exist (naming it).
        ValueError: a directory holds no JSON file; a URI with
            ``filesystem=``; a bad ``unexpected_fields`` or size. While
            running, a line that does not parse, a value not of its field's
            type or (with ``"error"``) an unknown field raises ``ValueError``
            naming the file, the line and the expected fields.

    Example:
        >>> src = from_json("file:///data/events/")  # doctest: +SKIP
    """
    _check_sizes("from_json", block_size, split_size)
    if unexpected_fields not in ("error", "ignore"):
        raise ValueError(f"from_json: unexpected_fields must be 'error' or 'ignore', got {unexpected_fields!r}")
    fs, files = _files("from_json", path, filesystem, JsonSource.suffixes)
    inferred = schema is None
    if schema is None:
        sample = _sample("from_json", fs, files[0], 0, block_size)
        schema = _infer("from_json", files[0], lambda: pjson.read_json(
            io.BytesIO(sample), read_options=pjson.ReadOptions(use_threads=False)))
    else:
        _check_schema("from_json", schema)
    return JsonSource(files, fs, schema, inferred, int(block_size), int(split_size), unexpected_fields)


# --------------------------------------------------------------------------- arguments


def _check_sizes(where: str, block_size: int, split_size: int) -> None:
    _require(f"{where}: block_size", block_size)
    _require(f"{where}: split_size", split_size)


def _check_schema(where: str, schema: Any) -> None:
    if not isinstance(schema, pa.Schema):
        raise TypeError(f"{where}: schema must be a pyarrow.Schema, got {type(schema).__name__}")
    if not len(schema):
        raise ValueError(f"{where}: schema has no columns")


def _files(where: str, path: str | os.PathLike | Sequence[str], filesystem: pafs.FileSystem | None,
           suffixes: tuple[str, ...]) -> tuple[pafs.FileSystem, list[str]]:
    fs, paths = resolve_all(where, path, filesystem)
    return fs, list_files(where, fs, paths, suffixes)
