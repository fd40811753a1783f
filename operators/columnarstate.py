"""columnarstate.py: keyed state of built-in aggregations as NumPy columns indexed by dense slots (the fast path).

:class:`ColumnarAggState` keeps a column per :class:`~operators.accumulators.Accumulator`, indexed by the
slot a :class:`~operators.keyindex.KeyIndex` gives each key, so that batches combine, bins move and keys
expire in vectorised passes; its bins travel as :mod:`operators.statecodec` writes them. Separate from the
base (:mod:`operators.state`) and from the dict state (:mod:`operators.dictstate`), which shares nothing
with it but the base.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from .accumulators import Accumulator, combine
from .binslots import BinSlots
from .deletedkeys import DeletedKeys
from .growable import grown
from .hashing import bins_from_hashes
from .keyindex import KeyIndex
from .rowcapture import RowCapture
from .state import BinnedState
from .statecodec import (NEVER_TOUCHED, TOUCHED, ColumnarBin, ColumnarRows, CopiedRows, BinStream, Layout,
                         SharedBins, checked_keys, columns_of, decode_columnar_bin, decode_bin_stream,
                         encode_bin_stream)

SCAN_SHARE = 0.2
"""``_changed_rows`` passes over every slot once the bins asked for hold this share of them."""

__all__ = ["ColumnarAggState", "COMPACT_LIVE"]

_BIN = "__bin"  # a row's bin, as a checkpoint captures it beside its columns

COMPACT_LIVE = 1 / 32
"""A columnar state compacts its slots once fewer than this share of them hold live keys."""


WRITTEN_SHARE = 8
"""A state keeps the slots written since the last cut while they are at most 1/8 of its slots
(``ColumnarAggState._note_written``)."""

ENCODE_SHARE = 0.5
"""At most this share of its thread's time goes to encoding a checkpoint's rows, as to copying them: a thread
that encodes without pause takes the interpreter from the processing thread at every switch interval. Measured
at a million keys, a checkpoint a second, three runs each: latency p99 96-285 ms unpaced and 140-211 ms at a
quarter (no difference beyond this machine's noise), each checkpoint twice as long at a quarter."""

BUSY_FLOOR = 0.1
"""While the processing thread is busy, copying and encoding wait for it to go idle, down to this share of
their thread's time (``rowcapture.Pacer``): they take the time the operators leave, and go on however busy
the instance is."""


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
    _dirty: np.ndarray
    _dirty_since: np.ndarray
    _dirty_by_update: bool
    _written: list[np.ndarray] | None
    _written_rows: int
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
        self._capture: RowCapture | None = None  # the rows a checkpoint cut holds, not all copied yet
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
    def layout(self) -> Layout:
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
        capture = self._capture
        if capture is None or capture.done:
            self._capture = None
            return self._update(keys, partials, touched, None)
        with capture.lock:  # the copier copies no chunk meanwhile
            return self._update(keys, partials, touched, capture)

    def _update(self, keys: pa.Array, partials: Mapping[str, np.ndarray], touched: np.ndarray | None,
                capture: RowCapture | None) -> np.ndarray:
        slots, new = self._index.upsert(keys)
        if new.size:
            self._grow(slots[new])
        if self._dead:
            self._revive(slots)
        if capture is not None:
            capture.before_write(slots, self._captured_columns())
        combine(self._accs, self._cols, slots, partials)
        if touched is not None and self.tracks_touch:
            last = self._cols[TOUCHED]
            last[slots] = np.maximum(last[slots], touched)
        self._versions += np.bincount(self._bin[slots], minlength=self._num_bins) > 0
        self._stamp[slots] = self._versions[self._bin[slots]]
        if self._written is not None:
            self._note_written(slots[~self._dirty[slots]])
        self._dirty[slots] = True
        return slots

    def _note_written(self, fresh: np.ndarray) -> None:
        """Keep the slots ``update`` made dirty (``fresh``), so that a cut need not look for them among every
        slot (at 4M keys, 3 of its 5 ms); once they are an eighth of the slots (as many bytes as ``_dirty``
        has), a pass over ``_dirty`` costs no more than gathering them: forget them until the next clear."""
        self._written_rows += len(fresh)
        if self._written_rows * WRITTEN_SHARE > self._n:
            self._written = None
        elif fresh.size:
            self._written.append(fresh)  # type: ignore[union-attr]

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
        self.settle()
        n = self._n
        last = self._cols[TOUCHED][:n]
        last[last == NEVER_TOUCHED] = fill
        live = self._bin[:n] != self._num_bins
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
        self._bury(gone)
        self._deleted.bound(len(self))
        return keys, values, oldest

    def _revive(self, slots: np.ndarray) -> None:
        """Keys of an extracted bin seen again (tombstones among ``slots``): they start over in their old
        slots, with identity values and no touch."""
        revived = slots[self._bin[slots] == self._num_bins]
        if revived.size:
            self._came_back(revived)
            for acc in self._accs:
                self._cols[acc.name][revived] = acc.identity()
            if self.tracks_touch:
                self._cols[TOUCHED][revived] = NEVER_TOUCHED

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

    def _keys_reader(self) -> Callable[[np.ndarray], pa.Array]:
        """What a capture reads its rows' keys with (``RowCapture.copy_some``): the keys as they are now."""
        return self._index.keys_reader()

    def _grow(self, new_slots: np.ndarray) -> None:
        """Make room for consecutive new slots; set their bin and identity values."""
        start, end = self._n, self._n + len(new_slots)
        if end > len(self._bin):
            self._resize(max(end, 2 * len(self._bin)), start)
        self._bin[start:end] = bins_from_hashes(self._index.hashes(new_slots), self._num_bins)
        self._stamp[start:end] = 0
        self._live += np.bincount(self._bin[start:end], minlength=self._num_bins + 1)
        self._slots_of.added(np.arange(start, end))
        for acc in self._accs:
            self._cols[acc.name][start:end] = acc.identity()
        if self.tracks_touch:
            self._cols[TOUCHED][start:end] = NEVER_TOUCHED
        self._n = end

    def _reset(self, capacity: int) -> None:
        self._n = 0
        self._dead = 0  # slots of extracted bins, marked with bin ``num_bins`` until the next compaction
        self._bin = np.zeros(capacity, dtype=np.int16 if self._num_bins < (1 << 15) else np.int32)  # tombstones too
        self._stamp = np.zeros(capacity, dtype=np.int64)  # per slot: its bin's version when last written
        self._dirty = np.zeros(capacity, dtype=bool)  # per slot: written since ``_clear_dirty``
        self._dirty_since = self._versions.copy()
        self._dirty_by_update = True  # no row became dirty but by ``update``, and none died (``_dirty_exact``)
        self._written, self._written_rows = [], 0  # the slots ``update`` made dirty, while few (``_note_written``)
        self._cols = {a.name: grown(np.zeros(0, dtype=a.dtype), capacity, 0) for a in self._accs}
        if self.tracks_touch:
            self._cols[TOUCHED] = grown(np.zeros(0, dtype=np.int64), capacity, 0)
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
        self._resize(keys, self._n)
        self._index.reserve(keys)

    def _resize(self, capacity: int, used: int) -> None:
        """Every per-slot array to ``capacity`` slots, the first ``used`` kept (a large column grows inside
        its reservation, without a copy: :func:`~operators.growable.grown`)."""
        self._bin = grown(self._bin, capacity, used)
        self._stamp = grown(self._stamp, capacity, used)
        self._dirty = grown(self._dirty, capacity, used)
        self._cols = {name: grown(col, capacity, used) for name, col in self._cols.items()}

    def _came_back(self, slots: np.ndarray) -> None:
        """Tombstoned ``slots`` hold live keys again: their bins are set from their keys' hashes."""
        self._bin[slots] = bins_from_hashes(self._index.hashes(slots), self._num_bins)
        self._live += np.bincount(self._bin[slots], minlength=self._num_bins + 1)
        self._slots_of.added(slots)
        self._dead -= len(slots)

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
        columns = self._bin.nbytes + self._stamp.nbytes + self._dirty.nbytes
        columns += sum(col.nbytes for col in self._cols.values())
        columns += self._live.nbytes + self._slots_of.nbytes()
        return int(columns + self._index.memory_nbytes())

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        return self.snapshot_later(bins)()

    def settle(self) -> None:
        """Copy now what the last checkpoint cut holds and has not copied yet: before anything that moves,
        buries or replaces slots (a write of values only copies the rows it writes: ``RowCapture``)."""
        capture, self._capture = self._capture, None
        if capture is not None and not capture.done:
            capture.finish(self._captured_columns, self._keys_reader if self.configured else None)

    def _captured_columns(self) -> dict[str, np.ndarray]:
        """What a checkpoint captures of each row: its bin and its columns (``RowCapture``)."""
        return {_BIN: self._bin, **self._cols}

    def snapshot_later(self, bins: Iterable[int]) -> Callable[[], dict[int, bytes]]:
        """Copy the bins' rows now (a few array copies); encode them later, e.g. in another thread."""
        self.settle()
        wanted = self._check_bins(bins)
        return self._encode_later(wanted, self._slots_in(wanted))

    def _encode_later(self, wanted: list[int], members: np.ndarray,
                      deleted: tuple[pa.Array | None, np.ndarray] = (None, np.zeros(0, np.int64)),
                      ) -> Callable[[], dict[int, bytes]]:
        """Copy the rows at slots ``members`` (all in bins ``wanted``) now, and the keys ``deleted`` from
        them (keys, their bins: changes only); encode them per bin later."""
        members = members[np.argsort(self._bin[members], kind="stable")]
        keys = self.keys_at(members) if self.configured else None
        cols = {name: self._cols[name][members] for name in self._cols}  # copies (the touches too)
        versions = {b: int(self._versions[b]) for b in wanted}
        return CopiedRows(self._num_bins, self.layout, versions, self._bin[members], keys, cols, *deleted).encode

    def snapshot_changes_later(self, full: Iterable[int], since: Mapping[int, int],
                               ) -> Callable[[], tuple[BinStream | dict[int, bytes], BinStream | dict[int, bytes]]]:
        """As :meth:`BinnedState.snapshot_changes_later`: marks now the rows it holds (those of ``full``, and
        those of the bins of ``since`` stamped after their versions, as :meth:`extract_changes` picks them)
        and the keys deleted singly since (:meth:`expire`); the returned function (the checkpoint's
        background thread) copies the rows, a chunk at a time, while the state goes on (a write copies the
        rows it overwrites first: ``RowCapture``), and encodes them. The captured bins' deletions are
        forgotten at once (later changes build on this capture)."""
        self.settle()
        whole = self._check_bins(full)
        self._check_changes_known(since)
        changed, moved, deleted = self._changed_rows(since)
        self._clear_dirty()
        parts = [self._slots_in(whole), moved]
        slots = np.concatenate(parts)
        capture = RowCapture(slots, len(self._bin), {_BIN: self._bin.dtype,
                                                     **{name: col.dtype for name, col in self._cols.items()}})
        versions = [{b: int(self._versions[b]) for b in wanted} for wanted in (whole, changed)]
        self._capture = capture if len(slots) else None
        self._deleted.forget(whole + list(since))
        layout, num_bins, configured = self.layout, self._num_bins, self.configured
        split = len(parts[0])

        def encode() -> tuple[BinStream | dict[int, bytes], BinStream | dict[int, bytes]]:
            # the changes (in the order they were written) copied in the order of their slots, so that the key
            # store and the columns are read forwards; whole bins keep the order of their slots too. Neither
            # is grouped by bin: each is one stream with a bin column
            capture.reorder(split, np.sort)
            capture.copy_all(self._captured_columns, self._keys_reader if configured else None,
                             ENCODE_SHARE, BUSY_FLOOR)
            keys, values = capture.values()
            bins_of = values.pop(_BIN)
            out: list[BinStream | dict[int, bytes]] = []
            for (lo, hi), wanted, gone in (((0, split), versions[0], (None, None)), ((split, len(slots)), versions[1],
                                                                                    deleted)):
                if not wanted:
                    out.append({})
                    continue
                part_keys = keys.slice(lo, hi - lo) if keys is not None else None
                out.append(encode_bin_stream(num_bins, wanted, layout, bins_of[lo:hi], part_keys,
                                             {name: col[lo:hi] for name, col in values.items()}, *gone,
                                             full=not out, share=ENCODE_SHARE, floor=BUSY_FLOOR))
            return out[0], out[1]

        return encode

    def changes_since(self, since: Mapping[int, int]) -> set[int]:
        """As :meth:`BinnedState.changes_since`, less the bins whose deletions since then were forgotten."""
        return {b for b in super().changes_since(since) if self._deleted.known_since(b, since[b])}

    def _changes_later(self, since: Mapping[int, int]) -> tuple[list[int], Callable[[], dict[int, bytes]]]:
        """The bins of ``since``, their rows stamped after ``since[b]`` and the keys deleted from them
        after it, copied now, encoded later."""
        wanted, members, deleted = self._changed_rows(since)
        return wanted, self._encode_later(wanted, members, deleted)

    def _changed_rows(self, since: Mapping[int, int],
                      ) -> tuple[list[int], np.ndarray, tuple[pa.Array | None, np.ndarray]]:
        """The bins of ``since``, the slots of their rows stamped after ``since[b]``, the keys deleted
        from them after it (keys, their bins)."""
        wanted = self._check_bins(since)
        base = np.full(self._num_bins + 1, np.iinfo(np.int64).max, dtype=np.int64)  # tombstones: never
        base[wanted] = [int(since[b]) for b in wanted]
        deleted = self._deleted.since({b: int(since[b]) for b in wanted})
        if self._one_pass_pays(wanted):
            # Most slots are asked for (every checkpoint asks for every bin): one sequential pass over
            # the stamps costs a fifth of gathering them slot by slot in bin order (7 against 34 ms at
            # 2M keys, on the processing thread at the cut). Bins not asked for, and tombstones, have
            # the base that no stamp passes. The slots come by slot, not by bin (the encoder sorts).
            n = self._n
            if self._dirty_covers(base[:self._num_bins]):
                # Every row stamped after ``since`` is among those written since the last cut: look at
                # those only (a pass over one byte per slot, then the stamps of a few; at 4M keys and 6 %
                # of them written since, 2 against 11 ms), or, where they are exactly those, take them as
                # they are (the slots kept as they were written, in that order, or the pass alone).
                exact = self._dirty_exact(base[:self._num_bins])
                if exact and self._written is not None:
                    return wanted, np.concatenate([np.zeros(0, np.int64), *self._written]), deleted
                written = np.flatnonzero(self._dirty[:n])
                if exact:
                    return wanted, written, deleted
                return wanted, written[self._stamp[written] > base[self._bin[written]]], deleted
            return wanted, np.flatnonzero(self._stamp[:n] > base[self._bin[:n]]), deleted
        members = self._slots_in(wanted)
        return wanted, members[self._stamp[members] > base[self._bin[members]]], deleted

    def _dirty_covers(self, since: np.ndarray) -> bool:
        """Whether ``_dirty`` marks every row stamped after ``since`` (per bin; the maximum: not asked):
        true where no bin asked for is older than it was when ``_dirty`` was last cleared (a row stamped
        after ``since[b]`` then was either stamped before the clear, so at most ``_dirty_since[b]``, or
        written since)."""
        return bool((since >= self._dirty_since).all())

    def _dirty_exact(self, since: np.ndarray) -> bool:
        """Whether the rows ``_dirty`` marks are exactly those stamped after ``since`` (where it covers
        them): true where every row marked was written by :meth:`update`, none died since, and every bin
        written since the clear is asked for as of the clear. Such a row's stamp is its bin's version
        after the write, past the version at the clear. This is the usual cut (every bin's previous
        checkpoint was the last cut): it then skips the stamps' check, a gather of a stamp and a bin for
        each row written (at 4M keys and 212K rows written, 5 of the cut's 9 ms)."""
        if not self._dirty_by_update:
            return False
        written = self._versions > self._dirty_since
        return bool((since[written] == self._dirty_since[written]).all())

    def _dirty_inexact(self) -> None:
        """Rows became dirty other than by :meth:`update`, or died: until the next clear, a cut checks the
        stamps of the rows ``_dirty`` marks (``_dirty_exact``), and the slots written need not be kept."""
        self._dirty_by_update = False
        self._written = None

    def _clear_dirty(self) -> None:
        """Forget which rows were written: from now on ``_dirty`` marks the rows written after the bins'
        present versions (a checkpoint's cut clears it, so that the next one looks at what changed
        since)."""
        self._dirty[:] = False
        self._dirty_since = self._versions.copy()
        self._dirty_by_update = True
        self._written, self._written_rows = [], 0

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        """Snapshot and remove ``bins``. The rows become tombstones (cost proportional to the
        bins, not the state), compacted away once live keys are few (``_remove``); a key that
        comes back (a later update or install) gets its tombstoned slot again."""
        out = self.snapshot_bins(bins)  # (settles the capture)
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
        self.settle()
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
            self._dirty_inexact()
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
        """The slots of ``bins``: in time proportional to them, not to the state (``BinSlots``, by bin),
        or, once they hold ``SCAN_SHARE`` of the slots, in one pass over the slots' bins (by slot; the
        run's rebuild, a sort of every slot, would cost more)."""
        if not len(bins):
            return np.zeros(0, dtype=np.int64)
        b = np.asarray(bins, dtype=np.int64)
        if not self._dead and int(self._live[np.unique(b)].sum()) == self._n:  # every slot (no tombstones)
            return np.arange(self._n, dtype=np.int64)
        if self._one_pass_pays(b):
            wanted = np.zeros(self._num_bins + 1, dtype=bool)
            wanted[b] = True
            return np.flatnonzero(wanted[self._bin[: self._n]])
        return self._slots_of.slots_in(bins, self._bin[: self._n])

    def _one_pass_pays(self, bins: Sequence[int] | np.ndarray) -> bool:
        """Whether ``bins`` hold ``SCAN_SHARE`` of the slots: one pass over every slot then costs less
        than finding theirs."""
        return SCAN_SHARE * self._n <= int(self._live[np.asarray(bins, dtype=np.int64)].sum())

    def _compact(self) -> None:
        keep = np.flatnonzero(self._bin[: self._n] != self._num_bins)
        self._index.compact(keep)
        self._bin = self._bin[keep]
        self._stamp = self._stamp[keep]
        self._dirty = self._dirty[keep]
        self._cols = {name: col[keep] for name, col in self._cols.items()}
        self._n = len(keep)
        self._dead = 0
        self._slots_of.invalidate()

    def restore_bins(self, full: Mapping[int, bytes | SharedBins] | BinStream,
                     changes: Sequence[Mapping[int, bytes | SharedBins] | BinStream] = ()) -> None:
        """As :meth:`BinnedState.restore_bins`; full copies and changes may be streams of several bins."""
        self.install_bins(full)
        for part in changes:
            if part:
                self.apply_changes(part)

    def install_bins(self, data: Mapping[int, bytes | SharedBins] | BinStream) -> None:
        """As :meth:`BinnedState.install_bins`; a payload may be several whole bins in one stream (as
        :meth:`apply_changes` takes them)."""
        self.settle()
        decoded = self._decoded(data)
        for d in decoded:
            if d.deleted is not None:
                raise ValueError(f"cannot install bin {min(d.versions)}: the payload holds changes, not a bin "
                                 f"(apply_changes)")
        filled = [d for d in decoded if d.rows.num_rows]
        layouts = {d.layout for d in filled}
        if self.configured:
            layouts.add(self.layout)
        if filled:
            arriving = np.bincount(np.concatenate([d.row_bins for d in filled]), minlength=self._num_bins + 1)
            present = np.flatnonzero((arriving > 0) & (self._live > 0))
            if present.size:
                raise ValueError(f"cannot install bin {int(present[0])}: it is already present here with "
                                 f"{int(self._live[present[0]])} keys")
            keys, hashes = checked_keys(filled, self._num_bins, "install bin")
        if len(layouts) > 1:
            raise ValueError(f"cannot install bins: key types or accumulators differ: {sorted(map(str, layouts))}")
        for d in decoded:
            for b, version in d.versions.items():
                self._carry_version(b, version)
        if filled:
            self.configure(*next(iter(layouts)))
            self._install_rows(keys, filled, hashes=hashes)

    def _decoded(self, data: Mapping[int, bytes | SharedBins] | BinStream) -> list[ColumnarBin | ColumnarRows]:
        """Payloads read: a bin each, or several bins in one stream (``SharedBins``: the same object for
        each of its bins asked for, decoded once for those bins; ``BinStream``: all of its bins)."""
        if isinstance(data, BinStream):
            data = data.as_read()
        decoded: list[ColumnarBin | ColumnarRows] = []
        shared: dict[int, tuple[SharedBins, set[int]]] = {}
        for b, payload in data.items():
            if isinstance(payload, SharedBins):
                shared.setdefault(id(payload), (payload, set()))[1].add(self._check_bin(b))
            else:
                decoded.append(decode_columnar_bin(payload, self._check_bin(b), self._num_bins))
        for payload, bins in shared.values():
            decoded.append(decode_bin_stream(payload.payload, bins, self._num_bins))
        return decoded

    def apply_changes(self, data: Mapping[int, bytes | SharedBins] | BinStream) -> None:
        """As :meth:`BinnedState.apply_changes`; the keys a payload lists as deleted are removed first. A
        payload may be the changes of several bins in one stream (as :meth:`install_bins` takes them)."""
        self.settle()
        decoded = self._decoded(data)
        filled = [d for d in decoded if d.rows.num_rows]
        if filled:
            layouts = {d.layout for d in filled}
            if not self.configured or layouts != {self.layout}:
                raise ValueError(f"cannot apply changes: key types or accumulators differ: "
                                 f"{sorted(map(str, layouts | {self.layout}))}")
            keys, _ = checked_keys(filled, self._num_bins, "apply changes to bin")
        deleted = [d.deleted for d in decoded if d.deleted is not None and len(d.deleted)]
        for d in decoded:
            for b, version in d.versions.items():
                self._carry_version(b, version)
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
        # A key deleted, written again and deleted again since a version is listed twice: bury it once
        # (twice counted it twice as dead, and a state so counted empty was reset, losing every other key).
        gone = np.unique(slots[self._bin[slots] != self._num_bins])
        if gone.size:
            self._bury(gone)

    def _bury(self, slots: np.ndarray) -> None:
        """Make live ``slots`` tombstones one by one (keys deleted singly), then compact or reset as
        :meth:`_remove` says."""
        self._dirty_inexact()
        self._live -= np.bincount(self._bin[slots], minlength=self._num_bins + 1)
        self._bin[slots] = self._num_bins
        self._slots_of.invalidate()  # its runs would still list these slots
        self._dead += len(slots)
        self._after_removal()

    def _install_rows(self, keys: pa.Array, filled: Sequence[ColumnarBin | ColumnarRows], overwrite: bool = False,
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
                self._came_back(back)
            if new.size:
                self._grow(slots[new])
        for name, values in columns_of(filled, self._accs, self.tracks_touch):
            self._cols[name][slots] = values
        self._stamp[slots] = self._versions[self._bin[slots]]
        self._dirty[slots] = True
        self._dirty_inexact()  # stamped with the versions carried in, not past the clear's
