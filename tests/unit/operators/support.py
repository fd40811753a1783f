"""support.py: the harness for keyed operator tests whose instances trade bins mid-stream, as a rescale does.

A test keeps its instances (or their keyed states) and the router's bin table
``owner`` (bin -> instance index: a numpy array, a list or a dict), routes each
batch by ``owner``, and now and then calls :func:`move_bins`; the oracle is the
same computation with no instances at all, so a record lost or counted twice
in a move shows.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["move_bins", "owned", "run_trading"]


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


def run_trading(make: Callable[[], Any], inputs: Sequence[tuple[pa.RecordBatch, int]], keys: Sequence[str],
                num_bins: int, watermark: Callable[[int], int] | None = None,
                every: int = 3) -> tuple[pa.Table, list[Any]]:
    """Feed ``inputs`` (``(batch, input index)`` in order) to two instances of ``make()``, each batch routed
    by its key's bin (column ``keys[input index]``); after batch ``i`` each instance gets watermark
    ``watermark(i)`` (if given), and every ``every`` batches the instances take turns giving three of
    their bins to the other. Returns every output row (``finish()``'s last) and the instances."""
    from chiray.operators.hashing import bins_of

    instances = [make(), make()]
    owner = np.arange(num_bins) % 2
    out: list[pa.RecordBatch] = []
    for i, (batch, side) in enumerate(inputs):
        dest = owner[bins_of(batch.column(keys[side]), num_bins)]
        for j, instance in enumerate(instances):
            out += instance.process(batch.filter(pa.array(dest == j)), side)
            if watermark is not None:
                out += instance.on_watermark(watermark(i))
        if i % every == every - 1:
            src = (i // every) % 2
            move_bins(instances, owner, src, owned(owner, src)[:3])
    for instance in instances:
        out += instance.finish()
    schema = out[0].schema if out else pa.schema([])
    return pa.Table.from_batches(out, schema), instances
