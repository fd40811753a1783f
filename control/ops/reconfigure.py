"""reconfigure.py: ``Reconfigure``, change operator parameters consistently (Chi Fig. 4b).

A safe blocking op: each instance of a named operator swaps in its new
parameters in ``on_complete``, at the barrier, so every record is processed
either entirely under the old or entirely under the new parameters, even
when it reaches several reconfigured operators on different paths.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..message import InstanceId
from ..op import ControlOp, InstanceHandler

__all__ = ["Reconfigure"]


class Reconfigure(ControlOp):
    """Set new parameters: ``Reconfigure({"filter-a": {"threshold": 5}, "filter-b": {...}})``.

    Raises (at ``run_control``):
        ValueError: an operator name is unknown.
    """

    blocking = True

    def __init__(self, changes: Mapping[str, Mapping[str, Any]], timeout_s: float | None = 60.0):
        super().__init__()
        self.changes = {op: dict(params) for op, params in changes.items()}
        self.timeout_s = timeout_s

    def on_init(self, ctx: Any) -> dict[InstanceId, Any]:
        unknown = sorted(set(self.changes) - set(ctx.operators))
        if unknown:
            raise ValueError(f"Reconfigure: unknown operators {unknown}; operators: {sorted(ctx.operators)}")
        return {inst: self.changes[inst[0]] for inst in ctx.instances if inst[0] in self.changes}

    class Instance(InstanceHandler):
        def on_complete(self, ctx: Any) -> None:
            if self.config:
                ctx.set_parameters(**self.config)

    def on_complete(self, ctx: Any) -> dict[str, dict[str, Any]]:
        return self.changes
