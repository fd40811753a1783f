"""changedkeys.py: the keys of each bin written or deleted since the bin's last checkpoint.

A :class:`~operators.dictstate.DictState` keeps no version per key; what lets a
checkpoint write only a bin's changes is this record, started for a bin when a
checkpoint captures it (:meth:`ChangedKeys.restart`, with the bin's version
then) and fed by every write to the bin after. It is exact for changes since
that version only, so a checkpoint asks for a bin's changes since that very
version (:meth:`ChangedKeys.known_since`) and writes the bin whole otherwise.
A bin nobody checkpointed costs nothing: its writes are not recorded.

Only the owner of the state touches it (single thread).

Example:
    >>> changed = ChangedKeys()
    >>> changed.note(3, "a")  # bin 3 is not followed yet
    >>> changed.restart([3], {3: 7})
    >>> changed.note(3, "b"); changed.known_since(3, 7), changed.keys(3)
    (True, {'b'})
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["ChangedKeys"]


class ChangedKeys:
    """Per followed bin: the keys written or deleted since version ``base``."""

    __slots__ = ("_keys", "_base")

    def __init__(self) -> None:
        self._keys: dict[int, set[Any]] = {}
        self._base: dict[int, int] = {}

    def note(self, bin: int, key: Any) -> None:
        """``key`` of ``bin`` was written or deleted."""
        keys = self._keys.get(bin)
        if keys is not None:
            keys.add(key)

    def note_many(self, bins: Iterable[int], keys: Iterable[Any]) -> None:
        """Each ``keys[i]`` of ``bins[i]`` was written or deleted (nothing to do while no bin is followed)."""
        if self._keys:
            for b, key in zip(bins, keys):
                followed = self._keys.get(b)
                if followed is not None:
                    followed.add(key)

    def known_since(self, bin: int, version: int) -> bool:
        """Whether the keys changed in ``bin`` since ``version`` are known."""
        return self._base.get(bin) == version

    def keys(self, bin: int) -> set[Any]:
        """The keys of ``bin`` changed since its base version (empty if not followed)."""
        return self._keys.get(bin, set())

    def restart(self, bins: Iterable[int], versions: Mapping[int, int]) -> None:
        """Follow ``bins`` afresh from their ``versions`` (a checkpoint captured them at these)."""
        for b in bins:
            self._keys[b] = set()
            self._base[b] = int(versions[b])

    def forget(self, bins: Iterable[int]) -> None:
        """Stop following ``bins`` (they left, or arrived with a past unknown here)."""
        for b in bins:
            self._keys.pop(b, None)
            self._base.pop(b, None)
