"""windowstate.py: the keyed state of fixed (tumbling, sliding) windows, per bin, with the watermark.

A :class:`WindowState` holds one *pane* per open window ``[start, end)``: an
operator logic over that window's records whose own state is a
:class:`~operators.state.BinnedState` (a columnar aggregation for built-in
aggregates, a dict of rows for user functions). So every window's contents
live in bins, and a bin of the window state is the set of that bin's slices
of every open window, plus the operator's watermark: extracting a bin moves
its open windows, and installing it elsewhere carries the watermark along,
so event time never goes backwards for a bin that moves (rescale) or is
restored (recovery). A bin travels as Arrow IPC (:mod:`operators.codec`), its
panes' bins inside it as their states write them.

Firing: a window fires once, when the watermark reaches ``end - 1``; it is
dropped when the watermark reaches ``end - 1 + allowed_lateness``. When
installed bins carry a later watermark than this state's, the local windows
it passes fire first; installed windows that the sender had not fired and
that this state has already passed fire at once. Their results wait in
``take_pending()`` for the owner's next call.

Only the owning logic touches it (single thread).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from . import codec
from .state import BinnedState

__all__ = ["WindowState", "Pane", "MIN_TIME"]

MIN_TIME = -(1 << 63)
_FORMAT = "chiray.WindowState/1"

Pane = Any
"""An ``OperatorLogic`` over one window's records with a ``state`` and an ``emit`` mode
(``"final"``: results on ``finish()``; ``"updates"``: each ``process`` returns the keys it changed)."""


class WindowState(BinnedState):
    """Open windows ``(start, end) -> pane``, all bins of this instance, and the watermark.

    Args:
        num_bins: the operator's bins.
        new_pane: ``new_pane(start, end)`` makes an empty pane (``emit="final"``).
        finalise: ``finalise(start, end, batches) -> batches``: a pane's results as output rows.
        allowed_lateness: ticks a window stays open after it fired.
    """

    def __init__(self, num_bins: int, new_pane: Callable[[int, int], Pane],
                 finalise: Callable[[int, int, list[pa.RecordBatch]], list[pa.RecordBatch]],
                 allowed_lateness: int = 0) -> None:
        super().__init__(num_bins)
        self.new_pane = new_pane
        self.finalise = finalise
        self.allowed_lateness = allowed_lateness
        self.windows: dict[tuple[int, int], Pane] = {}
        self.watermark = MIN_TIME  # the largest watermark seen or carried in
        self.fired_upto = MIN_TIME  # windows with end - 1 <= fired_upto have fired
        self._remembered: set[int] = set()  # bins that held windows since purged (their watermark travels)
        self._pending: list[pa.RecordBatch] = []
        self._floors: dict[int, int] = {}  # installed bins whose sender's watermark is ahead of ours

    # -- windows ------------------------------------------------------------------

    def fired(self, end: int) -> bool:
        return end - 1 <= self.fired_upto

    def expired(self, end: np.ndarray | int, bins: np.ndarray | None = None) -> Any:
        """Whether windows ending at ``end`` are past the allowed lateness (records for them are late);
        with ``bins`` (the bin of each), also past the watermark their bin was installed with."""
        late = end - 1 + self.allowed_lateness <= self.watermark
        if self._floors and bins is not None:
            floors = np.full(self._num_bins, MIN_TIME, dtype=np.int64)
            floors[list(self._floors)] = list(self._floors.values())
            late = late | (end - 1 + self.allowed_lateness <= floors[bins])
        return late

    @property
    def has_floors(self) -> bool:
        """Some installed bins carry a watermark ahead of this state's (``expired`` then wants ``bins``)."""
        return bool(self._floors)

    def pane(self, start: int, end: int) -> Pane:
        """The pane of window ``[start, end)``, created if needed (in update mode if it has fired)."""
        pane = self.windows.get((start, end))
        if pane is None:
            pane = self.windows[(start, end)] = self.new_pane(start, end)
            if self.fired(end):
                pane.emit = "updates"
        return pane

    def advance(self, watermark: int) -> list[pa.RecordBatch]:
        """Raise the watermark; fire the windows it passes (by end) and drop expired ones."""
        self.watermark = max(self.watermark, watermark)
        if self._floors:
            self._floors = {b: f for b, f in self._floors.items() if f > self.watermark}
        out = self.take_pending() + self._fire_local()
        self._purge()
        return out

    def fire_all(self) -> list[pa.RecordBatch]:
        """End of input: fire every window not fired yet."""
        return self.advance(1 << 62)

    def take_pending(self) -> list[pa.RecordBatch]:
        out, self._pending = self._pending, []
        return out

    def _fire_local(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        for start, end in sorted(self.windows, key=lambda w: (w[1], w[0])):
            if self.fired_upto < end - 1 <= self.watermark:
                pane = self.windows[(start, end)]
                out.extend(self.finalise(start, end, list(pane.finish())))
                pane.emit = "updates"
        self.fired_upto = max(self.fired_upto, self.watermark)
        return out

    def _purge(self) -> None:
        for window in [w for w in self.windows if self.expired(w[1])]:
            pane = self.windows.pop(window)
            self._remembered.update(pane.state.bins())
            self._versions += pane.state._versions

    # -- BinnedState --------------------------------------------------------------

    def version(self, bin: int) -> int:
        b = self._check_bin(bin)
        return int(self._versions[b]) + sum(p.state.version(b) for p in self.windows.values())

    def bins(self) -> list[int]:
        held = set(self._remembered)
        for pane in self.windows.values():
            held.update(pane.state.bins())
        return sorted(held)

    def bin_key_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for pane in self.windows.values():
            for b, n in pane.state.bin_key_counts().items():
                counts[b] = counts.get(b, 0) + n
        return counts

    def bin_sizes(self) -> dict[int, int]:
        sizes: dict[int, int] = {b: 16 for b in self._remembered}
        for pane in self.windows.values():
            for b, n in pane.state.bin_sizes().items():
                sizes[b] = sizes.get(b, 0) + n
        return sizes

    def snapshot_later(self, bins: Iterable[int]):  # type: ignore[no-untyped-def]
        wanted = self._check_bins(bins)
        parts = {w: pane.state.snapshot_later(wanted) for w, pane in self.windows.items()}
        versions = {b: self.version(b) for b in wanted}
        marks = {b: max(self.watermark, self._floors.get(b, MIN_TIME)) for b in wanted}
        num_bins = self._num_bins

        def encode() -> dict[int, bytes]:
            encoded = {w: make() for w, make in parts.items()}
            return {b: codec.encode({
                "format": _FORMAT, "num_bins": num_bins, "bin": b, "version": versions[b],
                "watermark": marks[b], "windows": {w: e[b] for w, e in encoded.items() if b in e}})
                for b in wanted}

        return encode

    def snapshot_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        return self.snapshot_later(bins)()

    def extract_bins(self, bins: Iterable[int]) -> dict[int, bytes]:
        out = self.snapshot_bins(bins)
        for window in list(self.windows):
            pane = self.windows[window]
            pane.state.extract_bins(out)
            if not len(pane.state):
                del self.windows[window]
        self._remembered.difference_update(out)
        return out

    def install_bins(self, data: Mapping[int, bytes]) -> None:
        docs = {self._check_bin(b): self._decode(b, payload) for b, payload in data.items()}
        carried = max((d["watermark"] for d in docs.values()), default=MIN_TIME)
        live = bool(self.windows or self._remembered)
        if not live and docs and self.allowed_lateness == 0:
            # A fresh state (a restore, or a new instance's first bins): it starts at the lowest carried
            # watermark, which every one of these bins has passed; the bins carried further keep theirs as a
            # floor. Starting at the highest would fire the others' windows early and drop their replayed
            # records as late (a checkpoint cut while a migration's floor stood).
            low = min(d["watermark"] for d in docs.values())
            self.watermark = max(self.watermark, low)
            live = True
        if carried > self.watermark and live and self.allowed_lateness == 0:
            # This state's own bins may still receive records behind the sender's watermark (their
            # channels are behind the sender's): only the installed bins keep it, as a floor. (Their
            # windows the sender fired are gone with it: without lateness a window is dropped as it fires.)
            for b, doc in docs.items():
                if doc["watermark"] > self.watermark:
                    self._floors[b] = max(self._floors.get(b, MIN_TIME), int(doc["watermark"]))
        elif carried > self.watermark:  # the local windows the carried watermark passes fire first
            self.watermark = carried
            self._pending.extend(self._fire_local())
        by_window: dict[tuple[int, int], dict[int, bytes]] = {}
        for b, doc in docs.items():
            for window, payload in doc["windows"].items():
                by_window.setdefault(tuple(window), {})[b] = payload  # type: ignore[index]
        for (start, end), payloads in sorted(by_window.items(), key=lambda item: item[0][1]):
            sender_fired = max(docs[b]["watermark"] for b in payloads) >= end - 1
            if not sender_fired and self.fired(end):  # nobody fired it yet for these bins
                late = self.new_pane(start, end)
                late.state.install_bins(payloads)
                self._pending.extend(self.finalise(start, end, list(late.finish())))
            self.pane(start, end).state.install_bins(payloads)
        for b, doc in docs.items():
            self._carry_version(b, doc["version"])
            self._remembered.add(b)
        self._purge()

    def __len__(self) -> int:
        return sum(len(p.state) for p in self.windows.values())

    def _decode(self, b: int, payload: bytes) -> dict[str, Any]:
        doc = codec.decode_document(payload, "WindowState", _FORMAT, b)
        if doc["num_bins"] != self._num_bins or doc["bin"] != b:
            raise ValueError(f"bin {b}: payload is bin {doc['bin']} of a state with {doc['num_bins']} bins; "
                             f"this state has {self._num_bins} bins")
        return doc
