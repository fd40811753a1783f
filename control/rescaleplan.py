"""rescaleplan.py: a rescale's options and steps as values: which bins move in which step, in what order.

A rescale moves the bins whose owner changes (the planner's assignment,
``planning.py``). Its *strategy* and *knobs* (Spacker's three: prioritisation,
progressiveness, replication) decide the steps:

* ``all_at_once``: one step with every moving bin;
* ``batched``: steps of ``chunk_bins`` bins (16 by default), or ``chunks`` steps;
* ``fluid``: one bin a step;
* ``non_disruptive``: like ``batched`` (an eighth of the bins a step by default),
  carried out by non-blocking ops; with ``replicate`` a scale-out starts with a
  step that moves nothing (it creates the new instances the copies go to).

``priority`` orders the bins before they are cut: ``hot_first`` (most records
first, by the per-bin load), ``arrival`` (bin order) or ``random`` (``seed``).
A step never holds bins whose old -> new owner edges form a cycle (two
instances waiting for each other's bins would wait for ever): such a step is
split, keeping the order.

Pure code, no Ray: ``actors/rescale.py`` runs the steps.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["Strategy", "Priority", "RescaleOptions", "plan_steps", "acyclic_steps", "pair_chunks", "unreached"]


class Strategy(str, enum.Enum):
    """How a rescale moves its bins."""

    ALL_AT_ONCE = "all_at_once"
    BATCHED = "batched"
    FLUID = "fluid"
    NON_DISRUPTIVE = "non_disruptive"

    @property
    def moves_bins(self) -> bool:
        """It moves key bins step by step (keyed operators only)."""
        return self is not Strategy.ALL_AT_ONCE


class Priority(str, enum.Enum):
    """Which moving bins go first."""

    HOT_FIRST = "hot_first"
    ARRIVAL = "arrival"
    RANDOM = "random"


KNOBS = ("chunk_bins", "chunks", "priority", "replicate", "gap_s", "pace", "theta", "seed", "step_timeout_s")


@dataclasses.dataclass(frozen=True, slots=True)
class RescaleOptions:
    """A rescale's strategy and knobs, checked.

    Attributes:
        strategy: the strategy.
        chunk_bins: bins a step (progressiveness), or ``None``.
        chunks: the number of steps instead, or ``None``.
        priority: which bins first.
        replicate: copy each step's bins ahead (``non_disruptive`` only).
        gap_s: a pause between steps.
        pace: after each step, wait until the records that queued up behind it have gone through
            (the backlog it left), before the next step adds its own.
        theta: the planner's load bound.
        seed: the order of ``random`` priority.
        step_timeout_s: how long one step may take.
    """

    strategy: Strategy = Strategy.ALL_AT_ONCE
    chunk_bins: int | None = None
    chunks: int | None = None
    priority: Priority = Priority.HOT_FIRST
    replicate: bool = False
    gap_s: float = 0.0
    pace: bool = False
    theta: float = 0.2
    seed: int = 0
    step_timeout_s: float = 120.0

    @classmethod
    def of(cls, strategy: str, knobs: Mapping[str, Any]) -> "RescaleOptions":
        """Options from the user's strategy name and knobs.

        Raises:
            TypeError: an unknown knob.
            ValueError: an unknown strategy or priority, a chunk size < 1, replication without
                ``non_disruptive``.
        """
        unknown = sorted(set(knobs) - set(KNOBS))
        if unknown:
            raise TypeError(f"rescale: unknown options {unknown}; options: {sorted(KNOBS)}")
        try:
            kind = Strategy(strategy)
        except ValueError:
            raise ValueError(f"rescale: unknown strategy {strategy!r}; strategies: "
                             f"{[s.value for s in Strategy]}") from None
        try:
            priority = Priority(knobs.get("priority", Priority.HOT_FIRST.value))
        except ValueError:
            raise ValueError(f"rescale: priority must be one of {tuple(p.value for p in Priority)}, "
                             f"got {knobs['priority']!r}") from None
        for name in ("chunk_bins", "chunks"):
            value = knobs.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"rescale: {name} must be an int >= 1, got {value!r}")
        for name in ("replicate", "pace"):
            value = knobs.get(name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"rescale: {name} must be True or False, got {value!r}")
        if knobs.get("replicate") and kind is not Strategy.NON_DISRUPTIVE:
            raise ValueError("rescale: replicate=True needs strategy='non_disruptive'")
        fields = {k: knobs[k] for k in ("chunk_bins", "chunks", "gap_s", "theta", "seed", "step_timeout_s")
                  if knobs.get(k) is not None}
        return cls(kind, priority=priority, replicate=bool(knobs.get("replicate")), pace=bool(knobs.get("pace")),
                   **fields)

    def chunk_size(self, moving: int) -> int:
        """Bins a step when ``moving`` bins move."""
        if self.strategy is Strategy.ALL_AT_ONCE:
            return max(1, moving)
        if self.strategy is Strategy.FLUID:
            return 1
        if self.chunk_bins is not None:
            return self.chunk_bins
        if self.chunks is not None:
            return max(1, -(-moving // self.chunks))
        return 16 if self.strategy is Strategy.BATCHED else max(1, moving // 8)


def plan_steps(options: RescaleOptions, moves: Mapping[int, tuple[int, int]],
               loads: Sequence[float] | None = None, scale_out: bool = False) -> list[list[int]]:
    """The bins of each step, in order.

    Args:
        options: the strategy and knobs.
        moves: bin -> (old owner, new owner) of every moving bin.
        loads: records per bin (for ``hot_first``), or ``None`` (then bin order).
        scale_out: the rescale adds instances (replication then starts with an empty step).

    Returns:
        A list of steps, each a list of bins; ``[[]]`` when nothing moves.
    """
    bins = sorted(moves)
    if options.priority is Priority.HOT_FIRST and loads is not None:
        bins.sort(key=lambda b: -float(loads[b]))
    elif options.priority is Priority.RANDOM:
        random.Random(options.seed).shuffle(bins)
    if not bins:
        return [[]]
    size = options.chunk_size(len(bins))
    if options.strategy is Strategy.ALL_AT_ONCE:
        steps = acyclic_steps([bins], moves)
    else:
        steps = pair_chunks(bins, moves, size, ramp=scale_out)
    if options.replicate and scale_out:
        steps = [[]] + steps  # creates the new instances that the first copies go to
    return steps


def pair_chunks(bins: Sequence[int], moves: Mapping[int, tuple[int, int]], size: int,
                ramp: bool = False) -> list[list[int]]:
    """``bins`` (in priority order) cut into steps of up to ``size`` bins that each move between one
    old and one new owner, in the order of their first bin.

    A blocking step holds the inputs of its owners until the new owner has installed what every old
    owner sent: bins from two old owners made it wait for the slower of the two, while holding both.
    One pair a step holds two instances, and the rest of the operator keeps running.

    ``ramp``: the first steps of a pair whose bins take several steps grow from one bin (1, 2, 4,
    ... up to ``size``), like a slow start. A scale-out's new owner is cold: its first installs
    fault in the memory of the hash table made for all its keys (26-45 ms for a 16-bin install at
    2.6M keys, 2 ms once warm). Bins that fit in one step still move in one.

    Example:
        >>> pair_chunks([5, 4, 3, 2, 1], {5: (0, 2), 4: (1, 2), 3: (0, 2), 2: (0, 2), 1: (1, 2)}, 2)
        [[5, 3], [4, 1], [2]]
        >>> pair_chunks(list(range(7)), {b: (0, 1) for b in range(7)}, 4, ramp=True)
        [[0], [1, 2], [3, 4, 5, 6]]
    """
    total = collections.Counter(moves[b] for b in bins)
    open_chunks: dict[tuple[int, int], tuple[int, list[int]]] = {}
    made: dict[tuple[int, int], int] = {}  # chunks made per pair so far
    out: list[tuple[int, list[int]]] = []
    for rank, b in enumerate(bins):
        pair = moves[b]
        first, chunk = open_chunks.setdefault(pair, (rank, []))
        chunk.append(b)
        if len(chunk) == (min(size, 1 << made.get(pair, 0)) if ramp and total[pair] > size else size):
            out.append((first, chunk))
            made[pair] = made.get(pair, 0) + 1
            del open_chunks[pair]
    out.extend(open_chunks.values())
    return [chunk for _, chunk in sorted(out, key=lambda entry: entry[0])]


def acyclic_steps(chunks: Sequence[Sequence[int]], moves: Mapping[int, tuple[int, int]]) -> list[list[int]]:
    """Split chunks so that no step's old -> new owner edges form a cycle; order within a chunk is kept."""
    out: list[list[int]] = []
    for chunk in chunks:
        rest = list(chunk)
        while rest:
            edges: dict[int, set[int]] = {}
            step, later = [], []
            for b in rest:
                old, new = moves[b]
                if new in edges.get(old, set()) or not _reaches(edges, new, old):
                    edges.setdefault(old, set()).add(new)
                    step.append(b)
                else:
                    later.append(b)
            out.append(step)
            rest = later
    return out


def _reaches(edges: Mapping[Any, Iterable[Any]], start: Any, goal: Any) -> bool:
    return goal in _reachable(edges, [start])


def _reachable(edges: Mapping[Any, Iterable[Any]], starts: Iterable[Any]) -> set:
    """``starts`` and every node a path along ``edges`` leads to from one of them."""
    seen = set(starts)
    todo = list(seen)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def unreached(plan: Any, live_sources: Iterable[tuple[str, int]],
              needed: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """Those of ``needed`` that no op injected at ``live_sources`` can reach along ``plan``'s channels
    (in ``needed``'s order). An op goes only where a source still running sends: an instance whose
    every path starts at a finished source never sees it.

    Example:
        >>> from chiray.operators.graph import ChannelSpec, PhysicalPlan
        >>> plan = PhysicalPlan(None, [("a", 0), ("b", 0), ("m", 0)], [ChannelSpec(0, ("a", 0), ("m", 0), 0, 0)],
        ...                     {}, {}, {}, 1)
        >>> unreached(plan, [("a", 0)], [("m", 0)]), unreached(plan, [("b", 0)], [("m", 0)])
        ([], [('m', 0)])
    """
    edges: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for ch in plan.channels:
        edges.setdefault(tuple(ch.src), []).append(tuple(ch.dst))
    seen = _reachable(edges, live_sources)
    return [i for i in needed if i not in seen]
