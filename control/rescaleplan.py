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

The whole rescale is one value: :func:`plan_rescale` turns the options, the
operator's bin table and what was measured of its bins into a
:class:`RescalePlan`, a tuple of frozen steps (``Replicate``, ``Migrate``,
``Drain``, ``Pause``) that says everything the runtime carries out: each
migration step's bin table, moves, parallelism, whether it blocks, the room
new owners reserve and the instances that retire.

Pure code, no Ray: ``actors/jobs/rescaler.py`` runs the steps.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from .planning import Assignment, plan as plan_assignment

__all__ = ["Strategy", "Priority", "RescaleOptions", "BinMetrics", "Replicate", "Migrate", "Drain", "Pause",
           "Step", "RescalePlan", "plan_rescale", "bin_metrics", "plan_steps", "acyclic_steps", "pair_chunks",
           "unreached"]


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

    def measures(self, planner: str) -> bool:
        """Whether planning needs the bins' loads and sizes measured first (``ssm`` or ``hot_first``)."""
        return planner == "ssm" or self.priority is Priority.HOT_FIRST

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


@dataclasses.dataclass(frozen=True, slots=True)
class BinMetrics:
    """What was measured of a keyed operator's bins before planning (an in-band ``Monitor``).

    Attributes:
        loads: records routed to each bin, or ``None`` (not measured).
        sizes: state bytes of each bin, or ``None``.
        keys: keys each bin holds (bins without keys left out).
    """

    loads: Sequence[float] | None = None
    sizes: Sequence[float] | None = None
    keys: Mapping[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Replicate:
    """Copy the next migration's bins to their new owners ahead of it (``ReplicateBins``; counted as a step).

    Attributes:
        moves: bin -> (old owner, new owner) of the bins to copy.
    """

    moves: Mapping[int, tuple[int, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class Migrate:
    """One migration step: one ``MigrateBins`` op, and the topology change that goes with it.

    Attributes:
        table: the operator's bin table after the step (``None``: a stateless operator).
        moves: bin -> (old owner, new owner) of the bins this step moves.
        parallelism: the operator's instances after the step (a scale-out adds its instances with the
            first step, a scale-in retires its instances with the last).
        blocking: aligned (Chi, Megaphone) or Spacker's non-disruptive protocol.
        everywhere: a blocking step holds every instance's inputs (``all_at_once``), not only its owners'.
        reserve: new owner -> keys the whole rescale brings it (the first step only), or ``None``.
        retiring: the instances that give every bin away in the whole rescale (a scale-in's).
    """

    table: tuple[int, ...] | None
    moves: Mapping[int, tuple[int, int]]
    parallelism: int
    blocking: bool = True
    everywhere: bool = True
    reserve: Mapping[int, int] | None = None
    retiring: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Drain:
    """``pace``: wait until the records queued behind the last step have gone through (a non-blocking op)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """``gap_s``: let queues drain for ``seconds`` before the next step."""

    seconds: float


Step = Union[Replicate, Migrate, Drain, Pause]


@dataclasses.dataclass(frozen=True, slots=True)
class RescalePlan:
    """A whole rescale as a value: its steps, in order, and what it predicts.

    Attributes:
        operator: the operator.
        before / after: its parallelism before and after.
        steps: the steps.
        bins: the bins that change owner.
        predicted_bytes: the planner's estimate of the state bytes that move.
    """

    operator: str
    before: int
    after: int
    steps: tuple[Step, ...]
    bins: int = 0
    predicted_bytes: int = 0

    @property
    def counted_steps(self) -> int:
        """The steps a rescale's progress counts: migrations and replications."""
        return sum(1 for s in self.steps if isinstance(s, (Migrate, Replicate)))


def plan_rescale(options: RescaleOptions, operator: str, before: int, after: int,
                 table: Sequence[int] | None = None, metrics: BinMetrics | None = None,
                 assignment: Sequence[int] | None = None, planner: str = "ssm") -> RescalePlan:
    """The steps that take ``operator`` from ``before`` to ``after`` instances.

    Args:
        options: the strategy and knobs.
        operator: the operator.
        before / after: its parallelism now and the target.
        table: its bin table now; ``None`` for a stateless operator (one step changes its instances).
        metrics: what was measured of its bins (``None``: nothing; uniform loads and sizes).
        assignment: the new table, given (a migration); else ``planner`` chooses it.
        planner: a planner of ``control.planning``.

    Raises:
        ValueError / PlanningError: the planner's (see ``control.planning.plan``).

    Example:
        >>> fluid = RescaleOptions.of("fluid", {})
        >>> plan = plan_rescale(fluid, "count", 1, 2, [0, 0, 0, 0], assignment=[0, 0, 1, 1])
        >>> [(s.table, dict(s.moves), s.parallelism) for s in plan.steps]
        [((0, 0, 1, 0), {2: (0, 1)}, 2), ((0, 0, 1, 1), {3: (0, 1)}, 2)]
    """
    if table is None:
        return RescalePlan(operator, before, after, (Migrate(None, {}, after),))
    metrics = metrics or BinMetrics()
    if assignment is not None:
        given = [int(a) for a in assignment]
        moves = {b: (o, n) for b, (o, n) in enumerate(zip(table, given)) if o != n}
        chosen = Assignment(given, moves, 0, 0.0, "given")
    else:
        loads = None if metrics.loads is None else list(np.asarray(metrics.loads, dtype=np.float64) + 1)
        chosen = plan_assignment(planner, list(table), after, loads, metrics.sizes, theta=options.theta)
    chunks = plan_steps(options, chosen.moves, metrics.loads, scale_out=after > before)
    steps = _steps(options, chunks, chosen, list(table), before, after, metrics.keys)
    return RescalePlan(operator, before, after, steps, len(chosen.moves), chosen.bytes_moved)


def _steps(options: RescaleOptions, chunks: list[list[int]], chosen: Assignment, table: list[int],
           before: int, after: int, keys: Mapping[int, int]) -> tuple[Step, ...]:
    """Each chunk as a migration step (a copy first with ``replicate``; a drain or pause after with ``pace``
    or ``gap_s``, but for the last)."""
    incoming: dict[int, int] = {}  # new owner -> keys the rescale brings it
    for b, (_, new_owner) in chosen.moves.items():
        incoming[new_owner] = incoming.get(new_owner, 0) + keys.get(b, 0)
    steps: list[Step] = []
    for k, chunk in enumerate(chunks):
        last = k == len(chunks) - 1
        for b in chunk:
            table[b] = chosen.table[b]
        moves = {b: chosen.moves[b] for b in chunk}
        if options.replicate and moves:
            steps.append(Replicate(moves))
        steps.append(Migrate(tuple(table), moves, after if after > before or last else before,
                             blocking=options.strategy is not Strategy.NON_DISRUPTIVE,
                             everywhere=options.strategy is Strategy.ALL_AT_ONCE,
                             reserve={i: n for i, n in incoming.items() if n} if k == 0 else None,
                             retiring=tuple(range(after, before))))
        if options.pace and not last:
            steps.append(Drain())
        if options.gap_s and not last:
            steps.append(Pause(options.gap_s))
    return tuple(steps)


def bin_metrics(result: Any, operator: str, num_bins: int) -> BinMetrics:
    """``operator``'s bins as a ``Monitor``'s ``result`` measured them (sizes padded to ``num_bins``)."""
    sizes = result.bin_bytes.get(operator)
    if sizes is not None and len(sizes) < num_bins:
        sizes = np.concatenate([sizes, np.zeros(num_bins - len(sizes), dtype=np.int64)])
    keys: dict[int, int] = {}
    for (name, _), m in result.instances.items():
        for b, n in ((m.get("keys_per_bin") or {}) if name == operator else {}).items():
            keys[int(b)] = keys.get(int(b), 0) + int(n)
    return BinMetrics(result.bin_loads.get(operator), sizes, keys)


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
