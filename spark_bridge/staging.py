"""staging.py: batches pushed by Spark task attempts, held per attempt until one attempt is committed.

A Spark task's Python code cannot know whether its attempt will count (when
its input fails upstream, Spark ends the input as if it were complete and
fails the task afterwards), so every attempt's batches are staged apart,
keyed by whatever names the attempt (``(generation, attempt)`` for a batch
unit, ``(epoch, partition, generation, attempt)`` for a lane's share of a
micro-batch). Only the attempt the driver commits becomes data; the others
are dropped.

Lives beside each reader, in the host process that will read the data; only
that reader touches it (on the host's event loop).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["AttemptStage", "Key"]

Key = tuple[int, ...]  # names an attempt (see the module docstring)


class AttemptStage:
    """Staged batches (opaque data plus a row count) per attempt key."""

    def __init__(self) -> None:
        self._staged: dict[Key, dict[int, tuple[bytes, int]]] = {}
        self.rows = 0  # rows staged now
        self.nbytes = 0  # bytes staged now

    def push(self, key: Key, seq: int, data: bytes, rows: int) -> None:
        """Stage batch ``seq`` of attempt ``key``.

        Raises:
            ValueError: that batch was staged already (a bug: pushes are not retried).
        """
        batches = self._staged.setdefault(key, {})
        if seq in batches:
            raise ValueError(f"bug in spark_bridge: batch {seq} of attempt {key} pushed twice")
        batches[seq] = (data, rows)
        self.rows += rows
        self.nbytes += len(data)

    def has(self, key: Key) -> bool:
        return key in self._staged

    def commit(self, key: Key, num_batches: int) -> tuple[list[bytes], int]:
        """The data of attempt ``key`` (its ``num_batches`` batches in order) and its rows; unstaged.

        An attempt that pushed nothing (``num_batches == 0``) has no key.

        Raises:
            ValueError: the attempt's batches here are not exactly ``0 .. num_batches - 1``.
        """
        batches = self._staged.pop(key, {})
        self._forget(batches)
        if sorted(batches) != list(range(num_batches)):
            raise ValueError(
                f"bug in spark_bridge: attempt {key} reported {num_batches} batches, "
                f"the reader holds {sorted(batches)}"
            )
        return [batches[i][0] for i in range(num_batches)], sum(rows for _, rows in batches.values())

    def drop(self, which: Callable[[Key], bool]) -> int:
        """Drop the attempts whose key ``which`` accepts; how many."""
        keys = [k for k in self._staged if which(k)]
        for key in keys:
            self._forget(self._staged.pop(key))
        return len(keys)

    def _forget(self, batches: dict[int, tuple[bytes, int]]) -> None:
        for data, rows in batches.values():
            self.rows -= rows
            self.nbytes -= len(data)

    def __len__(self) -> int:
        """Attempts staged."""
        return len(self._staged)
