"""stepwatch.py: the job controller's watchdog over long steps of operator code.

At each liveness check a host reports the step of operator code running there now (``mailbox.LongStep``); a
step running longer than ``step_warning_s`` becomes an event of the job (once per step, and again at
each doubling), naming the operator, instance and user function. The step is left to run. A plain
class without Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .mailbox import LongStep

__all__ = ["StepWatch"]


class StepWatch:
    """Which long steps were reported, and how long each had run then.

    Args:
        bound: ``JobConfig.step_warning_s`` (None: no step is reported).

    Only the controller's event loop touches it.
    """

    def __init__(self, bound: float | None) -> None:
        self.bound = bound
        self._reported: dict[tuple[int, str, int, float], float] = {}  # (host, operator, index, since) -> seconds

    def event(self, host_id: int, step: LongStep | None) -> str | None:
        """The event to record for ``step`` (reported by host ``host_id``), or None: not long, or reported
        already and not yet twice as long."""
        bound = self.bound
        if step is None or bound is None or step["seconds"] < bound:
            return None
        key = (host_id, step["operator"], step["index"], step["since"])
        reported = self._reported.get(key, 0.0)
        if step["seconds"] < max(bound, 2 * reported):
            return None
        self._reported = {k: v for k, v in self._reported.items() if k[:3] != key[:3]}  # older steps ended
        self._reported[key] = step["seconds"]
        return (f"slow step: operator {step['operator']!r} instance {step['index']} (host {host_id}) has run one "
                f"step for {step['seconds']:.0f} s in {step['function']}, over step_warning_s={bound:g}; still running")
