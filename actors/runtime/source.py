"""source.py: a source instance: reads batches from its splits and takes control ops from a controller.

A source has no input channels. It runs when its next batch is due (a paced
source says when; see ``SourceLogic.ready_at``) or when it has a control
message: one injected by a controller into its *inbox*, ordered by the
controller's global sequence so that every source sees ops in one order, or
one along an op's extra edge. Its watermark is the one its logic computes
from the batches it read; it does not defer event time during a migration
(it holds no keyed state). A stop's final checkpoint *halts* it at its cut: it
reads nothing more, unless the checkpoint failed and the job runs on
(``lifecycle.SourceGate``). Lifecycle as ``OperatorInstance``, and its reading
``READING -> EXHAUSTED`` (``lifecycle.SourceLifecycle``): it finishes once its
last batch is read and no prepared change is pending.
"""

from __future__ import annotations

from typing import cast

from chiray.control.message import CONTROLLER, ControlMessage

from .channel import InputChannel
from .instance import OperatorInstance, Taken
from .lifecycle import SourceGate, SourceLifecycle
from .messages import Envelope, Watermark
from .stepresult import NO_SENDS, Sends

__all__ = ["CONTROL_INBOX", "SourceInstance"]

CONTROL_INBOX = -1
"""The channel id of a source's control inbox (ordered by global injection sequence)."""


class SourceInstance(OperatorInstance):
    """An instance of a source operator (its logic is a ``SourceLogic``)."""

    is_source = True

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.inbox = InputChannel(CONTROL_INBOX, -1)
        self.reading = SourceLifecycle.READING
        self.gate = SourceGate.OPEN
        super().__init__(*args, **kwargs)

    @property
    def exhausted(self) -> bool:
        """Its last batch was read (it finishes once no change is pending)."""
        return self.reading is SourceLifecycle.EXHAUSTED

    @property
    def halted(self) -> bool:
        return self.gate is SourceGate.HALTED

    def halt(self, halted: bool) -> None:
        """Read nothing after a stop's cut (``halted``), or read on (the stop's checkpoint failed)."""
        self.gate = self.gate.halt() if halted else self.gate.open()

    def has_work(self, now: float) -> bool:
        if self.finished:
            return False
        if self.control.has_work() or self.inbox.ready():
            return True
        if self.exhausted or self.halted:
            return False  # it waits for the op of a pending change, or of a resume (its inbox wakes it)
        ready = self.logic.ready_at()  # type: ignore[union-attr]
        return ready is None or ready <= now

    def wake_time(self) -> float | None:
        """When its next batch is due (None: now, or never once finished or halted)."""
        return None if self.finished or self.halted else self.logic.ready_at()  # type: ignore[union-attr]

    def control_ready(self) -> bool:
        """A control message to take next (injected, or along an extra edge)."""
        return not self.finished and (bool(self.control.extra_inbox) or self.inbox.ready())

    def hold_for(self, op_id: str) -> None:
        """Stay open until op ``op_id`` has passed here, changing nothing (see ``HostCore.prepare_change``):
        a source that finished first would drop the op, and the instances after it wait for it."""
        self.control.hold_for(op_id)

    def inject(self, message: ControlMessage) -> None:
        """A control message from the controller, placed by its global sequence."""
        self.inbox.offer(Envelope(CONTROL_INBOX, message.seq, message))

    def _step_input(self) -> Taken:
        if self.inbox.ready():
            return self._on_control(cast(ControlMessage, self.inbox.take().message), CONTROLLER), (), True
        if self.halted:  # a stop's cut passed here: nothing after it is read
            return NO_SENDS, (), False
        batch = self._call(self.logic.poll)  # type: ignore[union-attr]
        if batch is None:
            self.reading = self.reading.exhaust()
            return self._maybe_finish(), (), False
        self.counters.took(batch.num_rows)
        self.outputs.emit([batch])
        mark = self._call(self.logic.watermark)  # type: ignore[union-attr]
        self._advance(self.inputs.watermarks.output.offer(*mark))
        return NO_SENDS, (), False

    def _advance(self, mark: Watermark | None) -> None:
        if mark is not None:
            self.outputs.send_mark(mark)

    def _finish(self) -> Sends:
        return self._close_outputs()
