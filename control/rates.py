"""rates.py: per-operator rates from two successive ``Monitor`` cuts (the inputs of a scaling policy).

A ``Monitor`` cut holds cumulative counters per instance: records in and out,
busy seconds (time spent in operator code) and back-pressured seconds. The
difference of two cuts over the wall time between them gives, per operator:

* the **observed input rate**: records in per second of wall time;
* the **true processing rate** per instance: records in per second of *useful*
  time (busy time; waiting for input and waiting for credit are excluded), so
  it says what one instance could take if it never waited (DS2's "true rate");
* the **output/input ratio** (selectivity), which carries a target rate from
  an operator to its consumers;
* for sources, the **offered rate** and the **backlog** where the source can
  say it (records offered but not yet read), and the backlog's growth.

Pure code: the inputs are plain dicts (``MonitorResult.instances`` rows), so
policies are unit-tested without Ray.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

__all__ = ["OperatorRates", "Cut", "rates_between", "skewed"]

#: Busy time below this (seconds over the interval) says nothing about the true rate: the instance
#: hardly ran, so its rate is not estimated from it.
MIN_BUSY_S = 1e-3


@dataclasses.dataclass(frozen=True, slots=True)
class Cut:
    """One ``Monitor`` cut: when it was taken and each instance's cumulative counters.

    Attributes:
        taken_at: wall-clock seconds.
        instances: ``(operator, index)`` -> metrics (``records_in``, ``records_out``, ``busy_s``,
            ``backpressured_s``; sources may add ``backlog``, records offered but not read yet).
    """

    taken_at: float
    instances: Mapping[tuple[str, int], Mapping[str, Any]]

    @classmethod
    def of(cls, result: Any) -> "Cut":
        """The cut of a ``MonitorResult``."""
        return cls(float(result.taken_at), dict(result.instances))


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorRates:
    """What one operator did between two cuts.

    Attributes:
        operator: its name.
        parallelism: instances seen in the later cut.
        input_rate: records in per second of wall time (all instances).
        output_rate: records out per second of wall time.
        true_rate_per_instance: records in per busy second, averaged over the instances that ran
            (``None`` when no instance was busy long enough to tell).
        ratio: records out / records in (1.0 when nothing came in).
        busy: the mean fraction of the interval the instances were busy.
        backpressured: the mean fraction of the interval the instances waited for credit.
        backlog: records offered to the operator but not read yet (sources that report it), else 0.
        backlog_growth: backlog change per second.
    """

    operator: str
    parallelism: int
    input_rate: float
    output_rate: float
    true_rate_per_instance: float | None
    ratio: float
    busy: float
    backpressured: float
    backlog: float = 0.0
    backlog_growth: float = 0.0


def _sum(rows: Sequence[Mapping[str, Any]], field: str) -> float:
    return float(sum(float(r.get(field, 0) or 0) for r in rows))


def rates_between(earlier: Cut, later: Cut) -> dict[str, OperatorRates]:
    """Per-operator rates between two cuts.

    Instances present in only one cut (a rescale between them) count from zero when new and are
    dropped when gone: their counters restart with their instance.

    Raises:
        ValueError: the later cut is not later.
    """
    interval = later.taken_at - earlier.taken_at
    if interval <= 0:
        raise ValueError(f"rates_between: the later cut must be later (interval {interval:.3f} s)")
    by_operator: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for name, now in later.instances.items():
        before = earlier.instances.get(name, {})
        by_operator.setdefault(name[0], []).append((before, now))
    out = {}
    for operator, pairs in sorted(by_operator.items()):
        deltas = [{f: max(0.0, float(now.get(f, 0) or 0) - float(before.get(f, 0) or 0))
                   for f in ("records_in", "records_out", "busy_s", "backpressured_s")}
                  for before, now in pairs]
        records_in, records_out = _sum(deltas, "records_in"), _sum(deltas, "records_out")
        busy = _sum(deltas, "busy_s")
        true_rate = records_in / busy if busy >= MIN_BUSY_S * len(pairs) and records_in > 0 else None
        backlog_now = sum(float(now.get("backlog", 0) or 0) for _, now in pairs)
        backlog_before = sum(float(before.get("backlog", 0) or 0) for before, _ in pairs)
        out[operator] = OperatorRates(
            operator=operator, parallelism=len(pairs), input_rate=records_in / interval,
            output_rate=records_out / interval, true_rate_per_instance=true_rate,
            ratio=records_out / records_in if records_in > 0 else 1.0,
            busy=min(1.0, busy / interval / len(pairs)),
            backpressured=min(1.0, _sum(deltas, "backpressured_s") / interval / len(pairs)),
            backlog=backlog_now, backlog_growth=(backlog_now - backlog_before) / interval)
    return out


def skewed(busy_by_instance: Mapping[int, float], hot: float = 0.9, idle: float = 0.5) -> bool:
    """Whether one operator's load is skewed: an instance at least ``hot`` busy while the others average
    under ``idle``. Moving bins (``migrate``, hottest first) then helps where more instances would not.

    Args:
        busy_by_instance: instance index -> busy fraction over the last interval.
        hot: the busy fraction of a hot instance.
        idle: the mean busy fraction of the others below which they have room.
    """
    if len(busy_by_instance) < 2:
        return False
    hottest = max(busy_by_instance, key=lambda i: busy_by_instance[i])
    others = [b for i, b in busy_by_instance.items() if i != hottest]
    return busy_by_instance[hottest] >= hot and sum(others) / len(others) < idle
