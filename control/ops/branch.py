"""branch.py: ``AddBranch``, the op at whose cut a branch added to a running job starts.

The runtime prepares the topology change first (the branch's instances built, the running operator's new output
channels kept aside); when the op completes at an instance of the running operator, that instance acknowledges
the records it had emitted before it (the cut) and forwards the op on its running and its new channels, so the op
is the first message of every new channel and the branch receives exactly the records emitted after the cut.
Non-blocking: nothing waits for it.
"""

from __future__ import annotations

from typing import Any

from ..message import InstanceId
from ..op import ControlOp, InstanceHandler

__all__ = ["AddBranch"]


class AddBranch(ControlOp):
    """Start a branch downstream of ``operator``. Its result: instance -> records it emitted before the cut."""

    blocking = False

    def __init__(self, operator: str, timeout_s: float | None = 60.0):
        super().__init__()
        self.operator = operator
        self.timeout_s = timeout_s

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return {i for i in ctx.instances if i[0] == self.operator}

    def on_init(self, ctx: Any) -> dict[InstanceId, Any]:
        return {i: True for i in ctx.instances if i[0] == self.operator}

    class Instance(InstanceHandler):
        def on_complete(self, ctx: Any) -> None:
            if self.config:
                ctx.ack(ctx.statistics().records_out)

    def on_complete(self, ctx: Any) -> dict[InstanceId, Any]:
        return dict(self.acks)
