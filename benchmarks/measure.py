"""measure.py: what the checkpoint and recovery benchmarks share: their keyed count, a fast warm-up, polling.

The job: ``generate`` (2 splits, 2 instances, string keys) -> ``key_by("key")``
-> ``agg(count, max(ts), emit="updates")`` (2 instances, named ``count``) ->
one sink (by default ``control_overhead.LatencySink``, which keeps the arrival
time and latency of every batch in its host; ``TakeLatency`` fetches them).

Warm-up: a keyed count's state grows until it holds every key; with uniform
keys that takes ``-K ln(1 - coverage)`` records (4.6 K for 99 %), 46 s for a
million keys at 100,000 records/s. :func:`warm_up` instead runs the same
dataflow unthrottled until it has counted that many records, measures its
capacity on the way (the last part, when the state is nearly full), takes
a checkpoint and stops; the measured job is then submitted with
``restore_from`` that checkpoint, so it starts with the full state. (The
recovery benchmark fills its state in the measured job instead: a job that
was itself restored reports stale offsets for splits its instances do not
read, and a recovery would apply them; see :func:`source_records`.)
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

from chiray.control.ops.checkpoint import decode_offsets

__all__ = ["build", "warm_up", "WarmState", "counted", "source_records", "state_bytes", "size_label",
           "loadavg", "PARALLELISM"]

PARALLELISM = 2
WIDE_S = 3.0
"""Seconds over which :func:`warm_up` measures the capacity of the widened layout."""


def build(name: str, rate: float | None, keys: int, batch_size: int, sink: Any = None,
          num_bins: int | None = None) -> Any:
    """The keyed count: generate (p=2) -> key_by -> agg(count, max ts, updates) (p=2) -> sink (p=1)."""
    from benchmarks.control_overhead import LatencySink
    from chiray.operators import Dataflow, generate

    flow = Dataflow(name)
    (flow.source(generate(None, rate=rate, batch_size=batch_size, num_keys=keys, num_splits=PARALLELISM,
                          key_type="string"), parallelism=PARALLELISM, name="source")
         .key_by("key", num_bins=num_bins)
         .agg(count=(None, "count"), ts=("ts", "max"), emit="updates", parallelism=PARALLELISM, name="count")
         .sink(sink if sink is not None else LatencySink(), name="sink", parallelism=1))
    return flow


def counted(job: Any) -> int | None:
    """Records taken in by the count operator so far (this incarnation's hosts); None while unreachable."""
    try:
        stats = job.statistics()
    except Exception:  # a host died, or the job is being recovered
        return None
    return stats.records_in("count") if stats.of("count") else None


@dataclasses.dataclass(frozen=True)
class WarmState:
    """A checkpoint of the keyed count holding (nearly) every key.

    Attributes:
        path: the ``.../chk-N`` directory to pass as ``restore_from``.
        capacity: records/s the unthrottled job counted over the last part of the warm-up.
        keys_held: keys in the count operator's state when the checkpoint was taken.
        seconds: how long the warm-up took (submit to cancel).
        wide_capacity: records/s the same job counted after the checkpoint, rescaled to the
            ``widen_to`` parallelism of :func:`warm_up` (None without it).
    """

    path: str
    capacity: float
    keys_held: int
    seconds: float
    wide_capacity: float | None = None


def warm_up(keys: int, batch_size: int, root: str, coverage: float = 0.99, min_s: float = 3.0,
            timeout_s: float = 300.0, num_bins: int | None = None, widen_to: int | None = None,
            wide_s: float = WIDE_S, num_hosts: int | None = None) -> WarmState:
    """Fill the state unthrottled, measure capacity, checkpoint into ``root``, stop.

    Runs at least ``min_s`` and until the count operator has taken in
    ``-keys * ln(1 - coverage)`` records; capacity is the rate over the
    second half of the run (at least the last second). ``widen_to``: after the
    checkpoint, rescale the count to that parallelism (all at once) and measure
    the capacity of that layout too, over ``wide_s`` seconds (after a quarter of
    that for the rescale's backlog to drain). ``num_hosts``: as ``JobConfig.num_hosts``.
    """
    started = time.perf_counter()
    needed = math.ceil(-keys * math.log(1.0 - coverage))
    job = build("warm_up", None, keys, batch_size, num_bins=num_bins).submit(checkpoint_dir=root,
                                                                           num_hosts=num_hosts)
    try:
        samples: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        while True:
            time.sleep(0.25)
            n = counted(job) or 0
            samples.append((time.perf_counter(), n))
            end_t, end_n = samples[-1]
            if n >= needed and end_t - t0 >= min_s:
                mid = end_t - max(1.0, (end_t - t0) / 2)
                start_t, start_n = next((t, c) for t, c in samples if t >= mid)
                if end_n > start_n:  # records counted over the window (a short warm-up can have none yet)
                    break
            if end_t - t0 > timeout_s:
                raise TimeoutError(f"warm-up: {n:,} of {needed:,} records after {timeout_s} s")
        capacity = (end_n - start_n) / (end_t - start_t)
        checkpoint_id = job.checkpoint(timeout=120)
        keys_held = int(job.metrics().operators["count"]["keys"])
        wide = None
        if widen_to is not None:
            job.rescale("count", widen_to, strategy="all_at_once").result(600)
            time.sleep(wide_s / 4)  # the backlog of the rescale drains
            t1, n1 = time.perf_counter(), counted(job) or 0
            time.sleep(wide_s)
            wide = ((counted(job) or 0) - n1) / (time.perf_counter() - t1)
    finally:
        job.cancel()
    path = os.path.join(root, f"chk-{checkpoint_id:06d}")
    return WarmState(path, capacity, keys_held, time.perf_counter() - started, wide)


def source_records(manifest: dict[str, Any], batch_size: int) -> tuple[int, int]:
    """Records a checkpoint's source offsets cover (``generate`` offsets count batches per split).

    Returns ``(as restored, per split)``: the first merges the instances'
    offsets as ``actors.restore.RestoreInfo.source_offsets`` does (what a
    recovery seeks the sources to); the second takes each split's largest
    offset (offsets only grow). They differ when an instance reports a stale
    offset of a split it does not read (seen after a restore).
    """
    from chiray.actors.runtime.restore import RestoreInfo

    restored = RestoreInfo(None, manifest).source_offsets("source")  # type: ignore[arg-type]
    per_split: dict[str, int] = {}
    for text in manifest.get("sources", {}).values():
        for split, offset in (decode_offsets(text) or {}).items():
            per_split[split] = max(per_split.get(split, 0), int(offset or 0))
    return (sum(int(v or 0) for v in restored.values()) * batch_size,
            sum(per_split.values()) * batch_size)


def state_bytes(root: str, checkpoint_id: int) -> int:
    """Bytes of the state files of checkpoint ``checkpoint_id`` under the local directory ``root``."""
    directory = os.path.join(root, f"chk-{checkpoint_id:06d}")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    return sum(os.path.getsize(os.path.join(directory, n)) for n in names
               if n.startswith("state-") and n.endswith(".arrow"))


def size_label(keys: int) -> str:
    """100000 -> "100k", 1000000 -> "1m" (the JSON keys' suffix)."""
    if keys % 1_000_000 == 0:
        return f"{keys // 1_000_000}m"
    if keys % 1_000 == 0:
        return f"{keys // 1_000}k"
    return str(keys)


def loadavg() -> float:
    """The 1-minute load average (the machine may be shared)."""
    return round(os.getloadavg()[0], 2)
