"""planning.py: planners that choose a keyed operator's new bin -> instance table.

A planner gets the current table, the target parallelism, and per bin its
load (records routed to it, from ``Monitor``) and state size (bytes); it
returns an :class:`Assignment`: the new table, which bins move, and the
predicted cost (bytes of state to move).

* ``round_robin`` (baseline): bin ``b`` goes to instance ``b mod p``.
* ``consistent_hash`` (baseline): instances own arcs of a hash ring (with
  virtual nodes); a bin goes to the owner of its point on the ring.
* ``ssm``: optimal single-step migration (SSM, from the operator-state migration literature):
  the bins are cut into ``p`` contiguous intervals, one per instance, and the
  intervals are assigned to instances so that the state that stays in place
  is maximal (the migrated bytes minimal), subject to load balance: no
  instance gets more than ``(1 + theta)`` times the mean load. Instances that
  remain after a scale-in are the lowest-numbered ones (indices stay dense).

The exact search runs a dynamic program over (bins covered, set of
instances used), with a monotone-queue window for the load bound, so it
costs ``O(2^p * p * bins)``; above ``EXACT_MAX_INSTANCES`` it keeps the
intervals in instance order (``O(p * bins)``), a heuristic that is exact
when the parallelism does not change.

Because SSM cuts contiguous intervals, a baseline (free to pick any set of
bins) can occasionally move fewer bytes when bin sizes are very uneven; with
bins of about equal size, as hashing makes them, it never does (tested).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any, Callable, Sequence

import numpy as np

from chiray.operators.errors import ChirayError

__all__ = ["Assignment", "PlanningError", "plan", "PLANNERS", "migration_bytes", "max_load_ratio",
           "EXACT_MAX_INSTANCES"]

EXACT_MAX_INSTANCES = 10
"""Up to this many target instances ``ssm`` searches every interval-to-instance assignment."""


class PlanningError(ChirayError, ValueError):
    """No assignment satisfies the planner's constraints (e.g. one bin's load exceeds the bound)."""


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A planner's answer.

    Attributes:
        table: bin -> instance, for the new parallelism.
        moves: bin -> (old instance, new instance), the bins that change owner.
        bytes_moved: the predicted cost, the summed state size of the moving bins.
        max_load_ratio: the heaviest instance's load over the mean load (1.0 is perfect balance).
        planner: which planner made it.
    """

    table: list[int]
    moves: dict[int, tuple[int, int]]
    bytes_moved: int
    max_load_ratio: float
    planner: str


def migration_bytes(old: Sequence[int], new: Sequence[int], sizes: Any) -> int:
    """Bytes of state that move when ``old`` becomes ``new``."""
    o, n = np.asarray(old), np.asarray(new)
    return int(np.asarray(sizes, dtype=np.float64)[o != n].sum())


def max_load_ratio(table: Sequence[int], loads: Any, parallelism: int) -> float:
    """The heaviest instance's load divided by the mean (0 with no load)."""
    w = np.asarray(loads, dtype=np.float64)
    total = w.sum()
    if total <= 0:
        return 0.0
    per = np.bincount(np.asarray(table), weights=w, minlength=parallelism)
    return float(per.max() / (total / parallelism))


def round_robin(current: Sequence[int], parallelism: int, loads: np.ndarray, sizes: np.ndarray,
                theta: float) -> list[int]:
    return [b % parallelism for b in range(len(current))]


def _ring_point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def consistent_hash(current: Sequence[int], parallelism: int, loads: np.ndarray, sizes: np.ndarray,
                    theta: float, vnodes: int = 64) -> list[int]:
    ring = sorted((_ring_point(f"instance-{i}-{v}"), i) for i in range(parallelism) for v in range(vnodes))
    points = np.array([p for p, _ in ring], dtype=np.uint64)
    owners = np.array([i for _, i in ring])
    bins = np.array([_ring_point(f"bin-{b}") for b in range(len(current))], dtype=np.uint64)
    at = np.searchsorted(points, bins) % len(points)
    return owners[at].tolist()


def ssm(current: Sequence[int], parallelism: int, loads: np.ndarray, sizes: np.ndarray,
        theta: float) -> list[int]:
    m = len(current)
    if parallelism > m:
        raise PlanningError(f"ssm: cannot cut {m} bins into {parallelism} non-empty intervals")
    cur = np.asarray(current)
    total = float(loads.sum())
    cap = (1.0 + theta) * total / parallelism if total > 0 else np.inf
    cumload = np.concatenate([[0.0], np.cumsum(loads)])
    # lo[e]: the smallest start s with load(s, e) <= cap (intervals are [s, e)).
    lo = np.searchsorted(cumload, cumload - cap * (1 + 1e-12), side="left")
    gain_prefix = np.zeros((parallelism, m + 1))
    for i in range(parallelism):
        gain_prefix[i, 1:] = np.cumsum(np.where(cur == i, sizes, 0.0))
    if parallelism <= EXACT_MAX_INSTANCES:
        table = _ssm_exact(m, parallelism, lo, gain_prefix)
    else:
        table = _ssm_ordered(m, parallelism, lo, gain_prefix)
    if table is None:
        raise PlanningError(
            f"ssm: no {parallelism} contiguous intervals keep every instance's load within "
            f"(1 + theta) = {1 + theta:.2f} times the mean; the heaviest bin carries "
            f"{float(loads.max()) / (total / parallelism):.2f} times the mean; raise theta")
    return table


def _window_best(values: np.ndarray, lo: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """For each end e in 1..m: max and argmax of values[s] over s in [lo[e], e - 1]."""
    best = np.full(m + 1, -np.inf)
    arg = np.full(m + 1, -1, dtype=np.int64)
    window: collections.deque[int] = collections.deque()
    for e in range(1, m + 1):
        s = e - 1
        if values[s] > -np.inf:
            while window and values[window[-1]] <= values[s]:
                window.pop()
            window.append(s)
        while window and window[0] < lo[e]:
            window.popleft()
        if window:
            best[e] = values[window[0]]
            arg[e] = window[0]
    return best, arg


def _ssm_exact(m: int, p: int, lo: np.ndarray, gp: np.ndarray) -> list[int] | None:
    """dp[mask][e]: best gain covering bins [0, e) with the instances in ``mask``, one interval each."""
    full = (1 << p) - 1
    dp = np.full((1 << p, m + 1), -np.inf)
    choice: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    dp[0, 0] = 0.0
    for mask in range(1, full + 1):
        best = np.full(m + 1, -np.inf)
        who = np.full(m + 1, -1, dtype=np.int64)
        start = np.full(m + 1, -1, dtype=np.int64)
        for i in range(p):
            if not mask >> i & 1:
                continue
            prev = dp[mask ^ (1 << i)]
            if not np.isfinite(prev).any():
                continue
            val, arg = _window_best(prev - gp[i], lo, m)
            cand = val + gp[i]
            better = cand > best
            best[better], who[better], start[better] = cand[better], i, arg[better]
        dp[mask] = best
        choice[mask] = (who, start)
    if not np.isfinite(dp[full, m]):
        return None
    table = [0] * m
    mask, e = full, m
    while mask:
        who, start = choice[mask]
        i, s = int(who[e]), int(start[e])
        table[s:e] = [i] * (e - s)
        mask, e = mask ^ (1 << i), s
    return table


def _ssm_ordered(m: int, p: int, lo: np.ndarray, gp: np.ndarray) -> list[int] | None:
    """Intervals in instance order: instance k takes the k-th interval."""
    dp = np.full((p + 1, m + 1), -np.inf)
    arg = np.full((p + 1, m + 1), -1, dtype=np.int64)
    dp[0, 0] = 0.0
    for k in range(1, p + 1):
        val, a = _window_best(dp[k - 1] - gp[k - 1], lo, m)
        dp[k], arg[k] = val + gp[k - 1], a
    if not np.isfinite(dp[p, m]):
        return None
    table = [0] * m
    e = m
    for k in range(p, 0, -1):
        s = int(arg[k, e])
        table[s:e] = [k - 1] * (e - s)
        e = s
    return table


PLANNERS: dict[str, Callable[..., list[int]]] = {
    "round_robin": round_robin,
    "consistent_hash": consistent_hash,
    "ssm": ssm,
}


def plan(planner: str, current: Sequence[int], parallelism: int, loads: Sequence[float] | None = None,
         sizes: Sequence[float] | None = None, theta: float = 0.2) -> Assignment:
    """The new table for ``parallelism`` instances.

    Args:
        planner: "round_robin", "consistent_hash" or "ssm".
        current: the current bin -> instance table.
        parallelism: the target number of instances (>= 1).
        loads: per bin, its load (e.g. records routed to it); default uniform.
        sizes: per bin, its state size in bytes; default uniform.
        theta: ``ssm``'s load-balance threshold (>= 0).

    Raises:
        ValueError: an unknown planner, bad sizes, or parallelism < 1.
        PlanningError: ``ssm`` found no assignment within ``theta``.
    """
    if planner not in PLANNERS:
        raise ValueError(f"unknown planner {planner!r}; planners: {sorted(PLANNERS)}")
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
        raise ValueError(f"planner {planner!r}: parallelism must be an int >= 1, got {parallelism!r}")
    if theta < 0:
        raise ValueError(f"planner {planner!r}: theta must be >= 0, got {theta}")
    m = len(current)
    w = np.ones(m) if loads is None else np.asarray(loads, dtype=np.float64)
    s = np.ones(m) if sizes is None else np.asarray(sizes, dtype=np.float64)
    if w.shape != (m,) or s.shape != (m,):
        raise ValueError(f"planner {planner!r}: loads and sizes need one value per bin ({m})")
    table = [int(x) for x in PLANNERS[planner](list(current), parallelism, w, s, theta)]
    moves = {b: (int(o), n) for b, (o, n) in enumerate(zip(current, table)) if o != n}
    return Assignment(table, moves, migration_bytes(current, table, s),
                      max_load_ratio(table, w, parallelism), planner)
