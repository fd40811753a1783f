"""state.py: keyed state stored per bin, the unit of migration and checkpointing: the contract every keyed state offers.

A key's *bin* is ``hashing.bins_of(key, num_bins)``, the same function the
router uses, so the instance that receives a key is the one whose state holds
it. Every keyed state implements :class:`BinnedState`: it lists its bins,
serialises chosen bins (``snapshot_bins`` copies, ``extract_bins`` moves them
out) and merges bins serialised by another instance of the same kind
(``install_bins``), possibly in another process.

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

Where the rest of keyed state lives (this module imports none of them):

* :mod:`operators.dictstate`: :class:`~operators.dictstate.DictState`,
  ``bin -> {key: value}`` of Python values (built-in operators' rows and
  timers; user functions' state, ``pickled=True``).
* :mod:`operators.columnarstate`: :class:`~operators.columnarstate.ColumnarAggState`,
  the fast path of built-in aggregations (keys in dense slots, accumulators as
  NumPy columns), its columns described by :mod:`operators.accumulators`.
* :mod:`operators.statecodec`: the bytes both kinds' bins travel as (Arrow
  IPC through :mod:`operators.codec`, or cloudpickle for user functions' state).
* :mod:`operators.rowbins` and :mod:`operators.windowstate`: states of rows
  and of windows built on the same contract.
"""

from __future__ import annotations

import abc
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .hashing import check_num_bins
from .statecodec import BinStream, SharedBins

__all__ = ["BinnedState"]



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
        """Write the rows :meth:`extract_changes` (or a checkpoint: :meth:`snapshot_changes_later`) serialised
        over the bins present here (keys in them take the rows' values; other keys are added).

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
                               since: Mapping[int, int],
                               ) -> Callable[[], tuple[dict[int, bytes] | BinStream, dict[int, bytes] | BinStream]]:
        """Capture now bins ``full`` whole and, of the bins of ``since``, the changes after those versions
        (bins :meth:`changes_since` gave); serialise them when the returned function is called.

        Returns:
            A function returning (full copies, changes), each per bin or, from a columnar state, all those
            bins in one stream (``BinStream``); :meth:`restore_bins` reads them (or :meth:`install_bins` the
            full copies, :meth:`apply_changes` the changes over the bins as they were).

        Raises:
            ValueError: a bin of ``since`` whose changes this state cannot serialise.
        """
        if since:
            raise ValueError(
                f"{type(self).__name__} does not track changes: bins {sorted(since)} must be written whole")
        encode = self.snapshot_later(full)
        return lambda: (encode(), {})

    def restore_bins(self, full: Mapping[int, bytes | SharedBins] | BinStream,
                     changes: Sequence[Mapping[int, bytes | SharedBins] | BinStream] = ()) -> None:
        """Install bins from a checkpoint: their full copies, then each round of changes over them, in order
        (each bin's changes in the order they were written).

        Raises:
            ValueError: as :meth:`install_bins` and :meth:`apply_changes`.
        """
        self.install_bins(self._per_bin(full))
        for part in changes:
            if part:
                self.apply_changes(self._per_bin(part))

    def _per_bin(self, data: Mapping[int, bytes | SharedBins] | BinStream) -> Mapping[int, bytes]:
        """``data`` if it holds a payload per bin (a state that reads streams of several bins overrides
        :meth:`restore_bins`).

        Raises:
            ValueError: a stream of several bins.
        """
        if isinstance(data, BinStream) or any(isinstance(p, SharedBins) for p in data.values()):
            raise ValueError(f"a {type(self).__name__} reads a payload per bin, not a stream of several bins "
                             f"(written by a ColumnarAggState)")
        return data  # type: ignore[return-value]  # (no SharedBins among the values)

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

    def _check_changes_known(self, since: Mapping[int, int]) -> None:
        """Raise ``ValueError`` unless :meth:`changes_since` knows the changes of every bin of ``since``."""
        unknown = set(since) - self.changes_since(since)
        if unknown:
            raise ValueError(f"the changes of bins {sorted(unknown)} since the versions asked for are not known here")
