"""ds2.py: the DS2 scaling policy: the parallelism each operator needs, all operators in one step.

DS2 (Kalavri et al., OSDI 2018; the model of Flink's Kubernetes autoscaler)
walks the dataflow in topological order. A source's target output rate is
what it is offered (its observed rate plus its backlog's growth) plus what
clears its backlog within ``catch_up_s``; an operator's target input rate is
the sum of its upstream operators' target output rates, and its target
output rate is that times its output/input ratio. The parallelism an
operator needs is::

    ceil(target_input_rate / true_rate_per_instance / target_utilisation)

bounded by ``min_parallelism`` and ``max_parallelism`` and, with
``align_to`` (Flink's max parallelism; here the number of key bins), raised
to the next divisor of it where one exists up to half of it, so bins spread
evenly.

Hysteresis: an operator scales up as soon as it needs more instances at the
target utilisation. It scales down only to a parallelism that would run at
most ``scale_down_margin`` below the target utilisation (a dead band, as
Flink's utilisation boundary), only when every decision over
``scale_down_stable_s`` wanted fewer, and then to the most any of them
wanted: a steady but noisy load at a boundary never oscillates. No decision is made for an operator within
``cooldown_s`` of its last rescale (its rates are not settled yet).

Pure code, no Ray: the inputs are ``rates.OperatorRates`` and the graph as a
mapping of each operator to its upstream operators.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Mapping, Sequence

from .rates import OperatorRates

__all__ = ["Action", "Ds2Config", "Ds2Policy", "OperatorDecision", "needed_parallelism", "topological_order"]


class Action(str, enum.Enum):
    """What the policy wants for one operator."""

    UP = "up"
    DOWN = "down"
    HOLD = "hold"


@dataclasses.dataclass(frozen=True, slots=True)
class Ds2Config:
    """The policy's knobs.

    Attributes:
        target_utilisation: the busy fraction an instance should run at (headroom for bursts), in (0, 1].
        min_parallelism: the fewest instances of a scaled operator.
        max_parallelism: the most instances of a scaled operator.
        catch_up_s: a source's backlog should clear within this many seconds (``None``: ignore backlog).
        scale_down_stable_s: scale down only after wanting fewer instances for this long.
        cooldown_s: no decision for an operator this soon after its last rescale.
        align_to: raise a parallelism to a divisor of this (bins / max parallelism), ``None`` for none.
        scale_down_margin: scale down only to where utilisation stays this far below the target.
    """

    target_utilisation: float = 0.8
    min_parallelism: int = 1
    max_parallelism: int = 16
    catch_up_s: float | None = 30.0
    scale_down_stable_s: float = 10.0
    cooldown_s: float = 5.0
    align_to: int | None = None
    scale_down_margin: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 1:
            raise ValueError(f"target_utilisation must be in (0, 1], got {self.target_utilisation}")
        if not 0 <= self.scale_down_margin < self.target_utilisation:
            raise ValueError(f"scale_down_margin must be in [0, target_utilisation), got {self.scale_down_margin}")
        if not 1 <= self.min_parallelism <= self.max_parallelism:
            raise ValueError(f"need 1 <= min_parallelism <= max_parallelism, got {self.min_parallelism} "
                             f"and {self.max_parallelism}")
        for name in ("scale_down_stable_s", "cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorDecision:
    """One operator's decision and the inputs it was made from (shown to users as an event).

    Attributes:
        operator: its name.
        current: its parallelism now.
        needed: what the load needs now (before hysteresis).
        target: the parallelism decided (``current`` unless the action is UP or DOWN).
        action: UP, DOWN or HOLD.
        target_rate: its target input rate, records/s.
        true_rate_per_instance: records per busy second of one instance (``None``: unknown).
        reason: a short sentence for a person.
    """

    operator: str
    current: int
    needed: int
    target: int
    action: Action
    target_rate: float
    true_rate_per_instance: float | None
    reason: str


def needed_parallelism(target_rate: float, true_rate_per_instance: float, target_utilisation: float,
                       min_parallelism: int, max_parallelism: int, align_to: int | None = None) -> int:
    """DS2's parallelism for one operator, bounded and (with ``align_to``) raised to a divisor.

    Example (Flink's autoscaler test vectors, max parallelism 720)::

        >>> needed_parallelism(50, 10, 1.0, 1, 720)          # vertex rate 100 at parallelism 10
        5
        >>> needed_parallelism(50, 10, 0.8, 1, 720, align_to=720)
        8
    """
    if true_rate_per_instance <= 0:
        raise ValueError(f"true_rate_per_instance must be > 0, got {true_rate_per_instance}")
    wanted = math.ceil(target_rate / true_rate_per_instance / target_utilisation - 1e-9)
    wanted = max(min_parallelism, min(max_parallelism, wanted))
    if align_to:
        for p in range(wanted, min(max_parallelism, align_to // 2) + 1):
            if align_to % p == 0:
                return p
    return wanted


def topological_order(upstream: Mapping[str, Sequence[str]]) -> list[str]:
    """Operators so that each comes after all of its upstream operators.

    Raises:
        ValueError: the graph has a cycle or names an unknown upstream operator.
    """
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(op: str) -> None:
        if state.get(op) == 2:
            return
        if state.get(op) == 1:
            raise ValueError(f"topological_order: cycle through {op!r}")
        if op not in upstream:
            raise ValueError(f"topological_order: unknown operator {op!r}")
        state[op] = 1
        for up in upstream[op]:
            visit(up)
        state[op] = 2
        order.append(op)

    for op in upstream:
        visit(op)
    return order


def target_rates(upstream: Mapping[str, Sequence[str]], rates: Mapping[str, OperatorRates],
                 catch_up_s: float | None) -> dict[str, float]:
    """Each operator's target input rate (a source's: what it is offered and must catch up)."""
    out_rate: dict[str, float] = {}
    target_in: dict[str, float] = {}
    for op in topological_order(upstream):
        r = rates.get(op)
        if not upstream[op]:  # a source: its offered rate, plus its backlog cleared within catch_up_s
            offered = (r.output_rate + max(0.0, r.backlog_growth)) if r else 0.0
            if r and catch_up_s:
                offered += r.backlog / catch_up_s
            target_in[op] = offered
            out_rate[op] = offered
            continue
        target_in[op] = sum(out_rate[u] for u in upstream[op])
        out_rate[op] = target_in[op] * (r.ratio if r else 1.0)
    return target_in


class Ds2Policy:
    """DS2 with hysteresis for the operators it may scale.

    Args:
        upstream: every operator of the graph -> its upstream operators (sources: none).
        scalable: the operators whose parallelism the policy decides (keyed operators).
        config: the knobs.

    Lifecycle: one policy per job; ``decide(now, rates, current)`` once per cut, with ``now`` from one
    clock; ``rescaled(op, now)`` after a rescale of ``op`` was carried out. Only the caller touches it.
    """

    def __init__(self, upstream: Mapping[str, Sequence[str]], scalable: Sequence[str],
                 config: Ds2Config = Ds2Config()):
        topological_order(upstream)  # validates the graph
        unknown = sorted(set(scalable) - set(upstream))
        if unknown:
            raise ValueError(f"Ds2Policy: scalable operators {unknown} are not in the graph")
        self.upstream = {op: list(ups) for op, ups in upstream.items()}
        self.scalable = list(scalable)
        self.config = config
        self._wanted_down: dict[str, list[tuple[float, int]]] = {}  # op -> (time, needed), a streak below
        self._last_rescale: dict[str, float] = {}

    def rescaled(self, operator: str, now: float) -> None:
        """Record that ``operator`` was rescaled at ``now`` (starts its cool-down)."""
        self._last_rescale[operator] = now
        self._wanted_down.pop(operator, None)

    def decide(self, now: float, rates: Mapping[str, OperatorRates],
               current: Mapping[str, int]) -> list[OperatorDecision]:
        """One decision per scalable operator, all from the same rates."""
        targets = target_rates(self.upstream, rates, self.config.catch_up_s)
        return [self._decide_one(op, now, rates.get(op), targets[op], int(current[op])) for op in self.scalable]

    def _decide_one(self, op: str, now: float, r: OperatorRates | None, target: float,
                    current: int) -> OperatorDecision:
        cfg = self.config
        true_rate = r.true_rate_per_instance if r else None

        def hold(needed: int, reason: str) -> OperatorDecision:
            return OperatorDecision(op, current, needed, current, Action.HOLD, target, true_rate, reason)

        if now - self._last_rescale.get(op, -math.inf) < cfg.cooldown_s:
            return hold(current, f"cooling down after a rescale ({cfg.cooldown_s:g} s)")
        if true_rate is None:
            return hold(current, "no busy time measured: the true rate is unknown")
        def need(utilisation: float) -> int:
            return needed_parallelism(target, true_rate, utilisation, cfg.min_parallelism, cfg.max_parallelism,
                                      cfg.align_to)

        needed = need(cfg.target_utilisation)
        why = (f"target {target:,.0f} rec/s at {true_rate:,.0f} rec/s per instance and "
               f"{cfg.target_utilisation:.0%} utilisation needs {needed}")
        if needed > current:
            self._wanted_down.pop(op, None)
            return OperatorDecision(op, current, needed, needed, Action.UP, target, true_rate, why)
        down_need = need(cfg.target_utilisation - cfg.scale_down_margin)  # the dead band's lower edge
        if down_need >= current:
            self._wanted_down.pop(op, None)
            return hold(needed, why + ("" if needed == current else "; within the scale-down dead band"))
        history = self._wanted_down.setdefault(op, [])  # every decision since it first wanted fewer, unbroken
        history.append((now, down_need))
        if now - history[0][0] < cfg.scale_down_stable_s:
            return hold(needed, why + f"; scale-down waits for {cfg.scale_down_stable_s:g} s of steady load")
        down_to = max(n for _, n in history)
        self._wanted_down.pop(op, None)
        return OperatorDecision(op, current, needed, down_to, Action.DOWN, target, true_rate,
                                why + f"; wanted at most {down_to} for {cfg.scale_down_stable_s:g} s")
