"""state.py: keyed state stored per bin, the unit of migration and checkpointing.

A key's *bin* is ``hashing.bins_of(key, num_bins)``, the same function the
router uses, so the instance that receives a key is the one whose state holds
it. Every keyed state implements :class:`BinnedState`: it lists its bins,
serialises chosen bins (``snapshot_bins`` copies, ``extract_bins`` moves them
out) and merges bins serialised by another instance of the same kind
(``install_bins``), possibly in another process.

Two implementations:

* :class:`DictState`: ``bin -> {key: value}`` of Python values; bins travel
  as Arrow IPC (:mod:`operators.codec`: built-in operators' rows and timers,
  never pickled), or, for the state of user functions (keyed ``reduce`` and
  ``process``: arbitrary Python objects), as cloudpickle (``pickled=True``).
* :class:`ColumnarAggState`: the fast path of built-in aggregations; keys map
  to dense *slots* (a :class:`~operators.keyindex.KeyIndex`), accumulators are
  NumPy columns indexed by slot; bins travel as Arrow IPC streams.

Versions: each bin has a counter, incremented by every write to it. It travels
with the bin: ``install_bins`` sets it to the larger of the local and the
carried value, so a bin's version never decreases on one instance and a
replica can tell whether it is current.

Changes (incremental checkpoints): a state that ``tracks_changes`` can
serialise, per bin, only what changed since a version of it that an earlier
checkpoint wrote (:meth:`BinnedState.snapshot_changes_later`: the rows written
since, and the keys deleted); :meth:`BinnedState.restore_bins` installs a full
copy and applies such changes over it, oldest first. A bin installed here
(moved in, restored) has no known past here: its changes are only known from
its version at arrival on.

Only the instance that owns a state object touches it (single thread).
"""

from __future__ import annotations

import abc
import dataclasses
import io
import json
import sys
from typing import Callable, Any, Iterable, Iterator, Mapping, Sequence

import cloudpickle
import numpy as np
import pyarrow as pa

from . import codec
from .hashing import bins_from_hashes, check_num_bins, hash_keys
from .binslots import BinSlots
from .changedkeys import ChangedKeys
from .deletedkeys import DeletedKeys
from .growable import grown
from .keyindex import KeyIndex

__all__ = [
    "BinnedState",
    "DictState",
    "Accumulator",
    "ColumnarAggState",
]

_DICT_FORMAT = "chiray.DictState/1"
_ABSENT = object()
_NO_ENTRIES: dict[Any, Any] = {}  # read only: the entries of a bin that has none
_IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None)})
_COLUMNAR_FORMAT = "chiray.ColumnarAggState/1"
COMPACT_LIVE = 1 / 32
"""A columnar state compacts its slots once fewer than this share of them hold live keys."""
NEVER_TOUCHED = int(np.iinfo(np.int64).min)
"""The last touch of a key whose time is not known (a bin written by a state that kept none)."""
_TOUCHED = "\0touched"  # the last-touch column among a columnar state's columns (not an accumulator)


def _ready() -> None:
    """Nothing to wait for."""


class BinnedState(abc.ABC):
    """Keyed state partitioned into ``num_bins`` bins (the contract all keyed state offers)."""

    tracks_changes = False
    """Whether :meth:`snapshot_changes_later` can serialise the changes of a bin since an earlier version
    (else a checkpoint writes every bin whole)."""

    def __init__(self, num_bins: int) -> None:
        self._num_bins = check_num_bins(num_bins)
        self._versions = np.zeros(self._num_bins, dtype=np.int64)
        self._arrived = np.full(self._num_bins, -1, dtype=np.int64)  # per bin: its version when last installed
        self.installs = 0  # bins installed (or changes applied) so far: their keys' past is news to the owner

    @property
    def num_bins(self) -> int:
        """The number of bins (a power of two, fixed for the state's life)."""
        return self._num_bins

    def version(self, bin: int) -> int:
        """The write counter of ``bin`` (0 if it was never written nor installed here)."""
        return int(self._versions[self._check_bin(bin)])

    @abc.abstractmethod
    def bins(self) -> list[int]:
        """The bins that hold at least one key, ascending."""

    def reserve(self, keys: int) -> None:
        """A hint before bins arrive: ``keys`` keys in all will be held (default: nothing to do)."""

    def retire(self) -> None:
        """A hint as bins leave: every bin will leave (a scale-in retires this state's instance), so
        nothing is worth reorganising for the keys left (default: nothing to do)."""

    @abc.abstractmethod
    def bin_key_counts(self) -> dict[int, int]:
        """Number of keys per non-empty bin."""

    @abc.abstractmethod
    def bin_sizes(self) -> dict[int, int]:
        """Approximate bytes per non-empty bin."""

    def prepare_moves(self) -> Callable[[], None]:
        """Bins may move soon (a rescale's planner asked for this state's metrics): get ready without
        stalling the owner. Returns a function that waits until ready, safe to call from another
        thread. By default nothing to do."""
        return _ready

    def snapshot_later(self, bins: Iterable[int]) -> Callable[[], dict[int, bytes]]:
        """Capture ``bins`` now; serialise them when the returned function is called (off the hot path).

        The state may change after this returns; the function still gives the bins as they were.
        """
        data = self.snapshot_bins(bins)
        return lambda: data

    @abc.abstractmethod
    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        """Serialise ``bins`` (a copy: the state keeps them). Empty bins give empty payloads."""

    @abc.abstractmethod
    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        """Serialise ``bins`` and remove them from this state."""

    @abc.abstractmethod
    def install_bins(self, data: Mapping[int, bytes]) -> None:
        """Merge bins serialised by a state of the same kind.

        Raises:
            ValueError: if a bin is already present here and non-empty, or a
                payload is of another kind, layout or number of bins. Nothing
                is installed when an error is raised.
        """

    def extract_changes(self, since: Mapping[int, int]) -> dict[int, bytes] | None:
        """Remove the bins of ``since`` and serialise, per bin ``b``, only its keys written after
        version ``since[b]`` (a copy of the bin at that version, e.g. a replica, plus these rows is
        the bin now: see :meth:`apply_changes`).

        Returns ``None``, removing nothing, where this kind of state does not track the writes of
        single keys: the caller then moves the whole bins (:meth:`extract_bins`).
        """
        return None

    def apply_changes(self, data: Mapping[int, bytes]) -> None:
        """Write the rows :meth:`extract_changes` serialised over the bins present here (keys in
        them take the rows' values; other keys are added).

        Raises:
            NotImplementedError: this kind of state does not track changes.
            ValueError: a payload of another kind, layout or number of bins.
        """
        raise NotImplementedError(f"{type(self).__name__} does not track changes of single keys")

    def changes_since(self, since: Mapping[int, int]) -> set[int]:
        """Of the bins of ``since`` (bin -> a version an earlier checkpoint wrote), those whose changes since
        that version :meth:`snapshot_changes_later` can serialise; the others need a full copy.

        A bin installed here after that version is one of the others: what changed before its arrival is
        not known here. None at all for a state that does not ``tracks_changes``.
        """
        if not self.tracks_changes:
            return set()
        return {b for b, v in since.items() if int(self._arrived[self._check_bin(b)]) <= v}

    def snapshot_changes_later(self, full: Iterable[int],
                               since: Mapping[int, int]) -> Callable[[], tuple[dict[int, bytes], dict[int, bytes]]]:
        """Capture now bins ``full`` whole and, of the bins of ``since``, the changes after those versions
        (bins :meth:`changes_since` gave); serialise them when the returned function is called.

        Returns:
            A function returning (full copies per bin, changes per bin); :meth:`restore_bins` (or
            :meth:`apply_changes` over the bin as it was) reads the changes.

        Raises:
            ValueError: a bin of ``since`` whose changes this state cannot serialise.
        """
        if since:
            raise ValueError(f"{type(self).__name__} does not track changes: bins {sorted(since)} must be written whole")
        encode = self.snapshot_later(full)
        return lambda: (encode(), {})

    def restore_bins(self, full: Mapping[int, bytes], changes: Sequence[Mapping[int, bytes]] = ()) -> None:
        """Install bins from a checkpoint: their full copies, then each round of changes over them, in order.

        Raises:
            ValueError: as :meth:`install_bins` and :meth:`apply_changes`.
        """
        self.install_bins(full)
        for part in changes:
            if part:
                self.apply_changes(part)

    def _check_bin(self, bin: int) -> int:
        if not 0 <= bin < self._num_bins:
            raise ValueError(f"bin must be in [0, {self._num_bins}), got {bin!r}")
        return int(bin)

    def _check_bins(self, bins: Iterable[int]) -> list[int]:
        return sorted({self._check_bin(b) for b in bins})

    def _carry_version(self, bin: int, version: int) -> None:
        """``bin`` is installed (or changes applied to it) at ``version``: its past here is unknown."""
        self._versions[bin] = max(int(self._versions[bin]), int(version))
        self._arrived[bin] = self._versions[bin]
        self.installs += 1


class DictState(BinnedState):
    """General keyed state: ``bin -> {key: value}`` of Python values.

    Keys are Python values (``Array.to_pylist()`` items). By default keys and
    values are of the types :mod:`operators.codec` encodes (record batches and
    tables, numbers, strings, containers of them...) and bins travel as its
    Arrow IPC: nothing is pickled, and :meth:`install_bins` refuses a pickled
    payload without unpickling it. This is the state of built-in operators.

    ``pickled=True``: values are any cloudpickle-able objects and bins travel
    as cloudpickle (record batches inside as IPC streams of their own rows).
    Only the state of user functions (per-key accumulators and values of
    keyed ``reduce``, ``process`` and timers) is kept so, since it holds
    arbitrary user objects: installing such a bin unpickles it. (An empty
    bin is written as Arrow IPC all the same, and either form is read.)

    ``track_changes=True``: a checkpoint may write only the keys of a bin
    written or deleted since the bin's previous checkpoint (``tracks_changes``;
    :mod:`operators.changedkeys`). Every change must then go through
    :meth:`put`, :meth:`delete` or :meth:`touch`: a value changed in place and
    not put back would be missed. The owner of user values that a function may
    change in place (``process``) touches the keys it handed out.

    Example:
        >>> s = DictState(4)
        >>> s.put("a", 1, 10); s.get("a", 1), s.version(1), s.bins()
        (10, 1, [1])
    """

    def __init__(self, num_bins: int, pickled: bool = False, track_changes: bool = False) -> None:
        super().__init__(num_bins)
        self.pickled = pickled
        self.tracks_changes = track_changes
        self._bins: dict[int, dict[Any, Any]] = {}
        self._changed = ChangedKeys()  # followed only for bins a checkpoint captured (``track_changes``)

    def get(self, key: Any, bin: int, default: Any = None) -> Any:
        """The value of ``key`` (in ``bin``), or ``default``."""
        entries = self._bins.get(bin)
        return default if entries is None else entries.get(key, default)

    def put(self, key: Any, bin: int, value: Any) -> None:
        """Set the value of ``key`` (in ``bin``); a write to ``bin``."""
        entries = self._bins.get(bin)
        if entries is None:
            entries = self._bins[self._check_bin(bin)] = {}
        entries[key] = value
        self._versions[bin] += 1
        self._changed.note(bin, key)

    def touch(self, key: Any, bin: int) -> None:
        """A write to ``key`` (in ``bin``) that keeps its value, if present and of a type that can change in
        place (not a number, string or bytes): the next checkpoint writes it again."""
        entries = self._bins.get(bin)
        if entries is not None and key in entries and type(entries[key]) not in _IMMUTABLE:
            self._versions[bin] += 1
            self._changed.note(bin, key)

    def delete(self, key: Any, bin: int) -> None:
        """Remove ``key`` (in ``bin``) if present; a write to ``bin`` if it was."""
        entries = self._bins.get(bin)
        if entries is None or key not in entries:
            return
        del entries[key]
        self._versions[bin] += 1
        self._changed.note(bin, key)
        if not entries:
            del self._bins[bin]

    def get_many(self, keys: Sequence[Any], bins: Sequence[int]) -> list[Any]:
        """The value of each ``keys[i]`` (in ``bins[i]``), ``None`` where it has none: one pass over a batch's keys."""
        tables, none = self._bins, _NO_ENTRIES
        return [tables.get(b, none).get(k) for k, b in zip(keys, bins)]

    def write_many(self, keys: Sequence[Any], bins: np.ndarray, values: Sequence[Any]) -> None:
        """Set each ``keys[i]`` (in ``bins[i]``) to ``values[i]``, or delete it where that is ``None``.

        One write to its bin per key, whether its value is new, the same object changed in place or the
        same immutable value: the next checkpoint writes every key given (what :meth:`put` and
        :meth:`touch` per key would, for a caller that handed every value out to be changed).
        """
        tables = self._bins
        for k, b, v in zip(keys, bins.tolist(), values):
            entries = tables.get(b)
            if v is not None:
                if entries is None:
                    entries = tables[self._check_bin(b)] = {}
                entries[k] = v
            elif entries is not None and entries.pop(k, _ABSENT) is not _ABSENT and not entries:
                del tables[b]
        self._versions += np.bincount(bins, minlength=self._num_bins)
        self._changed.note_many(bins.tolist(), keys)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every ``(key, value)``, bin by bin in ascending bin order."""
        for b in sorted(self._bins):
            yield from self._bins[b].items()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._bins.values())

    def bins(self) -> list[int]:
        return sorted(self._bins)

    def bin_key_counts(self) -> dict[int, int]:
        return {b: len(self._bins[b]) for b in sorted(self._bins)}

    def bin_sizes(self) -> dict[int, int]:
        """Approximate bytes per non-empty bin (shallow sizes of keys and values; O(keys))."""
        size = sys.getsizeof
        return {b: sum(size(k) + size(v) for k, v in e.items()) for b, e in sorted(self._bins.items())}

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        return {b: self._encode(b) for b in self._check_bins(bins)}

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        out = self.snapshot_bins(bins)
        self.drop_bins(out)
        return out

    def drop_bins(self, bins: Iterable[int]) -> None:
        """Remove ``bins`` without serialising them (a composite state that serialised them itself)."""
        wanted = self._check_bins(bins)
        for b in wanted:
            self._bins.pop(b, None)
        self._changed.forget(wanted)

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        decoded = {self._check_bin(b): self._decode(b, payload) for b, payload in data.items()}
        for b, (_, entries, deleted) in decoded.items():
            if deleted is not None:
                raise ValueError(f"cannot install bin {b}: the payload holds changes, not a bin (apply_changes)")
            if entries and self._bins.get(b):
                raise ValueError(f"cannot install bin {b}: it is already present here with {len(self._bins[b])} keys")
        for b, (version, entries, _) in decoded.items():
            if entries:
                self._bins[b] = entries
            self._carry_version(b, version)
        self._changed.forget(decoded)

    def changes_since(self, since: Mapping[int, int]) -> set[int]:
        """As :meth:`BinnedState.changes_since`: bins followed since exactly that version, with fewer keys
        changed than the bin holds (else a full copy is as small)."""
        return {b for b in super().changes_since(since) if self._changed.known_since(b, since[b])
                and len(self._changed.keys(b)) <= len(self._bins.get(b, ()))}

    def snapshot_changes_later(self, full: Iterable[int],
                               since: Mapping[int, int]) -> Callable[[], tuple[dict[int, bytes], dict[int, bytes]]]:
        """As :meth:`BinnedState.snapshot_changes_later`; serialises at once (values may be changed in place
        later) and follows the captured bins afresh from their versions now."""
        whole = self._check_bins(full)
        if not self.tracks_changes and since:
            return super().snapshot_changes_later(whole, since)
        unknown = set(since) - self.changes_since(since)
        if unknown:
            raise ValueError(f"the changes of bins {sorted(unknown)} since the versions asked for are not known here")
        out = {b: self._encode(b) for b in whole}, {b: self._encode_changes(b) for b in since}
        if self.tracks_changes:
            captured = whole + list(since)
            self._changed.restart(captured, {b: int(self._versions[b]) for b in captured})
        return lambda: out

    def apply_changes(self, data: Mapping[int, bytes]) -> None:
        """Apply the changes :meth:`snapshot_changes_later` serialised: keys take the payload's values, and
        the keys it lists as deleted are removed.

        Raises:
            ValueError: a payload of another kind or number of bins, or a full bin.
        """
        decoded = {self._check_bin(b): self._decode(b, payload) for b, payload in data.items()}
        for b, (_, _, deleted) in decoded.items():
            if deleted is None:
                raise ValueError(f"cannot apply changes to bin {b}: the payload is a full bin (install_bins)")
        for b, (version, items, deleted) in decoded.items():
            entries = self._bins.setdefault(b, {})
            entries.update(items)
            for key in deleted or ():
                entries.pop(key, None)
            if not entries:
                del self._bins[b]
            self._carry_version(b, version)
        self._changed.forget(decoded)

    def _encode_changes(self, b: int) -> bytes:
        entries = self._bins.get(b, {})
        changed = self._changed.keys(b)
        return self._encode(b, {k: entries[k] for k in changed if k in entries}, [k for k in changed if k not in entries])

    def _encode(self, b: int, items: dict[Any, Any] | None = None, deleted: list[Any] | None = None) -> bytes:
        """Bin ``b`` (``items``, ``deleted`` None), or changes to it: ``items`` written, ``deleted`` keys."""
        doc = {"format": _DICT_FORMAT, "num_bins": self._num_bins, "bin": b, "version": int(self._versions[b]),
               "items": dict(self._bins.get(b, {})) if items is None else items}
        if deleted is not None:
            doc["deleted"] = deleted
        if self.pickled and (doc["items"] or deleted):  # (nothing to pickle: Arrow IPC, as below)
            return dumps_compact(doc)
        try:
            return codec.encode(doc)
        except TypeError as exc:
            raise TypeError(f"bin {b} of a DictState: {exc} (state of arbitrary Python objects, that of user "
                            "functions, needs DictState(..., pickled=True))") from None

    def _decode(self, b: int, payload: bytes) -> tuple[int, dict[Any, Any], list[Any] | None]:
        """(version, items, deleted keys: None for a full bin)."""
        if self.pickled and codec.is_pickle(payload):
            doc = _unpickle_bin(b, payload)
        else:  # Arrow IPC; a pickle is refused here unread
            doc = codec.decode_document(payload, "DictState", _DICT_FORMAT, b)
        if doc["num_bins"] != self._num_bins or doc["bin"] != b:
            raise ValueError(
                f"bin {b}: payload is bin {doc['bin']} of a state with {doc['num_bins']} bins; "
                f"this state has {self._num_bins} bins"
            )
        return int(doc["version"]), doc["items"], doc.get("deleted")


def _unpickle_bin(b: int, payload: bytes) -> dict[str, Any]:
    """The document of a pickled bin (``DictState(pickled=True)``: the state of user functions only)."""
    try:
        doc = cloudpickle.loads(payload)
    except Exception as exc:
        raise ValueError(f"bin {b}: payload is not a DictState bin ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != _DICT_FORMAT:
        raise ValueError(f"bin {b}: payload is not a DictState bin (format {_DICT_FORMAT!r} expected)")
    return doc


def _batch_from_ipc(payload: bytes) -> pa.RecordBatch:
    return pa.ipc.open_stream(payload).read_next_batch()


class _CompactPickler(cloudpickle.CloudPickler):
    """Pickles Arrow record batches as IPC streams: a slice then carries only its own rows.

    (Pickling a slice of a batch would copy the whole buffers it views.)
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, pa.RecordBatch):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, obj.schema) as writer:
                writer.write_batch(obj)
            return _batch_from_ipc, (sink.getvalue().to_pybytes(),)
        return super().reducer_override(obj)


def dumps_compact(value: Any) -> bytes:
    """``cloudpickle.dumps`` whose record batches carry only their own rows (state of rows kept per key)."""
    out = io.BytesIO()
    _CompactPickler(out).dump(value)
    return out.getvalue()


PICK_OPS = ("first", "last", "argmin", "argmax")
"""Object accumulators that keep one value per key, replaced when a batch's value wins."""


@dataclasses.dataclass(frozen=True, slots=True)
class Accumulator:
    """One NumPy state column of a :class:`ColumnarAggState`.

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

    def identity(self) -> Any:
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

    def spec(self) -> list[Any]:
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


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of ``values`` as they are (lists, dicts and tuples stay one element each)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


class ColumnarAggState(BinnedState):
    """Columnar keyed state for built-in aggregations (the fast path).

    Keys live in dense *slots* of a :class:`~operators.keyindex.KeyIndex`;
    each :class:`Accumulator` is a NumPy column indexed by slot, grown
    geometrically, beside the bin of every slot, and beside the version of its
    bin when the slot was last written (``extract_changes``). Extracted bins
    leave tombstones; a key extracted and seen again gets its slot back, and
    slot numbers change only when the tombstones are compacted away.

    Lifecycle: ``UNCONFIGURED --configure() or install_bins()--> CONFIGURED``.
    The owner (an aggregation logic) configures the key type and accumulators
    on its first batch; a fresh instance may instead learn them from the bins
    it installs. ``meta`` is opaque bytes the owner attaches (e.g. its output
    schema); it travels with every bin.

    Example:
        >>> s = ColumnarAggState(8)
        >>> s.configure(pa.string(), [Accumulator("n", "sum", "int64")])
        >>> slots = s.update(pa.array(["a", "b"]), {"n": np.array([2, 3])})
        >>> s.keys_at(s.slots()).to_pylist(), s.values(s.slots())["n"].tolist()
        (['a', 'b'], [2, 3])
    """

    tracks_changes = True

    _n: int
    _bin: np.ndarray
    _stamp: np.ndarray
    _cols: dict[str, np.ndarray]
    _index: KeyIndex

    def __init__(self, num_bins: int, *, index_hash_bits: int = 64, touched: bool = False) -> None:
        """Create an empty, unconfigured state.

        Args:
            num_bins: a power of two.
            index_hash_bits: hash bits the key index's table uses; lower it
                only to exercise the hash-collision path in tests.
            touched: keep each key's last touch (an int64 the owner gives with
                every :meth:`update`, e.g. a time) for :meth:`expire`; it travels
                with the rows. A bin from a state without it arrives untouched
                (``NEVER_TOUCHED``), and a state without it ignores it.
        """
        super().__init__(num_bins)
        self._index_hash_bits = index_hash_bits
        self.tracks_touch = touched
        self._deleted = DeletedKeys(num_bins)  # keys deleted singly (expire), for the changes since a version
        self._key_type: pa.DataType | None = None
        self._accs: tuple[Accumulator, ...] = ()
        self._meta = b""
        self._reserved = 0  # keys to make room for once configured (``reserve``)
        self._retiring = False  # every bin will leave: no compaction (``retire``)
        self._reset(0)

    def configure(self, key_type: pa.DataType, accumulators: Sequence[Accumulator], meta: bytes = b"") -> None:
        """Set the key type, the accumulators and the owner's metadata (again only identically).

        Raises:
            ValueError: if already configured differently, or names repeat.
        """
        accs = tuple(accumulators)
        if len({a.name for a in accs}) != len(accs):
            raise ValueError(f"accumulator names must be unique, got {[a.name for a in accs]}")
        if self._key_type is not None:
            if self.layout != (key_type, accs, bytes(meta)):
                raise ValueError(
                    f"state already configured with key type {self._key_type} and accumulators "
                    f"{list(self._accs)}; got key type {key_type} and accumulators {list(accs)}"
                )
            return
        self._key_type, self._accs, self._meta = key_type, accs, bytes(meta)
        self._reset(self._reserved)

    @property
    def configured(self) -> bool:
        """Whether the key type and accumulators are known."""
        return self._key_type is not None

    @property
    def layout(self) -> tuple[pa.DataType | None, tuple[Accumulator, ...], bytes]:
        """``(key_type, accumulators, meta)``; the key type is ``None`` until configured."""
        return self._key_type, self._accs, self._meta

    def __len__(self) -> int:
        return self._n - self._dead

    def update(self, keys: pa.Array, partials: Mapping[str, np.ndarray],
               touched: np.ndarray | None = None) -> np.ndarray:
        """Combine per-key partial accumulators into the state (a write to their bins).

        Args:
            keys: distinct keys (as :func:`~operators.keyindex.encode_keys` returns them).
            partials: per accumulator name, one value per key (the
                accumulator's identity where a key contributes nothing).
            touched: a state that ``tracks_touch``: per key, its touch now (a
                key keeps the larger of this and its last one).

        Returns:
            The slot of each key (new keys get new slots).
        """
        if self._key_type is None:
            raise ValueError("ColumnarAggState.update() called before configure()")
        if set(partials) != {a.name for a in self._accs}:
            raise ValueError(f"partials given for {sorted(partials)}; expected {[a.name for a in self._accs]}")
        slots, new = self._index.upsert(keys)
        if new.size:
            self._grow(slots[new])
        if self._dead:  # keys of an extracted bin seen again: they start over in their old slots
            revived = slots[self._bin[slots] == self._num_bins]
            if revived.size:
                self._bin[revived] = bins_from_hashes(self._index.hashes(revived), self._num_bins)
                self._came_back(revived)
                for acc in self._accs:
                    self._cols[acc.name][revived] = acc.identity()
                if self.tracks_touch:
                    self._cols[_TOUCHED][revived] = NEVER_TOUCHED
                self._dead -= len(revived)
        taken = {acc.name: self._taken(acc, slots, partials) for acc in self._accs if acc.op in PICK_OPS}
        for acc in self._accs:
            column, part = self._cols[acc.name], partials[acc.name]
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
        if touched is not None and self.tracks_touch:
            last = self._cols[_TOUCHED]
            last[slots] = np.maximum(last[slots], touched)
        self._versions += np.bincount(self._bin[slots], minlength=self._num_bins) > 0
        self._stamp[slots] = self._versions[self._bin[slots]]
        return slots

    def expire(self, cutoff: int, fill: int) -> tuple[pa.Array, dict[str, np.ndarray], int | None]:
        """Delete every key last touched at or before ``cutoff`` (one vectorised pass over the slots).

        Each bin that loses keys takes a new version (a write to it); the deleted keys are remembered
        with it, so that its changes since an earlier version delete them too. Keys whose touch is
        not known (``NEVER_TOUCHED``: installed from a state that kept none) take ``fill`` first.

        Returns:
            ``(keys, values, oldest)``: the deleted keys; their accumulators' last values (as
            :meth:`values`); the oldest touch left (``None`` where no key is left).

        Raises:
            ValueError: the state does not ``tracks_touch``.
        """
        if not self.tracks_touch:
            raise ValueError("ColumnarAggState.expire() needs a state made with touched=True")
        n, tombstone = self._n, self._num_bins
        last = self._cols[_TOUCHED][:n]
        last[last == NEVER_TOUCHED] = fill
        live = self._bin[:n] != tombstone
        gone = np.flatnonzero(live & (last <= cutoff))
        left = live
        left[gone] = False
        oldest = int(last[left].min()) if left.any() else None
        keys, values = self.keys_at(gone), self.values(gone)
        if not gone.size:
            return keys, values, oldest
        bins = self._bin[gone].astype(np.int64)
        self._versions += np.bincount(bins, minlength=self._num_bins) > 0
        self._deleted.add(keys, bins, self._versions[bins])
        self._bin[gone] = tombstone
        self._live -= np.bincount(bins, minlength=self._num_bins + 1)
        self._slots_of.invalidate()  # its runs would still list these slots
        self._dead += len(gone)
        self._deleted.bound(len(self))
        self._after_removal()
        return keys, values, oldest

    def _taken(self, acc: Accumulator, slots: np.ndarray, partials: Mapping[str, np.ndarray]) -> np.ndarray:
        """Where a pick column takes the batch's value (decided on the state before this update)."""
        assert acc.count is not None
        offered = partials[acc.count] > 0
        if acc.op == "last":
            return offered
        empty = self._cols[acc.count][slots] == 0
        if acc.op == "first":
            return offered & empty
        assert acc.rank is not None
        current, part = self._cols[acc.rank][slots], partials[acc.rank]
        better = part < current if acc.op == "argmin" else part > current
        return offered & (empty | better)

    def slots(self) -> np.ndarray:
        """Every slot in use, ascending (slot order is key insertion order)."""
        if self._dead:
            return np.flatnonzero(self._bin[: self._n] != self._num_bins)
        return np.arange(self._n)

    def values(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """A copy of each accumulator at ``slots``."""
        return {a.name: self._cols[a.name][slots] for a in self._accs}

    def keys_at(self, slots: np.ndarray) -> pa.Array:
        """The keys at ``slots``."""
        return self._index.keys_at(slots)

    def _grow(self, new_slots: np.ndarray) -> None:
        """Make room for consecutive new slots; set their bin and identity values."""
        start, end = self._n, self._n + len(new_slots)
        if end > len(self._bin):
            capacity = max(end, 2 * len(self._bin))
            self._bin = _resized(self._bin, capacity, start)
            self._stamp = _resized(self._stamp, capacity, start)
            self._cols = {name: _resized(col, capacity, start) for name, col in self._cols.items()}
        self._bin[start:end] = bins_from_hashes(self._index.hashes(new_slots), self._num_bins)
        self._stamp[start:end] = 0
        self._live += np.bincount(self._bin[start:end], minlength=self._num_bins + 1)
        self._slots_of.added(np.arange(start, end))
        for acc in self._accs:
            self._cols[acc.name][start:end] = acc.identity()
        if self.tracks_touch:
            self._cols[_TOUCHED][start:end] = NEVER_TOUCHED
        self._n = end

    def _reset(self, capacity: int) -> None:
        self._n = 0
        self._dead = 0  # slots of extracted bins, marked with bin ``num_bins`` until the next compaction
        self._bin = np.zeros(capacity, dtype=np.int16 if self._num_bins < (1 << 15) else np.int32)  # tombstones too
        self._stamp = np.zeros(capacity, dtype=np.int64)  # per slot: its bin's version when last written
        self._cols = {a.name: _resized(np.zeros(0, dtype=a.dtype), capacity, 0) for a in self._accs}
        if self.tracks_touch:
            self._cols[_TOUCHED] = _resized(np.zeros(0, dtype=np.int64), capacity, 0)
        self._index = KeyIndex(self._key_type or pa.null(), table_hash_bits=self._index_hash_bits,
                               expected=capacity)
        self._live = np.zeros(self._num_bins + 1, dtype=np.int64)  # live keys per bin (last: unused)
        self._slots_of = BinSlots(self._num_bins)  # the slots of each bin, built when bins first move

    def reserve(self, keys: int) -> None:
        """Make room for ``keys`` keys in all, so that bins installed up to that many allocate and
        rehash nothing more (a migration's new owner calls it before its first bins arrive: growing
        a large state doubles its columns and its hash table in one stall). Costs a copy of the keys
        held now; an unconfigured state makes the room when it learns its layout."""
        if not self.configured:
            self._reserved = max(self._reserved, int(keys))
            return
        if keys <= len(self._bin):
            return
        n = self._n
        self._bin = _resized(self._bin, keys, n)
        self._stamp = _resized(self._stamp, keys, n)
        self._cols = {name: _resized(col, keys, n) for name, col in self._cols.items()}
        self._index.reserve(keys)

    def _came_back(self, slots: np.ndarray) -> None:
        """Tombstoned ``slots`` hold live keys again (their bins are set)."""
        self._live += np.bincount(self._bin[slots], minlength=self._num_bins + 1)
        self._slots_of.added(slots)

    def _bin_counts(self) -> np.ndarray:
        return self._live[: self._num_bins]

    def bins(self) -> list[int]:
        return np.flatnonzero(self._bin_counts()).tolist()

    def bin_key_counts(self) -> dict[int, int]:
        counts = self._bin_counts()
        return {int(b): int(counts[b]) for b in np.flatnonzero(counts)}

    def retire(self) -> None:
        self._retiring = True

    def prepare_moves(self) -> Callable[[], None]:
        """Sort the index of each bin's slots in the background (``BinSlots.prepare``): the first
        step's extraction then finds it ready rather than sorting every slot's bin first."""
        return self._slots_of.prepare(self._bin[: self._n])

    def bin_sizes(self) -> dict[int, int]:
        """Approximate bytes per non-empty bin (keys counted at their average size)."""
        per_slot: float = self._bin.itemsize + 8 + sum(np.dtype(a.dtype).itemsize for a in self._accs)
        per_slot += self._index.keys_nbytes() / max(self._n, 1)
        return {b: int(round(n * per_slot)) for b, n in self.bin_key_counts().items()}

    def memory_nbytes(self) -> int:
        """Bytes this state holds in memory: its columns with their spare capacity, and the key index
        (object columns count their references only)."""
        columns = self._bin.nbytes + self._stamp.nbytes + sum(col.nbytes for col in self._cols.values())
        columns += self._live.nbytes + self._slots_of.nbytes()
        return int(columns + self._index.memory_nbytes())

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        return self.snapshot_later(bins)()

    def snapshot_later(self, bins: Iterable[int]) -> Callable[[], dict[int, bytes]]:
        """Copy the bins' rows now (a few array copies); encode them later, e.g. in another thread."""
        wanted = self._check_bins(bins)
        return self._encode_later(wanted, self._slots_in(wanted))

    def _encode_later(self, wanted: list[int], members: np.ndarray,
                      deleted: tuple[pa.Array | None, np.ndarray] = (None, np.zeros(0, np.int64)),
                      ) -> Callable[[], dict[int, bytes]]:
        """Copy the rows at slots ``members`` (all in bins ``wanted``) now, and the keys ``deleted`` from
        them (keys, their bins: changes only); encode them per bin later."""
        members = members[np.argsort(self._bin[members], kind="stable")]
        bounds = np.searchsorted(self._bin[members], wanted + [self._num_bins])
        keys = self.keys_at(members) if self.configured else None
        cols = {name: self._cols[name][members] for name in self._cols}  # copies (the touches too)
        versions = {b: int(self._versions[b]) for b in wanted}
        gone, gone_bins = deleted
        if gone is not None:
            order = np.argsort(gone_bins, kind="stable")
            gone, gone_bins = gone.take(order), gone_bins[order]
        gone_bounds = np.searchsorted(gone_bins, wanted + [self._num_bins])

        def encode() -> dict[int, bytes]:
            out = {}
            for i, b in enumerate(wanted):
                lo, hi = int(bounds[i]), int(bounds[i + 1])
                part = keys.slice(lo, hi - lo) if keys is not None else None
                dlo, dhi = int(gone_bounds[i]), int(gone_bounds[i + 1])
                dead = gone.slice(dlo, dhi - dlo) if gone is not None and dhi > dlo else None
                out[b] = self._encode_rows(b, versions[b], part, {n: c[lo:hi] for n, c in cols.items()}, dead)
            return out

        return encode

    def snapshot_changes_later(self, full: Iterable[int],
                               since: Mapping[int, int]) -> Callable[[], tuple[dict[int, bytes], dict[int, bytes]]]:
        """As :meth:`BinnedState.snapshot_changes_later`: copies the rows now (those of ``full``, and those
        of the bins of ``since`` stamped after their versions, as :meth:`extract_changes` picks them);
        encodes them when called. The changes also list the keys deleted singly since (:meth:`expire`);
        the captured bins' deletions are forgotten then (later changes build on this capture)."""
        whole = self._check_bins(full)
        unknown = set(since) - self.changes_since(since)
        if unknown:
            raise ValueError(f"the changes of bins {sorted(unknown)} since the versions asked for are not known here")
        encode_full = self._encode_later(whole, self._slots_in(whole))
        encode_changes = self._changes_later(since)[1]
        self._deleted.forget(whole + list(since))
        return lambda: (encode_full(), encode_changes())

    def changes_since(self, since: Mapping[int, int]) -> set[int]:
        """As :meth:`BinnedState.changes_since`, less the bins whose deletions since then were forgotten."""
        return {b for b in super().changes_since(since) if self._deleted.known_since(b, since[b])}

    def _changes_later(self, since: Mapping[int, int]) -> tuple[list[int], Callable[[], dict[int, bytes]]]:
        """The bins of ``since``, their rows stamped after ``since[b]`` and the keys deleted from them
        after it, copied now, encoded later."""
        wanted = self._check_bins(since)
        base = np.full(self._num_bins + 1, np.iinfo(np.int64).max, dtype=np.int64)  # tombstones: never
        base[wanted] = [int(since[b]) for b in wanted]
        members = self._slots_in(wanted)
        deleted = self._deleted.since({b: int(since[b]) for b in wanted})
        return wanted, self._encode_later(wanted, members[self._stamp[members] > base[self._bin[members]]], deleted)

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        """Snapshot and remove ``bins``. The rows become tombstones (cost proportional to the
        bins, not the state), compacted away once live keys are few (``_remove``); a key that
        comes back (a later update or install) gets its tombstoned slot again."""
        out = self.snapshot_bins(bins)
        self._remove(list(out))
        return out

    def extract_changes(self, since: Mapping[int, int]) -> dict[int, bytes] | None:
        """Remove the bins of ``since``; serialise per bin the rows written after version ``since[b]``.

        Every write stamps the slots it touches with their bin's new version (an
        install, with the installed version), so the rows stamped above
        ``since[b]`` are exactly those that differ from bin ``b`` at that
        version; a key deleted singly since (:meth:`expire`) is listed as deleted.
        One pass over the slots, whatever the number of bins. ``None``, removing
        nothing, where some bin's deletions since then were forgotten.
        """
        if not all(self._deleted.known_since(b, int(v)) for b, v in since.items()):
            return None
        wanted, encode = self._changes_later(since)
        out = encode()
        self._remove(wanted)
        return out

    def _remove(self, bins: list[int]) -> None:
        """Make the rows of ``bins`` tombstones; compact once the live keys are a 32nd of the
        slots (``COMPACT_LIVE``), or drop everything once none is live.

        A compaction copies the live keys and stalls the instance for that long, so it waits
        until few are left: a state that gives its bins away step by step (a scale-in) only
        empties, and one that gave some away keeps their slots for the keys that come back.
        A state told it retires (:meth:`retire`) never compacts: it will be empty, and the
        compaction at a 32nd of 2.6M keys stalled it 30-85 ms near the end of a scale-in.
        """
        gone = self._slots_in(bins)
        self._deleted.forget(bins)  # what a bin that left deleted is no longer its changes here
        count = len(gone)
        if count:
            self._bin[gone] = self._num_bins
            self._live[np.asarray(bins, dtype=np.int64)] = 0
            self._slots_of.removed(bins, self._bin[: self._n])
            self._dead += count
            self._after_removal()

    def _after_removal(self) -> None:
        """Slots became tombstones: compact or reset as :meth:`_remove` says."""
        live = self._n - self._dead
        if live == 0:
            self._reset(0)
            self._retiring = False  # emptied: a state that lives on compacts again
        elif live < COMPACT_LIVE * self._n and not self._retiring:
            self._compact()

    def _slots_in(self, bins: Sequence[int]) -> np.ndarray:
        """The slots of ``bins`` (in time proportional to them, not to the state: ``BinSlots``)."""
        return self._slots_of.slots_in(bins, self._bin[: self._n])

    def _compact(self) -> None:
        keep = np.flatnonzero(self._bin[: self._n] != self._num_bins)
        self._index.compact(keep)
        self._bin = self._bin[keep]
        self._stamp = self._stamp[keep]
        self._cols = {name: col[keep] for name, col in self._cols.items()}
        self._n = len(keep)
        self._dead = 0
        self._slots_of.invalidate()

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        decoded = [self._decode(self._check_bin(b), payload) for b, payload in data.items()]
        for d in decoded:
            if d.deleted is not None:
                raise ValueError(f"cannot install bin {d.bin}: the payload holds changes, not a bin (apply_changes)")
        filled = [d for d in decoded if d.rows.num_rows]
        layouts = {d.layout for d in filled}
        if self.configured:
            layouts.add(self.layout)
        if filled:
            present = [d.bin for d in filled if self._live[d.bin]]
            if present:
                raise ValueError(f"cannot install bin {present[0]}: it is already present here with "
                                 f"{int(self._live[present[0]])} keys")
            keys, hashes = self._keys_of(filled, "install bin")
        if len(layouts) > 1:
            raise ValueError(f"cannot install bins: key types or accumulators differ: {sorted(map(str, layouts))}")
        for d in decoded:
            self._carry_version(d.bin, d.version)
        if filled:
            self.configure(*next(iter(layouts)))
            self._install_rows(keys, filled, hashes=hashes)

    def apply_changes(self, data: Mapping[int, bytes]) -> None:
        """As :meth:`BinnedState.apply_changes`; the keys a payload lists as deleted are removed first."""
        decoded = [self._decode(self._check_bin(b), payload) for b, payload in data.items()]
        filled = [d for d in decoded if d.rows.num_rows]
        if filled:
            layouts = {d.layout for d in filled}
            if not self.configured or layouts != {self.layout}:
                raise ValueError(f"cannot apply changes: key types or accumulators differ: "
                                 f"{sorted(map(str, layouts | {self.layout}))}")
            keys, _ = self._keys_of(filled, "apply changes to bin")
        deleted = [d.deleted for d in decoded if d.deleted is not None and len(d.deleted)]
        for d in decoded:
            self._carry_version(d.bin, d.version)
        if deleted:
            self._delete_keys(pa.concat_arrays(deleted))
        if filled:
            self._install_rows(keys, filled, overwrite=True)

    def _delete_keys(self, keys: pa.Array) -> None:
        """Make the slots of ``keys`` tombstones where they are live (changes that delete them)."""
        if not self.configured:
            return
        slots, new = self._index.upsert(keys)  # a key absent here gets a slot, a tombstone at once
        if new.size:
            self._grow(slots[new])
        gone = slots[self._bin[slots] != self._num_bins]
        if gone.size:
            self._live -= np.bincount(self._bin[gone], minlength=self._num_bins + 1)
            self._bin[gone] = self._num_bins
            self._slots_of.invalidate()
            self._dead += len(gone)
            self._after_removal()

    def _keys_of(self, filled: list[_DecodedBin], doing: str) -> tuple[pa.Array, np.ndarray]:
        """The keys of decoded bins, all checked to belong to the bin they came in, and their hashes
        (hashed once: the index stores the same hashes)."""
        keys = pa.concat_arrays([d.rows.column(0).combine_chunks() for d in filled])
        expected = np.repeat([d.bin for d in filled], [d.rows.num_rows for d in filled])
        hashes = hash_keys(keys)
        stray = np.flatnonzero(bins_from_hashes(hashes, self._num_bins) != expected)
        if stray.size:
            raise ValueError(f"cannot {doing} {int(expected[stray[0]])}: the payload holds keys of other bins")
        return keys, hashes

    def _install_rows(self, keys: pa.Array, filled: list[_DecodedBin], overwrite: bool = False,
                      hashes: np.ndarray | None = None) -> None:
        """Add the rows of several bins at once: one index lookup, one grow, one copy per column.

        A key that left this state earlier still has its tombstoned slot in the index: it gets
        that slot back (the installing bin is not present here, so every slot found is a
        tombstone). The cost is that of the installed rows, whatever the size of the state.
        ``overwrite``: keys may also be live here (changes over a bin present); they take the
        rows' values. The rows are stamped with their bins' versions, carried in before; their
        touches come with them (``NEVER_TOUCHED`` from a state that kept none).
        """
        if not self._dead and not overwrite:
            slots = self._index.add(keys, hashes)
            self._grow(slots)
        else:
            slots, new = self._index.upsert(keys)
            found = np.ones(len(slots), dtype=bool)
            found[new] = False
            back = slots[found]
            if not overwrite:
                assert (self._bin[back] == self._num_bins).all(), "bug: an installed key found a live slot"
            back = back[self._bin[back] == self._num_bins]
            if back.size:
                self._bin[back] = bins_from_hashes(self._index.hashes(back), self._num_bins)
                self._came_back(back)
                self._dead -= len(back)
            if new.size:
                self._grow(slots[new])
        for i, acc in enumerate(self._accs, start=1):
            self._cols[acc.name][slots] = np.concatenate([acc.from_arrow(d.rows.column(i)) for d in filled])
        if self.tracks_touch:
            self._cols[_TOUCHED][slots] = np.concatenate(
                [d.touched if d.touched is not None else np.full(d.rows.num_rows, NEVER_TOUCHED) for d in filled])
        self._stamp[slots] = self._versions[self._bin[slots]]

    def _encode_rows(self, b: int, version: int, keys: pa.Array | None, cols: dict[str, np.ndarray],
                     deleted: pa.Array | None = None) -> bytes:
        """A bin's rows (or its changes), as one Arrow IPC stream: the key, one column per accumulator, and
        ``touched`` where the state keeps touches. Changes that delete keys list them first, as
        ``deleted`` rows of identity values (the header counts them)."""
        header: dict[str, Any] = {"num_bins": self._num_bins, "bin": b, "version": version,
                                  "accumulators": [a.spec() for a in self._accs]}
        if deleted is not None and len(deleted):
            header["deleted"] = len(deleted)
            keys = deleted if keys is None or not len(keys) else pa.concat_arrays([deleted, keys])
            cols = {n: np.concatenate([np.full(len(deleted), NEVER_TOUCHED if n == _TOUCHED else _identity(
                self._accs, n), dtype=c.dtype), c]) for n, c in cols.items()}
        metadata = {b"format": _COLUMNAR_FORMAT.encode(), b"header": json.dumps(header).encode(),
                    b"meta": self._meta}
        fields = [pa.field("key", self._key_type or pa.null())]
        fields += [pa.field(f"acc{i}", a.column_type()) for i, a in enumerate(self._accs)]
        arrays = [keys if keys is not None else pa.nulls(0)]
        arrays += [a.to_arrow(cols[a.name]) for a in self._accs]
        if _TOUCHED in cols:
            fields.append(pa.field("touched", pa.int64()))
            arrays.append(pa.array(cols[_TOUCHED], pa.int64()))
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def _decode(self, b: int, payload: bytes) -> _DecodedBin:
        try:
            table = pa.ipc.open_stream(payload).read_all()
            metadata = table.schema.metadata or {}
            if metadata.get(b"format") != _COLUMNAR_FORMAT.encode():
                raise ValueError(f"format {_COLUMNAR_FORMAT!r} expected")
            header = json.loads(metadata[b"header"])
        except (pa.ArrowInvalid, ValueError, KeyError) as exc:
            raise ValueError(f"bin {b}: payload is not a ColumnarAggState bin ({exc})") from exc
        if header["num_bins"] != self._num_bins or header["bin"] != b:
            raise ValueError(
                f"bin {b}: payload is bin {header['bin']} of a state with {header['num_bins']} bins; "
                f"this state has {self._num_bins} bins"
            )
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
            return _DecodedBin(b, int(header["version"]), layout, table.slice(deleted),
                               touched, table.column(0).slice(0, deleted).combine_chunks())
        return _DecodedBin(b, int(header["version"]), layout, table, touched)


@dataclasses.dataclass(frozen=True, slots=True)
class _DecodedBin:
    """A bin (or changes to it) of a :class:`ColumnarAggState` as read: ``rows`` (the key, then one column
    per accumulator), their ``touched`` values if the payload has them, and the keys ``deleted`` first
    (changes; ``None`` for a bin)."""

    bin: int
    version: int
    layout: tuple[Any, ...]
    rows: pa.Table
    touched: np.ndarray | None = None
    deleted: pa.Array | None = None


def _identity(accs: Sequence[Accumulator], name: str) -> Any:
    """The identity of accumulator ``name`` (what a deleted key's row holds in a payload)."""
    return next(a for a in accs if a.name == name).identity()


def _accumulator(spec: list[Any], column_type: pa.DataType) -> Accumulator:
    """An accumulator from its header entry (:meth:`Accumulator.spec`) and its column's type."""
    name, op, dtype, *links = spec
    count, rank = (links + [None, None])[:2]
    return Accumulator(name, op, dtype, column_type if dtype == "object" else None, count, rank)


def _resized(array: np.ndarray, capacity: int, used: int) -> np.ndarray:
    return grown(array, capacity, used)  # a large column grows inside its reservation, without a copy
