"""strategychoice.py: which migration strategy and knobs a rescale uses, given a latency budget.

A rescale moves the state of the bins that change owner. How long records
wait meanwhile depends on the strategy (``actors/jobs/rescale.py``):
all-at-once holds every moving bin for the whole transfer, batched and
non-disruptive steps hold one chunk at a time, and replication ships the
bytes ahead so a step sends only what changed since. This module predicts a
step's pause from the bytes it moves, a transfer rate and a per-step
overhead, inflated by the load (a step shares the cores with the stream: at
utilisation rho a piece of work waits about ``1 / (1 - rho)`` times its
length, capped), and picks:

* **all_at_once** when the whole move fits the budget (the shortest
  migration, Megaphone's baseline);
* **non_disruptive** in chunks sized to fit the budget, paced with a gap that
  lets the backlog of a step drain before the next, when it does not;
* **non_disruptive one bin a step, replicated ahead** when even one bin does not fit;
* **hot_first** order when the per-bin load is skewed (the hot bins reach
  their new owner first, where they relieve the most load).

The prediction (duration, worst latency) is recorded beside the outcome in
the rescale history so the model can be checked. Pure code, no Ray.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

__all__ = ["MigrationModel", "StrategyChoice", "choose_strategy", "moving_fraction"]


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationModel:
    """The cost model's constants (measured on a 2-core machine; override per cluster).

    Attributes:
        transfer_bytes_per_s: state extracted, shipped and installed per second on an idle machine.
        step_overhead_ms: the fixed cost of one step (its control op's round trip), idle machine.
        baseline_latency_ms: record latency with no migration running.
        max_inflation: the cap on the load's inflation of a step.
        skew_ratio: hot-first order when the hottest bin has this many times the mean bin load.
    """

    transfer_bytes_per_s: float = 100e6
    step_overhead_ms: float = 30.0
    baseline_latency_ms: float = 15.0
    max_inflation: float = 5.0
    skew_ratio: float = 4.0


@dataclasses.dataclass(frozen=True, slots=True)
class StrategyChoice:
    """A strategy, its knobs and what the model predicts for it.

    Attributes:
        strategy: ``all_at_once`` or ``non_disruptive``.
        knobs: the rescale knobs (``chunk_bins``, ``priority``, ``replicate``, ``gap_s``).
        predicted_max_latency_ms: the worst record latency the model expects.
        predicted_duration_s: how long the migration should take.
        reason: one sentence for a person.
    """

    strategy: str
    knobs: dict[str, Any]
    predicted_max_latency_ms: float
    predicted_duration_s: float
    reason: str


def moving_fraction(old_parallelism: int, new_parallelism: int) -> float:
    """The share of the state that changes owner when bins spread evenly over the new instances."""
    if old_parallelism < 1 or new_parallelism < 1:
        raise ValueError(f"parallelism must be >= 1, got {old_parallelism} -> {new_parallelism}")
    return abs(new_parallelism - old_parallelism) / max(old_parallelism, new_parallelism)


def _inflation(load: float, model: MigrationModel) -> float:
    return min(model.max_inflation, 1.0 / max(1e-9, 1.0 - min(max(load, 0.0), 0.999)))


def _priority(bin_loads: Sequence[float] | None, model: MigrationModel) -> str:
    """``hot_first`` when the per-bin load is skewed (the hottest bin ``skew_ratio`` times the mean), else
    ``arrival``."""
    if bin_loads is not None and len(bin_loads) and sum(bin_loads) > 0:
        mean = sum(bin_loads) / len(bin_loads)
        if max(bin_loads) >= model.skew_ratio * mean:
            return "hot_first"
    return "arrival"


@dataclasses.dataclass(frozen=True, slots=True)
class _Move:
    """What a rescale moves (``nbytes`` in ``bins``) and what a step of it costs under the load's ``inflation``."""

    nbytes: float
    bins: int
    inflation: float
    model: MigrationModel

    def pause_ms(self, nbytes: float) -> float:
        """The predicted pause of a step that moves ``nbytes``."""
        return (self.model.step_overhead_ms + 1000.0 * nbytes / self.model.transfer_bytes_per_s) * self.inflation


def choose_strategy(state_bytes: float, num_bins: int, old_parallelism: int, new_parallelism: int,
                    load: float, latency_budget_ms: float, model: MigrationModel = MigrationModel(),
                    bin_loads: Sequence[float] | None = None) -> StrategyChoice:
    """The strategy and knobs for one rescale of a keyed operator.

    Args:
        state_bytes: the operator's keyed state, all instances.
        num_bins: its key bins.
        old_parallelism, new_parallelism: the rescale.
        load: the busiest instance's utilisation now, in [0, 1].
        latency_budget_ms: the job's record-latency budget.
        model: the cost model.
        bin_loads: records per bin recently (for the skew check), optional.

    Raises:
        ValueError: a budget that is not positive or a bad parallelism.
    """
    if latency_budget_ms <= 0:
        raise ValueError(f"latency_budget_ms must be > 0, got {latency_budget_ms}")
    fraction = moving_fraction(old_parallelism, new_parallelism)
    move = _Move(state_bytes * fraction, max(1, round(num_bins * fraction)), _inflation(load, model), model)
    priority = _priority(bin_loads, model)
    room = latency_budget_ms - model.baseline_latency_ms
    whole = move.pause_ms(move.nbytes)
    if whole <= room:
        return StrategyChoice("all_at_once", {}, model.baseline_latency_ms + whole, whole / 1000.0,
                              f"{move.nbytes / 2**20:.1f} MiB move in about {whole:.0f} ms, within the "
                              f"{latency_budget_ms:g} ms budget")
    return _in_steps(move, room, whole, load, latency_budget_ms, priority)


def _in_steps(move: _Move, room: float, whole: float, load: float, latency_budget_ms: float,
              priority: str) -> StrategyChoice:
    """``non_disruptive``: chunks of bins sized to the budget's ``room``, or one bin a step, replicated ahead."""
    model = move.model
    bytes_per_bin = move.nbytes / move.bins
    per_step_bytes = (room / move.inflation - model.step_overhead_ms) / 1000.0 * model.transfer_bytes_per_s
    chunk = int(per_step_bytes // bytes_per_bin) if bytes_per_bin > 0 else move.bins
    if chunk >= 1:
        chunk = min(chunk, move.bins)
        steps = math.ceil(move.bins / chunk)
        step = move.pause_ms(chunk * bytes_per_bin)
        gap_s = step / 1000.0 * min(load, 0.999) / max(1e-3, 1.0 - load)  # the step's backlog drains
        knobs = {"chunk_bins": chunk, "priority": priority, "gap_s": round(gap_s, 3)}
        return StrategyChoice("non_disruptive", knobs, model.baseline_latency_ms + step,
                              steps * (step / 1000.0 + gap_s),
                              f"all at once would pause about {whole:.0f} ms; {steps} steps of {chunk} bins "
                              f"stay within the {latency_budget_ms:g} ms budget")
    step = move.pause_ms(0.0)  # replicated ahead: a step sends little more than a marker
    knobs = {"chunk_bins": 1, "priority": priority, "replicate": True}
    return StrategyChoice("non_disruptive", knobs, model.baseline_latency_ms + step,
                          move.bins * step / 1000.0 + move.nbytes / model.transfer_bytes_per_s,
                          f"one bin ({bytes_per_bin / 2**20:.2f} MiB) does not fit the {latency_budget_ms:g} ms "
                          "budget: bins move one at a time, copied ahead")
