"""held.py: the records a new owner holds back while the state of their bins is on its way (migration).

During a non-disruptive migration step the new owner of some bins already
receives their records, but not yet their state. :class:`HeldRecords` keeps
those records, in arrival order and with their input, and hands them back
once the bins' state is installed; records of other bins pass at once.
Event time waits with them: while bins are held (or leaving, see
``pause_event_time``) the newest watermark is kept here and applied once
they are installed, so held records and their windows meet the watermark
they were sent under.

Owned by one ``OperatorInstance``; only its processing thread touches it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from chiray.operators.hashing import bins_of

from .messages import Watermark

__all__ = ["HeldRecords"]


class HeldRecords:
    """Records of bins whose state is on its way, per instance.

    Args:
        num_bins: the keyed operator's bins.
    """

    def __init__(self, num_bins: int) -> None:
        self.num_bins = num_bins
        self._mask: np.ndarray | None = None  # bins whose records wait for their state
        self._keys: tuple[str, ...] = ()  # the key column per input (one: every input)
        self._held: list[tuple[pa.RecordBatch, np.ndarray, int]] = []  # (records, their bins, input index)
        self._paused = 0  # > 0 while bins are leaving (a non-blocking migration step)
        self._deferred: Watermark | None = None  # the newest watermark held back

    def pause_event_time(self) -> None:
        """Defer watermarks until the matching :meth:`resume_event_time` (calls nest)."""
        self._paused += 1

    def resume_event_time(self) -> None:
        self._paused = max(0, self._paused - 1)

    def defer(self, mark: Watermark) -> bool:
        """Keep ``mark`` (the newest wins) if event time waits now; whether it does."""
        if self._mask is None and not self._paused:
            return False
        self._deferred = mark
        return True

    def take_deferred(self) -> Watermark | None:
        """The watermark held back, once event time no longer waits (else None)."""
        if self._mask is not None or self._paused:
            return None
        mark, self._deferred = self._deferred, None
        return mark

    @property
    def active(self) -> bool:
        """Some bins are waiting for their state."""
        return self._mask is not None

    def __bool__(self) -> bool:
        """Some records are held."""
        return bool(self._held)

    def hold(self, bins: Sequence[int], key: str | Sequence[str]) -> None:
        """From now on, hold back records of ``bins``; ``key``: their key column, or one per input (a
        two-input operator keys each input by its own column)."""
        if self._mask is None:
            self._mask = np.zeros(self.num_bins, dtype=bool)
        self._mask[np.asarray(list(bins), dtype=np.int64)] = True
        self._keys = (key,) if isinstance(key, str) else tuple(key)

    def split(self, batch: pa.RecordBatch, input_index: int) -> pa.RecordBatch | None:
        """Keep the records of held bins; return the rest (``None`` if nothing is left to process now)."""
        assert self._mask is not None and self._keys
        key = self._keys[input_index] if len(self._keys) > 1 else self._keys[0]
        bins = bins_of(batch.column(key), self.num_bins)
        held = self._mask[bins]
        if not held.any():
            return batch
        self._held.append((batch.filter(pa.array(held)), bins[held], input_index))
        return None if held.all() else batch.filter(pa.array(~held))

    def release(self, bins: Sequence[int]) -> list[tuple[pa.RecordBatch, int]]:
        """The state of ``bins`` is installed: their held records, in arrival order, with their input."""
        if self._mask is None:
            return []
        released = np.zeros(self.num_bins, dtype=bool)
        released[np.asarray(list(bins), dtype=np.int64)] = True
        released &= self._mask
        self._mask &= ~released
        out: list[tuple[pa.RecordBatch, int]] = []
        keep: list[tuple[pa.RecordBatch, np.ndarray, int]] = []
        for batch, batch_bins, input_index in self._held:
            go = released[batch_bins]
            if go.any():
                out.append((batch.filter(pa.array(go)), input_index))
            if not go.all():
                keep.append((batch.filter(pa.array(~go)), batch_bins[~go], input_index))
        self._held = keep
        if not self._mask.any():
            assert not self._held, "bug: records held of bins no state is awaited for"
            self._mask = None
        return out
