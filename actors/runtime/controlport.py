"""controlport.py: an operator instance's control port: its control processor and the control input it waits on.

:class:`ControlPort` owns what the instance knows of control ops: the
processor that drives every op's handlers there (``control.processor``), the
context those handlers see (``context.py``), the control messages that came
along extra edges or as runs (taken before the data inputs), the topology
changes prepared under an op's id and the ops it sent along extra edges.
Each call into the processor returns the ops it completed; the
acknowledgements that handlers make through the context (at once, or later,
as a canary's verdict) are taken once a step (``take_acks``). Only the owning
instance (on its host's loop) touches it.
"""

from __future__ import annotations

import collections
from typing import Hashable, Sequence

from chiray.control.message import ControlMessage, InstanceId
from chiray.control.processor import Completion, ControlProcessor, extra_input
from chiray.operators.logic import InstanceInfo

from .change import InstanceChange
from .context import InstanceControlContext
from .failure import guarded
from .messages import ControlRun
from .stepresult import NO_SENDS, Sends

__all__ = ["ControlPort"]


class ControlPort:
    """The control side of one instance.

    Args:
        info: the instance's identity.
        inputs: its data input channels' ids.
        is_source: a source (it also expects each op from the controller).
        ctx: what its control handlers see of it.
    """

    def __init__(self, info: InstanceInfo, inputs: Sequence[int], is_source: bool, ctx: InstanceControlContext):
        self._info = info
        self.processor = ControlProcessor((info.operator, info.index), list(inputs), is_source)
        self.ctx = ctx
        self.extra_inbox: collections.deque[ControlMessage] = collections.deque()
        self.runs: collections.deque[ControlRun] = collections.deque()  # taken before the inputs
        self.pending_changes: dict[str, InstanceChange | None] = {}  # op id -> the change it activates
        self.extra_ops_sent: set[str] = set()  # ops sent along extra edges (told with the end notice)

    @property
    def completed(self) -> int:
        """Ops completed here so far."""
        return self.processor.completed

    @property
    def pending_ops(self) -> list[str]:
        """Ops under way here, by global sequence."""
        return self.processor.pending_ops

    def share_ended_peers(self, ended: dict[InstanceId, frozenset[str]]) -> None:
        """The host's table of finished instances (and the ops each sent on extra edges): later ops
        expect nothing along extra edges from them."""
        self.processor.ended_senders = ended

    def has_work(self) -> bool:
        """A control message along an extra edge or a run waits to be taken."""
        return bool(self.extra_inbox or self.runs)

    def deliver_extra(self, message: ControlMessage) -> None:
        self.extra_inbox.append(message)

    def offer_run(self, run: ControlRun) -> None:
        """Queue control run ``run``; it joins the run queued last if that carries the same message
        (but for the senders), so copies that reach this instance over several steps of its
        senders are still counted in one step."""
        if self.runs:
            last = self.runs[-1]
            if last.message.op_id == run.message.op_id and last.message.payload is run.message.payload:
                last.channels.extend(run.channels)
                last.seqs.extend(run.seqs)
                last.senders.extend(run.senders)
                return
        self.runs.append(run)

    def arrive(self, message: ControlMessage, source: Hashable) -> list[Completion]:
        """``message`` arrived on input ``source`` (a channel id, the controller or an extra edge): the ops
        that completed, in release order."""
        return guarded(self._info, self.processor.arrive, message, source, self.ctx)

    def arrive_many(self, message: ControlMessage, channels: list[int], senders: list[InstanceId]
                    ) -> list[Completion]:
        """``message`` arrived on each of ``channels`` from ``senders``, counted in one step."""
        return guarded(self._info, self.processor.arrive_many, message, channels, senders, self.ctx)

    def input_ended(self, source: Hashable, sent: frozenset[str] = frozenset()) -> list[Completion]:
        """Input ``source`` ended (an extra edge's sender: but for the ops ``sent`` along it)."""
        return guarded(self._info, self.processor.input_ended, source, self.ctx, sent)

    def sender_ended(self, name: InstanceId, sent: frozenset[str]) -> list[Completion]:
        return self.input_ended(extra_input(name), sent)

    def join(self, op_id: str, change: InstanceChange, channels: Sequence[int]) -> None:
        """Apply ``change`` when op ``op_id`` passes; ``channels``, new inputs, count for that op and every
        later one (not for earlier ones, which their senders never see)."""
        self.pending_changes[op_id] = change
        self.processor.join(op_id, list(channels))

    def hold_for(self, op_id: str) -> None:
        """Stay open until op ``op_id`` has passed, changing nothing (a source during a rescale)."""
        self.pending_changes[op_id] = None

    def take_block_changes(self) -> list[tuple[Hashable, bool]]:
        return self.processor.take_block_changes()

    def take_acks(self) -> Sends:
        """The acks that handlers made since the last call, in the order they made them."""
        acks = self.ctx.take_acks()
        return Sends(acks=acks) if acks else NO_SENDS
