"""noop.py: ``NoOp``, a control op that does nothing at instances: it measures the control plane itself."""

from __future__ import annotations

from typing import Any

from ..op import ControlOp

__all__ = ["NoOp"]


class NoOp(ControlOp):
    """Travels the whole dataflow and returns; blocking or not.

    Its result is the number of sinks that returned it.
    """

    def __init__(self, blocking: bool = True, timeout_s: float | None = 60.0):
        super().__init__()
        self.blocking = blocking
        self.timeout_s = timeout_s

    def on_complete(self, ctx: Any) -> int:
        return len(self.returned)
