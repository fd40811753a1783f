"""acks.py: ``OperatorAcks``, a non-blocking op that every instance of one operator acknowledges (what each
acknowledges is its subclass's ``Instance``); its result is instance -> acknowledgement."""

from __future__ import annotations

from typing import Any

from ..message import InstanceId
from ..op import ControlOp

__all__ = ["OperatorAcks"]


class OperatorAcks(ControlOp):
    """Non-blocking: each instance of ``operator`` (configured ``True``) acknowledges; the others forward it.

    Attributes:
        verb: what the op serves, for messages (an unknown operator is refused naming it).
    """

    blocking = False
    verb = "control op"

    def __init__(self, operator: str, timeout_s: float | None = 30.0):
        super().__init__()
        self.operator = operator
        self.timeout_s = timeout_s

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return {i for i in ctx.instances if i[0] == self.operator}

    def on_init(self, ctx: Any) -> dict[InstanceId, Any]:
        if self.operator not in ctx.operators:
            raise ValueError(f"{self.verb}: unknown operator {self.operator!r}; operators: {sorted(ctx.operators)}")
        return {i: True for i in ctx.instances if i[0] == self.operator}

    def on_complete(self, ctx: Any) -> dict[InstanceId, Any]:
        return dict(self.acks)
