"""codec.py: built-in operator state as Arrow IPC: a closed set of Python values, never pickle.

Checkpoints and rescales move the state of built-in operators (rows per key
of windows, joins, top-n and sessions; pending timers; window and watermark
documents) as bytes. :func:`encode` writes such a value, :func:`decode` reads
it back, and neither pickles: a payload can only ever decode to the types
below, so a checkpoint someone tampered with cannot run code at restore.

Types: ``None``, ``bool``, ``int`` (any size), ``float`` (nan and inf too),
``str``, ``bytes``, ``list``, ``tuple``, ``dict`` (keys any of these types
that hashes), ``set``, ``frozenset``, NumPy scalars (bool, integer, float,
complex, str, datetime64, timedelta64: the dtype is kept, so a restored key
has the same type and hash), ``datetime`` / ``date`` / ``time`` /
``timedelta`` (zones: ``zoneinfo`` and fixed offsets, as Arrow gives them),
pandas ``Timestamp`` / ``Timedelta`` (what ``to_pylist`` gives for
nanosecond columns), ``Decimal``, Arrow's ``MonthDayNano``, and
``pyarrow.RecordBatch`` / ``pyarrow.Table`` (a slice carries only its own
rows). Exact types: a subclass (an ``IntEnum``, a ``namedtuple``) is refused,
as is anything else, by a ``TypeError`` that says where in the value it sits.

Layout: one Arrow IPC stream whose batches have one ``large_binary`` column
of blobs. Its schema metadata holds the format tag, the version, the groups
and the value as JSON. In the JSON a list is an array and a JSON scalar is
itself; any other value is an object of one tag (``{"t": [items]}`` a tuple,
``{"d": [[keys], [values]]}`` a dict, ``{"b": [group, piece]}`` a record
batch...), so the parser rebuilds the value bottom up in one pass. The record
batches (and table chunks) of one schema form a *group*: one blob, an IPC
stream of their rows concatenated, cut back into pieces by their lengths at
decode. ``bytes`` values are blobs of their own. The scalar types beyond
JSON's are written and read by :mod:`operators.codecscalars`.

Example:
    >>> value = {("a", 1): [pa.record_batch({"x": [1, 2]}), 2.5, None]}
    >>> back = decode(encode(value))
    >>> back[("a", 1)][0].to_pylist(), back[("a", 1)][1:]
    ([{'x': 1}, {'x': 2}], [2.5, None])
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from .codecscalars import DECODERS, ENCODERS, Unsupported, fallback

__all__ = ["encode", "decode", "is_pickle", "decode_document", "FORMAT", "VERSION"]

FORMAT = "chiray.codec"
VERSION = 1
_FORMAT_TAG, _VERSION_TAG = FORMAT.encode(), str(VERSION).encode()
_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None)})  # written as JSON scalars
_SCHEMA_SCAN = 8  # schemas compared one by one before hashing
_JOIN_BELOW = 1 << 16  # blobs smaller than this share a column (copying them once more is cheap)
_BLOB_FIELD = pa.field("blob", pa.large_binary())
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()
_READ_OPTIONS = pa.ipc.IpcReadOptions()
_to_json = json.JSONEncoder(separators=(",", ":")).encode


def is_pickle(payload: bytes | pa.Buffer) -> bool:
    """Whether ``payload`` starts as a pickle of protocol 2 or later does (it is never unpickled here)."""
    return bytes(payload[:1]) == b"\x80"


def encode(value: Any) -> bytes:
    """``value`` as an Arrow IPC payload (see the module docstring for the types).

    Raises:
        TypeError: a part of ``value`` is of another type; the message names the type and where it sits
            (e.g. ``value['items'][3][1]``). Or ``value`` refers to itself.
    """
    encoder = _Encoder(_PLAIN)
    try:
        try:
            text = _to_json(encoder.walk(value))
        except ValueError:  # an int past Python's digits limit for int <-> str: walk again, huge ints as hex
            encoder = _Encoder(_PLAIN - {int})
            text = _to_json(encoder.walk(value))
    except RecursionError:
        raise TypeError("cannot encode the value: it is nested too deeply, or refers to itself") from None
    except Unsupported as exc:
        where = "value" + "".join(reversed(exc.path))
        kind = type(exc.value)
        raise TypeError(f"cannot encode a {kind.__module__}.{kind.__qualname__} at {where}: built-in state "
                        "holds only None, bool, int, float, str, bytes, list, tuple, dict, set, NumPy "
                        "scalars, dates and times, Decimal and Arrow record batches and tables") from None
    blobs = encoder.blobs + [_group_stream(g) for g in encoder.groups]
    metadata = {b"format": _FORMAT_TAG, b"version": _VERSION_TAG, b"value": text.encode(),
                b"groups": _to_json([g.layout for g in encoder.groups]).encode()}
    schema = pa.schema([_BLOB_FIELD], metadata=metadata)
    batches = [pa.record_batch([c], schema=schema) for c in _blob_columns(blobs)]  # none: the schema only
    return _stream(schema, batches, sum(map(len, blobs))).to_pybytes()


def decode(payload: bytes | pa.Buffer) -> Any:
    """The value :func:`encode` wrote into ``payload``.

    Raises:
        ValueError: ``payload`` is not this format (a pickle included: it is never unpickled), is of an
            unknown version, or is damaged.
    """
    if is_pickle(payload):
        raise ValueError(f"the payload is a pickle, not {FORMAT} Arrow IPC")
    try:
        reader = pa.ipc.open_stream(payload, options=_READ_OPTIONS)
    except pa.ArrowException as exc:
        raise ValueError(f"not a {FORMAT} payload ({exc})") from None
    metadata = reader.schema.metadata or {}
    if metadata.get(b"format") != _FORMAT_TAG:
        raise ValueError(f"not a {FORMAT} payload (an Arrow IPC stream without format {FORMAT!r})")
    if metadata.get(b"version") != _VERSION_TAG:
        version = metadata.get(b"version", b"?").decode(errors="replace")
        raise ValueError(f"version {version} of {FORMAT} cannot be read (this reader has version {VERSION})")
    try:
        blobs = [blob for batch in reader for blob in _blobs(batch.column(0))]
        layouts = _STRICT_JSON.decode(metadata[b"groups"].decode())
        first = len(blobs) - len(layouts)
        groups = [_group_pieces(blobs[first + i], layout) for i, layout in enumerate(layouts)]
        parser = json.JSONDecoder(object_hook=functools.partial(_node, _Context(blobs, groups)))
        return parser.decode(metadata[b"value"].decode())
    except (pa.ArrowException, ValueError, KeyError, IndexError, TypeError, ArithmeticError,
            RecursionError) as exc:
        raise ValueError(f"a damaged {FORMAT} payload ({type(exc).__name__}: {exc})") from None


def decode_document(payload: bytes, kind: str, format: str, bin: int) -> dict[str, Any]:
    """A built-in state's per-bin document (a dict whose ``"format"`` is ``format``), read from ``payload``.

    Raises:
        ValueError: naming ``bin``: the payload is pickled (refused, never unpickled), or not a
            ``kind`` bin.
    """
    if is_pickle(payload):
        raise ValueError(f"bin {bin}: the {kind} payload is pickled; built-in state reads only Arrow IPC")
    try:
        doc = decode(payload)
    except ValueError as exc:
        raise ValueError(f"bin {bin}: payload is not a {kind} bin ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != format:
        raise ValueError(f"bin {bin}: payload is not a {kind} bin (format {format!r} expected)")
    return doc


# -- encoding ---------------------------------------------------------------------------------------


class _Group:
    """The record-batch pieces of one schema (metadata included), in order of appearance."""

    __slots__ = ("schema", "index", "pieces", "layout")

    def __init__(self, schema: pa.Schema, index: int) -> None:
        self.schema = schema
        self.index = index
        self.pieces: list[pa.RecordBatch] = []
        self.layout: list[Any] = []  # set by _group_stream: ["c", [lengths]] or ["s", count]


class _Encoder:
    """One walk over a value: its JSON tree, the ``bytes`` blobs and the record-batch groups."""

    def __init__(self, plain: frozenset[type]) -> None:
        self.plain = plain  # the types written as they are
        self.blobs: list[bytes] = []
        self.groups: list[_Group] = []
        self._recent: list[_Group] = []  # the last two groups used, the last first (joins alternate two)
        self._by_schema: dict[pa.Schema, list[_Group]] = {}

    def walk(self, value: Any) -> Any:
        if type(value) in self.plain:
            return value
        return (_ENCODERS.get(type(value)) or fallback(value))(self, value)

    def nodes(self, values: Any) -> list[Any]:
        """The nodes of a sequence of values: a list of them as they are when they all are JSON scalars,
        and so for each of them that is a list of JSON scalars (checked in C, the common case)."""
        plain = self.plain
        if set(map(type, values)) <= plain:
            return values if type(values) is list else list(values)
        encoders = _ENCODERS
        return [x if type(x) in plain or (type(x) is list and set(map(type, x)) <= plain)
                else (encoders.get(type(x)) or fallback(x))(self, x) for x in values]

    def mapping(self, value: dict) -> dict[str, Any]:
        try:
            return {"d": [self.nodes(value.keys()), self.nodes(value.values())]}
        except Unsupported:
            self.locate(itertools.chain.from_iterable(((k, f".<key {i}>"), (v, f"[{k!r}]"))
                                                       for i, (k, v) in enumerate(value.items())))
            raise

    def locate(self, steps: Iterable[tuple[Any, str]]) -> None:
        """Walk ``(item, step)`` again one by one; the first that fails raises with its step on the path."""
        for item, step in steps:
            try:
                self.walk(item)
            except Unsupported as exc:
                exc.path.append(step)
                raise

    def blob(self, value: bytes) -> dict[str, Any]:
        self.blobs.append(value)
        return {"y": len(self.blobs) - 1}

    def batch(self, value: pa.RecordBatch) -> dict[str, Any]:
        group = self._group(value.schema)
        group.pieces.append(value)
        return {"b": [group.index, len(group.pieces) - 1]}

    def table(self, value: pa.Table) -> dict[str, Any]:
        group = self._group(value.schema)
        first = len(group.pieces)
        group.pieces.extend(value.to_batches())
        return {"T": [group.index, first, len(group.pieces) - first]}

    def _group(self, schema: pa.Schema) -> _Group:
        """The group of ``schema``: one of the last two used, else one of the first few, else by hash."""
        recent = self._recent
        for group in recent:
            if group.schema.equals(schema, check_metadata=True):
                if group is not recent[0]:
                    recent.reverse()
                return group
        found = next((g for g in self.groups[:_SCHEMA_SCAN]
                      if g.schema.equals(schema, check_metadata=True)), None)
        if found is None and len(self.groups) > _SCHEMA_SCAN:
            found = next((g for g in self._by_schema.get(schema, ())
                          if g.schema.equals(schema, check_metadata=True)), None)
        if found is None:
            found = _Group(schema, len(self.groups))
            self.groups.append(found)
            if len(self.groups) > _SCHEMA_SCAN:
                self._by_schema.setdefault(schema, []).append(found)
        self._recent = [found, *recent[:1]]
        return found


def _encode_items(tag: str | None, encoder: _Encoder, value: Any) -> Any:
    """A list as the array of its nodes; a tuple, set or frozenset as that array under its tag."""
    try:
        nodes = encoder.nodes(value)
    except Unsupported:
        step = "[{}]" if tag in (None, "t") else ".<member {}>"
        encoder.locate((item, step.format(i)) for i, item in enumerate(value))
        raise
    return nodes if tag is None else {tag: nodes}


_ENCODERS: dict[type, Callable[[_Encoder, Any], Any]] = {
    **ENCODERS,
    list: functools.partial(_encode_items, None),
    tuple: functools.partial(_encode_items, "t"),
    set: functools.partial(_encode_items, "s"),
    frozenset: functools.partial(_encode_items, "f"),
    dict: _Encoder.mapping,
    bytes: _Encoder.blob,
    pa.RecordBatch: _Encoder.batch,
    pa.Table: _Encoder.table,
}


def _group_stream(group: _Group) -> pa.Buffer:
    """One group as an IPC stream: its pieces' rows concatenated in one batch (``["c", lengths]``), or the
    pieces as batches of their own (``["s", count]``: one piece, no rows, large pieces, rows that do not
    concatenate, or dictionary columns, whose dictionaries concatenating would merge)."""
    pieces = group.pieces
    batches = pieces
    group.layout = ["s", len(pieces)]
    rows = sum(p.num_rows for p in pieces)
    if 1 < len(pieces) and 0 < rows < 1024 * len(pieces) and "dictionary<" not in str(group.schema):
        try:
            combined = pa.Table.from_batches(pieces, schema=group.schema).combine_chunks().to_batches()
        except pa.ArrowException:
            combined = []
        if len(combined) == 1:
            batches = combined
            group.layout = ["c", [p.num_rows for p in pieces]]
    # (a slice writes only its own rows; its buffers' whole size, cheap to get, decides how to write them)
    return _stream(group.schema, batches, sum(b.get_total_buffer_size() for b in batches))


def _stream(schema: pa.Schema, batches: list[pa.RecordBatch], nbytes: int) -> pa.Buffer:
    """``batches`` as one IPC stream. Past ``_JOIN_BELOW`` bytes, a first pass measures it, so the second
    writes into a buffer of its size (a growing one would copy the data again each time it grows)."""
    if nbytes < _JOIN_BELOW:
        sink = pa.BufferOutputStream()
        _write(sink, schema, batches)
        return sink.getvalue()
    size = pa.MockOutputStream()
    _write(size, schema, batches)
    buffer = pa.allocate_buffer(size.size())
    _write(pa.FixedSizeBufferWriter(buffer), schema, batches)
    return buffer


def _write(sink: pa.NativeFile, schema: pa.Schema, batches: list[pa.RecordBatch]) -> None:
    with pa.ipc.new_stream(sink, schema, options=_WRITE_OPTIONS) as writer:
        for batch in batches:
            writer.write_batch(batch)


def _blob_columns(blobs: list[Any]) -> list[pa.Array]:
    """The blobs as ``large_binary`` columns, in order: a large blob alone in its column, made without
    a copy (the writer copies it once); a run of small ones joined in one."""
    columns: list[pa.Array] = []
    run: list[Any] = []
    for blob in blobs:
        if len(blob) < _JOIN_BELOW:
            run.append(blob)
            continue
        if run:
            columns.append(_joined(run))
            run = []
        data = blob if isinstance(blob, pa.Buffer) else pa.py_buffer(blob)
        columns.append(pa.Array.from_buffers(pa.large_binary(), 1, [None, _offsets([len(blob)]), data]))
    if run:
        columns.append(_joined(run))
    return columns


def _joined(blobs: list[Any]) -> pa.Array:
    return pa.Array.from_buffers(pa.large_binary(), len(blobs),
                                 [None, _offsets([len(b) for b in blobs]), pa.py_buffer(b"".join(blobs))])


def _offsets(lengths: list[int]) -> pa.Buffer:
    return pa.py_buffer(np.fromiter(itertools.accumulate(lengths, initial=0), dtype=np.int64,
                                    count=len(lengths) + 1))


# -- decoding ---------------------------------------------------------------------------------------


def _no_objects(_: dict) -> Any:
    raise ValueError("a JSON object where only arrays and numbers belong")


_STRICT_JSON = json.JSONDecoder(object_hook=_no_objects)


def _blobs(column: pa.Array) -> list[pa.Buffer]:
    """The blobs of one of the payload's columns, as zero-copy slices of its data buffer."""
    if column.type != pa.large_binary() or column.null_count:
        raise ValueError("a blob column that is not large_binary without nulls")
    _, offsets_buffer, data = column.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[column.offset: column.offset + len(column) + 1]
    data = data if data is not None else pa.py_buffer(b"")
    return [data.slice(int(lo), int(hi - lo)) for lo, hi in zip(offsets[:-1], offsets[1:])]


def _group_pieces(blob: pa.Buffer, layout: list[Any]) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """A group's schema and its record-batch pieces, as encoded (``_group_stream``)."""
    reader = pa.ipc.open_stream(blob, options=_READ_OPTIONS)
    batches = list(reader)
    mode, shape = layout
    if mode == "s":
        if len(batches) != shape:
            raise ValueError(f"a group holds {len(batches)} batches, {shape} expected")
        return reader.schema, batches
    if mode != "c" or len(batches) != 1 or sum(shape) != batches[0].num_rows:
        raise ValueError(f"a group's layout {mode!r} does not fit its {len(batches)} batches")
    whole = batches[0]
    starts = np.cumsum([0, *shape[:-1]]).tolist()
    return reader.schema, [whole.slice(s, n) for s, n in zip(starts, shape)]


class _Context:
    """What the nodes of one payload refer to: its blobs and its record-batch groups."""

    __slots__ = ("blobs", "groups")

    def __init__(self, blobs: list[pa.Buffer], groups: list[tuple[pa.Schema, list[pa.RecordBatch]]]) -> None:
        self.blobs = blobs
        self.groups = groups


def _node(context: _Context, node: dict[str, Any]) -> Any:
    """The value of a tagged node, its contents already decoded (the JSON parser's object hook)."""
    if len(node) != 1:
        raise ValueError(f"a value node with {len(node)} tags")
    (tag, arg), = node.items()
    return _DECODERS[tag](context, arg)


def _decode_mapping(_: _Context, arg: list[Any]) -> dict[Any, Any]:
    keys, values = arg
    if type(keys) is not list or type(values) is not list or len(keys) != len(values):
        raise ValueError("a dict node whose keys and values do not pair up")
    return dict(zip(keys, values))


def _decode_table(context: _Context, arg: list[int]) -> pa.Table:
    group, first, count = arg
    schema, pieces = context.groups[group]
    if first < 0 or count < 0 or first + count > len(pieces):
        raise ValueError("a table node refers to pieces its group does not have")
    return pa.Table.from_batches(pieces[first:first + count], schema=schema)


_DECODERS: dict[str, Callable[[_Context, Any], Any]] = {
    **DECODERS,
    "t": lambda _, items: tuple(items),
    "s": lambda _, items: set(items),
    "f": lambda _, items: frozenset(items),
    "d": _decode_mapping,
    "y": lambda c, index: c.blobs[index].to_pybytes(),
    "b": lambda c, ref: c.groups[ref[0]][1][ref[1]],
    "T": _decode_table,
}
