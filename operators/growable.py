"""Numeric columns that grow without copying what they hold.

A state's columns (and its key index's hashes) are NumPy arrays indexed by slot. Doubling one meant a
new array and a copy of every slot held: 55 ms at 2M slots here and 116 ms at 4M, in the batch
that brought the key past the capacity. A large column now lives at the start of an anonymous
memory map reserved for several times its size: the kernel hands out zeroed pages only as they are
first written, so the reservation costs address space, not memory, and growing within it is a
longer view of the same memory. Only outgrowing the reservation copies, into one again larger.
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["grown"]

RESERVE_ABOVE = 1 << 22
"""Bytes above which a column gets a reservation (4 MiB: 512K slots of 8 bytes); smaller ones copy,
which costs under a few ms."""

RESERVE_FACTOR = 16
"""A reservation holds this many times the capacity asked for: a column outgrows it (and copies)
once for each 16-fold growth instead of at each doubling."""

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if hasattr(mmap, "MAP_ANONYMOUS") else 0)


def grown(array: np.ndarray, capacity: int, used: int) -> np.ndarray:
    """``array`` with room for ``capacity`` elements: its first ``used`` kept, the rest zero (``None``
    for object arrays).

    The result may share memory with ``array`` (a longer view of its reservation), so the caller
    replaces ``array`` with it and keeps no other view of it for writing.
    """
    if array.dtype == object:
        out = np.full(capacity, None, dtype=object)
        out[:used] = array[:used]
        return out
    nbytes = capacity * array.dtype.itemsize
    region = _reservation(array)
    if region is not None and nbytes <= len(region):
        out = np.frombuffer(region, dtype=array.dtype, count=capacity)
        out[used: len(array)] = 0  # the old view's tail past ``used``; beyond it, never written
        return out
    if nbytes > RESERVE_ABOVE:
        region = _reserve(nbytes * RESERVE_FACTOR)
        if region is not None:
            out = np.frombuffer(region, dtype=array.dtype, count=capacity)
            out[:used] = array[:used]
            return out
    out = np.zeros(capacity, dtype=array.dtype)
    out[:used] = array[:used]
    return out


def _reservation(array: np.ndarray) -> mmap.mmap | None:
    """The reservation ``array`` starts, if it is a view of one from its first byte."""
    region = array.base
    if isinstance(region, memoryview):  # np.frombuffer's base: a view of the map
        region = region.obj
    if not isinstance(region, mmap.mmap) or not array.flags.c_contiguous:
        return None
    start = np.frombuffer(region, dtype=np.uint8, count=0).__array_interface__["data"][0]
    return region if array.__array_interface__["data"][0] == start else None


def _reserve(nbytes: int) -> mmap.mmap | None:
    """Private anonymous memory of ``nbytes``, zero until written; None where the system refuses it
    (a strict overcommit policy) or has no such maps."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError, OverflowError):
        return None
