"""support.py: the harness for keyed operator tests whose instances trade bins mid-stream, as a rescale does.

A test keeps its instances (or their keyed states) and the router's bin table
``owner`` (bin -> instance index: a numpy array, a list or a dict), routes each
batch by ``owner``, and now and then calls :func:`move_bins`; the oracle is the
same computation with no instances at all, so a record lost or counted twice
in a move shows.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

__all__ = ["move_bins", "owned"]


def owned(owner: Any, side: int) -> list[int]:
    """The bins ``owner`` gives to instance ``side``, in bin order."""
    bins = owner.keys() if isinstance(owner, dict) else range(len(owner))
    return [b for b in sorted(bins) if owner[b] == side]


def move_bins(instances: Sequence[Any], owner: Any, src: int, moving: Iterable[int],
              dst: int | None = None) -> list[int]:
    """One migration step: the bins ``moving`` leave ``instances[src]`` (``extract_bins``), are installed at
    ``instances[dst]`` (``install_bins``; by default the other of two instances), and ``owner`` gives
    them to ``dst``. Returns the bins moved.

    Args:
        instances: keyed states, or operator logics whose ``state`` is one.
        owner: the router's table, bin -> instance index; updated in place.
        src: the instance the bins leave.
        moving: the bins to move (each owned by ``src``; none is fine).
        dst: the instance that takes them; ``1 - src`` when left out.

    Raises:
        AssertionError: a bin in ``moving`` is not ``src``'s (the test would move nothing real).
    """
    dst = 1 - src if dst is None else dst
    moving = [int(b) for b in moving]
    strays = [b for b in moving if owner[b] != src]
    assert not strays, f"bins {strays} are not instance {src}'s to move"
    states = [i if hasattr(i, "extract_bins") else i.state for i in (instances[src], instances[dst])]
    states[1].install_bins(states[0].extract_bins(moving))
    for b in moving:
        owner[b] = dst
    return moving
