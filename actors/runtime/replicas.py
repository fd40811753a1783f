"""replicas.py: copies of other instances' bins that an instance keeps, ready to reload.

A replicating migration (``control.ops.migrate.ReplicateBins``) copies the
state of bins to the instances that will own them, ahead of the move; the
move then ships only what changed since (``MigrateBins`` with replicas).
Each replica is kept under (operator, bin) with the version it was taken at;
reloading checks that the old owner expects that same version. Only the
owning instance's control handlers touch it (through ``InstanceContext``).
"""

from __future__ import annotations

from chiray.operators.logic import InstanceInfo

__all__ = ["BinReplicas"]


class BinReplicas:
    """(operator, bin) -> (version, state) of the bins replicated to one instance."""

    def __init__(self, info: InstanceInfo):
        self._info = info
        self._replicas: dict[tuple[str, int], tuple[int, bytes]] = {}

    def __len__(self) -> int:
        return len(self._replicas)

    def keep(self, operator: str, replicas: dict[int, tuple[int, bytes]]) -> None:
        """Keep (replacing older copies) the replicas of bins of ``operator``: bin -> (version, state)."""
        for b, entry in replicas.items():
            self._replicas[(operator, b)] = entry

    def take(self, operator: str, bins: list[int], versions: dict[int, int]) -> dict[int, bytes]:
        """Remove and return the replicas of ``bins``, which must be at ``versions``.

        Raises:
            RuntimeError: a bin has no replica here, or one at another version.
        """
        out = {}
        for b in bins:
            entry = self._replicas.pop((operator, b), None)
            if entry is None:
                raise RuntimeError(f"{self._info}: no replica of bin {b} of {operator!r} to reload")
            if entry[0] != versions[b]:
                raise RuntimeError(f"{self._info}: the replica of bin {b} of {operator!r} is at version "
                                   f"{entry[0]}, the old owner expected {versions[b]}")
            out[b] = entry[1]
        return out
