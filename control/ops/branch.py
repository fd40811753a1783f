"""branch.py: ``AddBranch``, the op at whose cut a branch added to a running job starts, and ``RemoveBranch``, the
op at whose cut one ends.

The runtime prepares the topology change first (the branch's instances built, the running operator's new output
channels kept aside); when the op completes at an instance of the running operator, that instance acknowledges
the records it had emitted before it (the cut) and forwards the op on its running and its new channels, so the op
is the first message of every new channel and the branch receives exactly the records emitted after the cut.
Non-blocking: nothing waits for it.

``RemoveBranch`` passes the same way; where it completes, an instance of the running operator forwards it on
the channels to the branch, then closes them (``End``): the branch receives exactly the records emitted before
the cut, finishes, and its instances retire.
"""

from __future__ import annotations

from typing import Any

from ..op import InstanceHandler
from .acks import OperatorAcks

__all__ = ["AddBranch", "RemoveBranch"]


class AddBranch(OperatorAcks):
    """Start a branch downstream of ``operator``. Its result: instance -> records it emitted before the cut."""

    verb = "add_branch"

    def __init__(self, operator: str, timeout_s: float | None = 60.0):
        super().__init__(operator, timeout_s)

    class Instance(InstanceHandler):
        def on_complete(self, ctx: Any) -> None:
            if self.config:
                ctx.ack(ctx.statistics().records_out)


class RemoveBranch(AddBranch):
    """End a branch downstream of ``operator``. Its result: instance -> records it emitted before the cut (all
    that the branch receives)."""

    verb = "remove_branch"
