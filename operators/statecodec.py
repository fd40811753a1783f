"""statecodec.py: the bytes a bin of keyed state travels as (checkpoints, moves), written and checked when read.

Two formats, one per kind of state:

* A :class:`~operators.dictstate.DictState` bin is a document (format tag,
  number of bins, bin, version, ``items``; changes add the ``deleted`` keys)
  written by :mod:`operators.codec` as Arrow IPC, or, for the state of user
  functions only, as cloudpickle whose record batches carry only their own
  rows (:func:`dumps_compact`).
* A :class:`~operators.columnarstate.ColumnarAggState` bin is one Arrow IPC
  stream of its rows: the key, one column per accumulator and, where the
  state keeps them, the keys' last touches; a JSON header and the owner's
  metadata sit in the schema metadata. Changes list the keys they delete
  first, as rows of identity values. A checkpoint writes the bins it copies
  whole, and the changes to the others, as a stream each
  (:func:`encode_bin_stream`): the same columns and a ``bin`` column, the
  rows in the order of the state's slots, each bin's version in the header.

Reading checks what it reads: a payload of another kind, bin or number of
bins is a ``ValueError`` naming it, and a pickled payload is unpickled only
where the state asked for pickles. Separate from the states, which decide
which rows travel and when, so that what a checkpoint keeps and another
process reads sits in one place; separate from :mod:`operators.codec`, which
encodes a closed set of values and never pickles.

Example:
    >>> payload = encode_dict_bin(4, 1, 3, {"a": 10})
    >>> decode_dict_bin(payload, 1, 4)
    DictBin(version=3, items={'a': 10}, deleted=None)
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Iterator, Sequence, TypeAlias

import cloudpickle
import numpy as np
import pyarrow as pa

from . import codec
from .accumulators import Accumulator
from .hashing import bins_from_hashes, hash_keys
from .rowcapture import Pacer

__all__ = [
    "ColumnarBin",
    "ColumnarRows",
    "CopiedRows",
    "BinStream",
    "SharedBins",
    "DictBin",
    "Layout",
    "NEVER_TOUCHED",
    "TOUCHED",
    "stream_bins",
    "checked_keys",
    "columns_of",
    "decode_columnar_bin",
    "decode_bin_stream",
    "decode_dict_bin",
    "dumps_compact",
    "encode_columnar_bin",
    "encode_bin_stream",
    "encode_dict_bin",
]

DICT_FORMAT = "chiray.DictState/1"
COLUMNAR_FORMAT = "chiray.ColumnarAggState/1"
STREAM_FORMAT = "chiray.ColumnarAggState.bins/1"
STREAM_BATCH_ROWS = 1 << 17
"""Rows per record batch of a stream of several bins (:func:`encode_bin_stream`)."""
NEVER_TOUCHED = int(np.iinfo(np.int64).min)
"""The last touch of a key whose time is not known (a bin written by a state that kept none)."""
TOUCHED = "\0touched"
"""The last-touch column among a columnar state's columns (not an accumulator)."""

Layout: TypeAlias = tuple[pa.DataType | None, tuple[Accumulator, ...], bytes]
"""A columnar state's ``(key type, accumulators, owner's metadata)``; the key type is ``None`` until known."""


@dataclasses.dataclass(frozen=True, slots=True)
class DictBin:
    """A bin (or changes to it) of a :class:`~operators.dictstate.DictState` as read.

    Attributes:
        version: the bin's version when written.
        items: key -> value (changes: the keys written since).
        deleted: changes: the keys deleted since; ``None`` for a whole bin.
    """

    version: int
    items: dict[Any, Any]
    deleted: list[Any] | None


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnarBin:
    """A bin (or changes to it) of a :class:`~operators.columnarstate.ColumnarAggState` as read.

    Attributes:
        bin: the bin it is.
        version: the bin's version when written.
        layout: the writer's key type, accumulators and metadata.
        rows: the key, then one column per accumulator.
        touched: the rows' last touches if the payload has them.
        deleted: changes: the keys deleted since; ``None`` for a whole bin.
    """

    bin: int
    version: int
    layout: Layout
    rows: pa.Table
    touched: np.ndarray | None = None
    deleted: pa.Array | None = None

    @property
    def versions(self) -> dict[int, int]:
        """Per bin it holds (this one), its version."""
        return {self.bin: self.version}

    @property
    def row_bins(self) -> np.ndarray:
        """Each row's bin."""
        return np.full(self.rows.num_rows, self.bin, dtype=np.int64)


@dataclasses.dataclass(frozen=True, slots=True)
class ColumnarRows:
    """Rows of several bins of a :class:`~operators.columnarstate.ColumnarAggState` as read from one stream
    (:func:`decode_bin_stream`): the bins whole, or changes to them; read as a :class:`ColumnarBin` is, with a
    bin per row.

    Attributes:
        versions: per bin, its version when written.
        layout: the writer's key type, accumulators and metadata.
        rows: the key, then one column per accumulator (bins mixed).
        row_bins: each row's bin.
        touched: the rows' last touches if the stream has them.
        deleted: changes: the keys deleted from these bins since their previous versions; ``None`` for
            whole bins.
    """

    versions: dict[int, int]
    layout: Layout
    rows: pa.Table
    row_bins: np.ndarray
    touched: np.ndarray | None
    deleted: pa.Array | None


@dataclasses.dataclass(frozen=True)
class BinStream:
    """A checkpoint's rows of several bins as one stream (:func:`encode_bin_stream`): the bins whole, or
    their changes (its header says which).

    Attributes:
        payload: the stream.
        sizes: per bin, the bytes of its rows (its share of the payload, by rows), which bound its chain.
    """

    payload: pa.Buffer
    sizes: dict[int, int]

    def as_read(self) -> dict[int, SharedBins]:
        """Each bin's payload as storage gives it back (:class:`SharedBins`), for ``install_bins`` (whole
        bins) or ``apply_changes``."""
        shared = SharedBins(self.payload)
        return {b: shared for b in self.sizes}


@dataclasses.dataclass(frozen=True, eq=False)
class SharedBins:
    """A stream of several bins as storage gives it back: the same object for each of its bins that a
    restore asks for (:class:`~operators.columnarstate.ColumnarAggState` decodes it once, for those bins)."""

    payload: bytes | pa.Buffer


def encode_dict_bin(num_bins: int, b: int, version: int, items: dict[Any, Any],
                    deleted: list[Any] | None = None, *, pickled: bool = False) -> bytes:
    """Bin ``b`` of a dict state of ``num_bins`` bins (``deleted`` None), or changes to it (``items``
    written, ``deleted`` keys).

    Args:
        pickled: the state of user functions: cloudpickle where there is anything to pickle (an empty
            bin is Arrow IPC all the same).

    Raises:
        TypeError: a key or value :mod:`operators.codec` cannot write, and not ``pickled``.
    """
    doc: dict[str, object] = {"format": DICT_FORMAT, "num_bins": num_bins, "bin": b, "version": version,
                              "items": items}
    if deleted is not None:
        doc["deleted"] = deleted
    if pickled and (items or deleted):  # (nothing to pickle: Arrow IPC, as below)
        return dumps_compact(doc)
    try:
        return codec.encode(doc)
    except TypeError as exc:
        raise TypeError(f"bin {b} of a DictState: {exc} (state of arbitrary Python objects, that of user "
                        "functions, needs DictState(..., pickled=True))") from None


def decode_dict_bin(payload: bytes | SharedBins, b: int, num_bins: int, *, pickled: bool = False) -> DictBin:
    """The inverse of :func:`encode_dict_bin`, for bin ``b`` of a state of ``num_bins`` bins.

    Args:
        pickled: a pickled payload may be unpickled (else it is refused unread).

    Raises:
        ValueError: a payload of another kind, bin or number of bins.
    """
    payload = _not_shared(payload, b, "DictState bin")
    if pickled and codec.is_pickle(payload):
        doc = _unpickle_bin(b, payload)
    else:  # Arrow IPC; a pickle is refused here unread
        doc = codec.decode_document(payload, "DictState", DICT_FORMAT, b)
    _check_place(b, doc["bin"], doc["num_bins"], num_bins)
    return DictBin(int(doc["version"]), doc["items"], doc.get("deleted"))


def _not_shared(payload: bytes | SharedBins, b: int, expected: str) -> bytes:
    """``payload`` unless it is a stream of several bins (``ValueError``)."""
    if isinstance(payload, SharedBins):
        raise ValueError(f"bin {b}: payload is a stream of several bins of a ColumnarAggState, not a {expected}")
    return payload


def _check_place(b: int, written_bin: int, written_num_bins: int, num_bins: int) -> None:
    """Raise ``ValueError`` unless a payload read as bin ``b`` was written as that bin of as many bins."""
    if written_num_bins != num_bins or written_bin != b:
        raise ValueError(
            f"bin {b}: payload is bin {written_bin} of a state with {written_num_bins} bins; "
            f"this state has {num_bins} bins"
        )


def _unpickle_bin(b: int, payload: bytes) -> dict[str, Any]:
    """The document of a pickled bin (``DictState(pickled=True)``: the state of user functions only)."""
    try:
        doc = cloudpickle.loads(payload)
    except Exception as exc:
        raise ValueError(f"bin {b}: payload is not a DictState bin ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != DICT_FORMAT:
        raise ValueError(f"bin {b}: payload is not a DictState bin (format {DICT_FORMAT!r} expected)")
    return doc


def _batch_from_ipc(payload: bytes) -> pa.RecordBatch:
    return pa.ipc.open_stream(payload).read_next_batch()


class _CompactPickler(cloudpickle.CloudPickler):
    """Pickles Arrow record batches as IPC streams: a slice then carries only its own rows.

    (Pickling a slice of a batch would copy the whole buffers it views.)
    """

    def reducer_override(self, obj: object) -> object:
        if isinstance(obj, pa.RecordBatch):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, obj.schema) as writer:
                writer.write_batch(obj)
            return _batch_from_ipc, (sink.getvalue().to_pybytes(),)
        return super().reducer_override(obj)


def dumps_compact(value: object) -> bytes:
    """``cloudpickle.dumps`` whose record batches carry only their own rows (state of rows kept per key)."""
    out = io.BytesIO()
    _CompactPickler(out).dump(value)
    return out.getvalue()


def encode_columnar_bin(num_bins: int, b: int, version: int, layout: Layout, keys: pa.Array | pa.ChunkedArray | None,
                        cols: dict[str, np.ndarray], deleted: pa.Array | None = None) -> bytes:
    """A columnar bin's rows (or its changes), as one Arrow IPC stream: the key, one column per accumulator,
    and ``touched`` where ``cols`` has :data:`TOUCHED`. Changes that delete keys list them first, as
    ``deleted`` rows of identity values (the header counts them)."""
    accs = layout[1]
    if isinstance(keys, pa.ChunkedArray):  # (a slice of keys copied in chunks)
        keys = keys.combine_chunks()
    dead = 0
    if deleted is not None and len(deleted):
        dead = len(deleted)
        keys = deleted if keys is None or not len(keys) else pa.concat_arrays([deleted, keys])
        cols = {n: np.concatenate([np.full(len(deleted), NEVER_TOUCHED if n == TOUCHED else _identity(
            accs, n), dtype=c.dtype), c]) for n, c in cols.items()}
    return _bin_stream(_rows_table(layout, keys, cols), _bin_metadata(num_bins, b, version, layout, dead))


_IPC_OPTIONS = pa.ipc.IpcWriteOptions()  # the defaults, given: the writer reads two environment variables otherwise


def _rows_table(layout: Layout, keys: pa.Array | None, cols: dict[str, np.ndarray]) -> pa.Table:
    """Rows of a columnar state as the columns of its bins' streams (no metadata: each bin has its own)."""
    key_type, accs, _ = layout
    fields = [pa.field("key", key_type or pa.null())]
    fields += [pa.field(f"acc{i}", a.column_type()) for i, a in enumerate(accs)]
    arrays = [keys if keys is not None else pa.nulls(0)]
    arrays += [a.to_arrow(cols[a.name]) for a in accs]
    if TOUCHED in cols:
        fields.append(pa.field("touched", pa.int64()))
        arrays.append(pa.array(cols[TOUCHED], pa.int64()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _bin_metadata(num_bins: int, b: int, version: int, layout: Layout, deleted: int = 0) -> dict[bytes, bytes]:
    header: dict[str, object] = {"num_bins": num_bins, "bin": b, "version": version,
                                 "accumulators": [a.spec() for a in layout[1]]}
    if deleted:
        header["deleted"] = deleted
    return {b"format": COLUMNAR_FORMAT.encode(), b"header": json.dumps(header).encode(), b"meta": layout[2]}


def _bin_stream(rows: pa.Table, metadata: dict[bytes, bytes]) -> bytes:
    table = rows.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    writer = pa.RecordBatchStreamWriter(sink, table.schema, options=_IPC_OPTIONS)
    writer.write_table(table)
    writer.close()
    return sink.getvalue().to_pybytes()


def encode_bin_stream(num_bins: int, versions: dict[int, int], layout: Layout, row_bins: np.ndarray,
                      keys: pa.Array | pa.ChunkedArray | None, cols: dict[str, np.ndarray],
                      deleted: pa.Array | None = None, deleted_bins: np.ndarray | None = None, *,
                      full: bool = False, share: float = 1.0, floor: float | None = None) -> BinStream:
    """Bins ``versions`` (bin -> version) as one Arrow IPC stream: whole (``full``), or their changes. The
    columns of :func:`encode_columnar_bin` and ``bin``; changes that delete keys list them first (``deleted``,
    their bins ``deleted_bins``), as rows of identity values (the header counts them); then the rows in the
    order given. Each bin's size is its share of the stream by rows. It is written a record batch of
    ``STREAM_BATCH_ROWS`` rows at a time, resting between batches so that encoding takes at most ``share`` of
    this thread's time, down to ``floor`` while the processing thread is busy (``rowcapture.Pacer``).

    One stream in place of one per bin: the rows need not be grouped by bin, so the copier takes them in
    the order of the state's slots. At 4M string keys, 222,000 changes were copied and encoded in 50-52 ms of
    CPU time against 113-148 ms for a stream per bin, whose rows were copied bin by bin; a full copy in
    0.23-0.57 s against 1.4-1.7 s, most of which went to putting 4M keys in the order of their bins."""
    accs = layout[1]
    row_bins = np.asarray(row_bins, dtype=np.int32)
    dead = 0
    if deleted is not None and len(deleted):
        if full:
            raise ValueError("bug: whole bins with deleted keys")
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        dead = len(deleted)
        keys = deleted if keys is None or not len(keys) else pa.concat_arrays([deleted, keys])
        cols = {n: np.concatenate([np.full(dead, NEVER_TOUCHED if n == TOUCHED else _identity(accs, n),
                                           dtype=c.dtype), c]) for n, c in cols.items()}
        row_bins = np.concatenate([np.asarray(deleted_bins, dtype=np.int32), row_bins])
    rows = _rows_table(layout, keys, cols)  # (the keys as they were copied: a chunk of them per record batch)
    rows = rows.append_column(pa.field("bin", pa.int32()), pa.array(row_bins, pa.int32()))
    header: dict[str, object] = {"num_bins": num_bins, "versions": [[b, v] for b, v in sorted(versions.items())],
                                 "accumulators": [a.spec() for a in accs], "full": full, "deleted": dead}
    table = rows.replace_schema_metadata({b"format": STREAM_FORMAT.encode(), b"header": json.dumps(header).encode(),
                                          b"meta": layout[2]})
    batches = table.to_batches(max_chunksize=STREAM_BATCH_ROWS)
    # Written into one buffer of the stream's size, measured first (a pass that copies nothing): a stream
    # that grows as it is written copies itself at every growth into fresh memory, and fresh memory costs
    # its first touch (for a full copy of 4M keys, 137 MB, 350-520 ms of CPU time against 100 ms)
    measure = pa.MockOutputStream()
    with pa.RecordBatchStreamWriter(measure, table.schema, options=_IPC_OPTIONS) as writer:
        for batch in batches:
            writer.write_batch(batch)
    payload = pa.allocate_buffer(measure.size())
    pacer = Pacer(share, floor=floor)
    with pa.RecordBatchStreamWriter(pa.FixedSizeBufferWriter(payload), table.schema, options=_IPC_OPTIONS) as writer:
        for batch in batches:
            writer.write_batch(batch)
            pacer.rest()
    counts = np.bincount(row_bins, minlength=num_bins)
    per_row = len(payload) / max(len(row_bins), 1)
    return BinStream(payload, {b: max(round(int(counts[b]) * per_row), 1) for b in versions})


def _stream_header(payload: bytes | pa.Buffer) -> tuple[pa.RecordBatchStreamReader, dict[str, Any]]:
    try:
        reader = pa.ipc.open_stream(payload)
        metadata = reader.schema.metadata or {}
        if metadata.get(b"format") != STREAM_FORMAT.encode():
            raise ValueError(f"format {STREAM_FORMAT!r} expected")
        return reader, json.loads(metadata[b"header"])
    except (pa.ArrowInvalid, ValueError, KeyError) as exc:
        raise ValueError(f"payload is not a stream of ColumnarAggState bins ({exc})") from exc


def stream_bins(payload: bytes | pa.Buffer) -> dict[int, int]:
    """The bins a stream of :func:`encode_bin_stream` holds, and their versions (its header alone is read).

    Raises:
        ValueError: not such a stream.
    """
    return {int(b): int(v) for b, v in _stream_header(payload)[1]["versions"]}


def decode_bin_stream(payload: bytes | pa.Buffer, bins: set[int], num_bins: int) -> ColumnarRows:
    """The rows of ``bins`` in a stream of :func:`encode_bin_stream` (the rows of other bins left out), for a
    state of ``num_bins`` bins.

    Raises:
        ValueError: not such a stream, one of another number of bins, or one without some bin of ``bins``.
    """
    reader, header = _stream_header(payload)
    if int(header["num_bins"]) != num_bins:
        raise ValueError(f"bins written with {header['num_bins']} bins, not {num_bins}")
    versions = {int(b): int(v) for b, v in header["versions"]}
    missing = sorted(set(bins) - set(versions))
    if missing:
        raise ValueError(f"the stream does not hold bin {missing[0]}")
    table = reader.read_all()
    accs = tuple(_accumulator(spec, table.schema.field(i).type)
                 for i, spec in enumerate(header["accumulators"], start=1))
    layout = (table.schema.field(0).type, accs, (table.schema.metadata or {}).get(b"meta", b""))
    row_bins = table.column("bin").to_numpy().astype(np.int64)
    table = table.drop_columns(["bin"])
    dead = int(header["deleted"])
    if len(bins) < len(versions):  # a rescale's restore: some of its bins went elsewhere
        asked = np.zeros(num_bins, dtype=bool)
        asked[list(bins)] = True
        keep = asked[row_bins]
        table, row_bins = table.filter(pa.array(keep)), row_bins[keep]
        dead = int(np.count_nonzero(keep[:dead]))
    touched = None
    if table.schema.names[-1] == "touched":
        touched = table.column("touched").to_numpy()[dead:]
        table = table.drop_columns(["touched"])
    deleted = None if header.get("full") else table.column(0).slice(0, dead).combine_chunks()
    return ColumnarRows({b: versions[b] for b in sorted(bins)}, layout, table.slice(dead), row_bins[dead:],
                        touched, deleted)


def decode_columnar_bin(payload: bytes | SharedBins, b: int, num_bins: int) -> ColumnarBin:
    """The inverse of :func:`encode_columnar_bin`, for bin ``b`` of a state of ``num_bins`` bins.

    Raises:
        ValueError: a payload of another kind, bin or number of bins.
    """
    payload = _not_shared(payload, b, "ColumnarAggState bin")
    try:
        table = pa.ipc.open_stream(payload).read_all()
        metadata = table.schema.metadata or {}
        if metadata.get(b"format") != COLUMNAR_FORMAT.encode():
            raise ValueError(f"format {COLUMNAR_FORMAT!r} expected")
        header = json.loads(metadata[b"header"])
    except (pa.ArrowInvalid, ValueError, KeyError) as exc:
        raise ValueError(f"bin {b}: payload is not a ColumnarAggState bin ({exc})") from exc
    _check_place(b, header["bin"], header["num_bins"], num_bins)
    accs = tuple(_accumulator(spec, table.schema.field(i).type)
                 for i, spec in enumerate(header["accumulators"], start=1))
    layout = (table.schema.field(0).type, accs, metadata.get(b"meta", b""))
    touched = None
    if table.num_columns > len(accs) + 1 and table.schema.field(len(accs) + 1).name == "touched":
        touched = table.column(len(accs) + 1).to_numpy()
        table = table.drop_columns(["touched"])
    deleted = header.get("deleted")
    if deleted is not None:  # changes: the first rows name deleted keys
        touched = None if touched is None else touched[deleted:]
        return ColumnarBin(b, int(header["version"]), layout, table.slice(deleted),
                           touched, table.column(0).slice(0, deleted).combine_chunks())
    return ColumnarBin(b, int(header["version"]), layout, table, touched)


@dataclasses.dataclass(frozen=True)
class CopiedRows:
    """Rows of some bins of a columnar state, copied out of it to be encoded per bin later (e.g. in another
    thread: the state may change meanwhile).

    Attributes:
        num_bins: the state's number of bins.
        layout: the state's key type, accumulators and metadata.
        versions: per bin to encode (ascending), its version.
        row_bins: each row's bin, ascending.
        keys: each row's key; ``None`` for a state not configured (it has no rows).
        cols: per column (accumulators, :data:`TOUCHED`), each row's value.
        deleted: changes: the keys deleted from these bins (any order); ``None`` for none.
        deleted_bins: the bin of each key of ``deleted``.
    """

    num_bins: int
    layout: Layout
    versions: dict[int, int]
    row_bins: np.ndarray
    keys: pa.Array | pa.ChunkedArray | None
    cols: dict[str, np.ndarray]
    deleted: pa.Array | None = None
    deleted_bins: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def encode(self, share: float = 1.0, floor: float | None = None) -> dict[int, bytes]:
        """Each bin as :func:`encode_columnar_bin` writes it (with its deleted keys: changes); encoding takes
        at most ``share`` of this thread's time, down to ``floor`` while the processing thread is busy
        (:class:`~operators.rowcapture.Pacer`)."""
        wanted = list(self.versions)
        bounds = np.searchsorted(self.row_bins, wanted + [self.num_bins])
        gone, gone_bins = self.deleted, self.deleted_bins
        if gone is not None:
            order = np.argsort(gone_bins, kind="stable")
            gone, gone_bins = gone.take(order), gone_bins[order]
        gone_bounds = np.searchsorted(gone_bins, wanted + [self.num_bins])
        keys = self.keys.combine_chunks() if isinstance(self.keys, pa.ChunkedArray) else self.keys
        # the columns converted once; a bin without deletions is a slice of them (most bins: converting
        # per bin cost more than its encoding)
        rows = _rows_table(self.layout, keys, self.cols) if keys is not None else None
        out = {}
        pacer = Pacer(share, floor=floor)
        for i, b in enumerate(wanted):
            pacer.rest()
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            dlo, dhi = int(gone_bounds[i]), int(gone_bounds[i + 1])
            if rows is not None and dhi == dlo:
                out[b] = _bin_stream(rows.slice(lo, hi - lo),
                                     _bin_metadata(self.num_bins, b, self.versions[b], self.layout))
                continue
            part = keys.slice(lo, hi - lo) if keys is not None else None
            dead = gone.slice(dlo, dhi - dlo) if gone is not None and dhi > dlo else None
            out[b] = encode_columnar_bin(self.num_bins, b, self.versions[b], self.layout, part,
                                         {n: c[lo:hi] for n, c in self.cols.items()}, dead)
        return out


def checked_keys(filled: Sequence[ColumnarBin | ColumnarRows], num_bins: int,
                 doing: str) -> tuple[pa.Array, np.ndarray]:
    """The keys of decoded bins of a state of ``num_bins`` bins, all checked to belong to the bin they came
    in, and their hashes (hashed once: a key index stores the same hashes).

    Raises:
        ValueError: a payload holds keys of another bin (``doing`` says what was being done).
    """
    keys = pa.concat_arrays([d.rows.column(0).combine_chunks() for d in filled])
    expected = np.concatenate([d.row_bins for d in filled])
    hashes = hash_keys(keys)
    stray = np.flatnonzero(bins_from_hashes(hashes, num_bins) != expected)
    if stray.size:
        raise ValueError(f"cannot {doing} {int(expected[stray[0]])}: the payload holds keys of other bins")
    return keys, hashes


def columns_of(filled: Sequence[ColumnarBin | ColumnarRows], accumulators: Sequence[Accumulator],
               touched: bool) -> Iterator[tuple[str, np.ndarray]]:
    """The rows of decoded bins as state columns, one ``(name, values)`` at a time: per accumulator, then
    :data:`TOUCHED` where ``touched`` (a bin written without touches gives ``NEVER_TOUCHED``)."""
    for i, acc in enumerate(accumulators, start=1):
        yield acc.name, np.concatenate([acc.from_arrow(d.rows.column(i)) for d in filled])
    if touched:
        yield TOUCHED, np.concatenate(
            [d.touched if d.touched is not None else np.full(d.rows.num_rows, NEVER_TOUCHED) for d in filled])


def _identity(accs: Sequence[Accumulator], name: str) -> object:
    """The identity of accumulator ``name`` (what a deleted key's row holds in a payload)."""
    return next(a for a in accs if a.name == name).identity()


def _accumulator(spec: list[Any], column_type: pa.DataType) -> Accumulator:
    """An accumulator from its header entry (:meth:`Accumulator.spec`, read as JSON) and its column's type."""
    name, op, dtype, *links = spec
    count, rank = (links + [None, None])[:2]
    return Accumulator(name, op, dtype, column_type if dtype == "object" else None, count, rank)
