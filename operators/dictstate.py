"""dictstate.py: keyed state of Python values, a dict per bin (built-in operators' rows, user functions' state).

:class:`DictState` keeps ``bin -> {key: value}``; it is the general
:class:`~operators.state.BinnedState` (windows' panes, joins' rows, top-n,
sessions, timers, and the values of keyed ``reduce`` and ``process``), where
the columnar state (:mod:`operators.columnarstate`) is the fast path of
built-in aggregations only. Its bins travel as :mod:`operators.statecodec`
writes them: Arrow IPC, or cloudpickle for the state of user functions.

Separate from the base (:mod:`operators.state`), which holds only what every
keyed state shares, and from the columnar state, which shares nothing with it
but the base.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .changedkeys import ChangedKeys
from .state import BinnedState
from .statecodec import DictBin, BinStream, SharedBins, decode_dict_bin, encode_dict_bin

__all__ = ["DictState"]

_ABSENT = object()
_NO_ENTRIES: dict[Any, Any] = {}  # read only: the entries of a bin that has none
_IMMUTABLE = frozenset({int, float, complex, bool, str, bytes, type(None)})


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
        self.installs = 0  # bins installed or changed from outside so far (a TTL scan looks at them afresh)
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

    def entries(self, bin: int) -> Mapping[Any, Any]:
        """The keys and values of ``bin`` (read only: change them through :meth:`put` and :meth:`delete`)."""
        return self._bins.get(bin, _NO_ENTRIES)

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
        for b, got in decoded.items():
            if got.deleted is not None:
                raise ValueError(f"cannot install bin {b}: the payload holds changes, not a bin (apply_changes)")
            if got.items and self._bins.get(b):
                raise ValueError(f"cannot install bin {b}: it is already present here with {len(self._bins[b])} keys")
        for b, got in decoded.items():
            if got.items:
                self._bins[b] = got.items
            self._carry_version(b, got.version)
        self._changed.forget(decoded)
        self.installs += 1

    def restore_bins(self, full: Mapping[int, bytes | SharedBins] | BinStream,
                     changes: Sequence[Mapping[int, bytes | SharedBins] | BinStream] = ()) -> None:
        """As :meth:`BinnedState.restore_bins`; the restored bins are then followed from their versions, so
        that the next checkpoint can write their changes on the chains they were read from."""
        super().restore_bins(full, changes)
        if self.tracks_changes:
            restored = [self._check_bin(b) for b in (full.sizes if isinstance(full, BinStream) else full)]
            self._changed.restart(restored, {b: int(self._versions[b]) for b in restored})

    def changes_since(self, since: Mapping[int, int]) -> set[int]:
        """As :meth:`BinnedState.changes_since`: bins followed since exactly that version, with fewer keys
        changed than the bin holds (else a full copy is as small)."""
        return {b for b in super().changes_since(since) if self._changed.known_since(b, since[b])
                and len(self._changed.keys(b)) <= len(self._bins.get(b, ()))}

    def snapshot_changes_later(self, full: Iterable[int],
                               since: Mapping[int, int],
                               ) -> Callable[[], tuple[dict[int, bytes] | BinStream, dict[int, bytes] | BinStream]]:
        """As :meth:`BinnedState.snapshot_changes_later`; serialises at once (values may be changed in place
        later) and follows the captured bins afresh from their versions now."""
        whole = self._check_bins(full)
        if not self.tracks_changes and since:
            return super().snapshot_changes_later(whole, since)
        self._check_changes_known(since)
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
        for b, got in decoded.items():
            if got.deleted is None:
                raise ValueError(f"cannot apply changes to bin {b}: the payload is a full bin (install_bins)")
        for b, got in decoded.items():
            entries = self._bins.setdefault(b, {})
            entries.update(got.items)
            for key in got.deleted or ():
                entries.pop(key, None)
            if not entries:
                del self._bins[b]
            self._carry_version(b, got.version)
        self._changed.forget(decoded)
        self.installs += 1

    def _encode_changes(self, b: int) -> bytes:
        entries = self._bins.get(b, {})
        changed = self._changed.keys(b)
        return self._encode(b, {k: entries[k] for k in changed if k in entries},
                            [k for k in changed if k not in entries])

    def _encode(self, b: int, items: dict[Any, Any] | None = None, deleted: list[Any] | None = None) -> bytes:
        """Bin ``b`` (``items``, ``deleted`` None), or changes to it: ``items`` written, ``deleted`` keys."""
        return encode_dict_bin(self._num_bins, b, int(self._versions[b]),
                               dict(self._bins.get(b, {})) if items is None else items, deleted, pickled=self.pickled)

    def _decode(self, b: int, payload: bytes) -> DictBin:
        """A bin or changes to it (``deleted`` None for a whole bin)."""
        return decode_dict_bin(payload, b, self._num_bins, pickled=self.pickled)
