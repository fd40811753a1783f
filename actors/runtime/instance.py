"""instance.py: one operator instance: its dispatcher over its inputs, outputs, control port and counters.

The dispatcher is the one place that branches on a message's type: ``Data``
goes to the operator logic, a ``Watermark`` advances the instance's event-time
clock (``watermarks.py``: the minimum over its inputs), which the logic sees
through ``on_watermark`` before the new watermark is sent on every output,
``End`` closes an input, a ``ControlMessage`` goes to the instance's control
port, whose completed ops are forwarded on every output channel (behind
the data already queued there), along the op's extra edges, or back to the
controller from a sink. An instance is *runnable* when none of its output
channels holds messages waiting for credit and it has input it may take: a
message on an unblocked input channel, an extra-edge control message or a
control run (one op arriving on many of its channels at once, counted in one
step). Sources are ``source.SourceInstance``.

Its pieces, one job each: ``inputs.InstanceInputs`` (input channels in turn,
event-time clock), ``outputs.InstanceOutputs`` (routers, channels, the last
watermark sent), ``controlport.ControlPort`` (control processor, extra-edge
and run queues, prepared changes) and ``statistics.InstanceCounters``. Each
handler returns what it sent as a ``stepresult.Sends``; a step adds them up
into the frozen ``StepResult`` it returns to the host.

Lifecycle: ``lifecycle.InstanceLifecycle``, ``RUNNING -> FINISHING`` (all inputs
ended; an op under way may still need it) ``-> FINISHED`` (final output and
``End`` queued on every output), then closed. Only the owning host touches it.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence, TypeVar

import pyarrow as pa

from chiray.control.message import ControlMessage, InstanceId
from chiray.control.processor import Completion, extra_input
from chiray.operators.endpoints import SinkLogic, SourceLogic
from chiray.operators.logic import InstanceInfo, OperatorLogic
from chiray.operators.upgrade import CanaryTrial, CodeChange, migrate_values

from .change import InstanceChange
from .channel import InputChannel, OutputChannel
from .context import InstanceControlContext
from .controlport import ControlPort
from .failure import OperatorFailure, guarded
from .held import HeldRecords
from .inputs import InstanceInputs
from .instanceview import Migration
from .keptapart import KeptApart
from .lifecycle import InstanceLifecycle
from .messages import ControlRun, Data, End, Envelope, Grant, Watermark
from .outputs import InstanceOutputs
from .replicas import BinReplicas
from .router import Router
from .statistics import InstanceCounters, InstanceStatistics, instance_statistics
from .stepresult import NO_SENDS, Sends, StepResult

CONTROL_RUN = 256
"""At most this many control messages at the heads of its inputs an instance takes in one step."""

RECENT_ROWS = 64
"""Rows per input an instance hands an upgrade's checks (a slice of its last batch)."""

__all__ = ["OperatorInstance", "OperatorFailure"]

R = TypeVar("R")

Taken = tuple[Sends, tuple[Grant, ...], bool]
"""What taking one message sent, the credit it gives back, and whether it was control only."""


class OperatorInstance:
    """An operator instance and its channels (sources: ``source.SourceInstance``).

    Args:
        info: its identity.
        logic: an ``OperatorLogic`` or, for sources, a ``SourceLogic``.
        inputs: its input channels.
        outputs: per output edge, the channels by target position.
        routers: per output edge, its router.
        targets: per output edge, the receiving instance of each channel.
        kind: "source", "transform", "keyed" or "sink".

    Its fields belong to the host's loop thread (the only one that steps it or reads its statistics):
    ``lifecycle`` moves only by its own transitions; ``inputs``, ``outputs``, ``control`` and ``counters``
    are its pieces, each owning its fields.
    """

    is_source = False

    def __init__(self, info: InstanceInfo, logic: OperatorLogic | SourceLogic,
                 inputs: Sequence[InputChannel], outputs: Sequence[Sequence[OutputChannel]],
                 routers: Sequence[Router], host: int = 0,
                 targets: Sequence[Sequence[InstanceId]] = (), kind: str = "transform"):
        self.info = info
        self.name: InstanceId = (info.operator, info.index)
        self.logic = logic
        self.host = host
        self.kind = kind
        self.lifecycle = InstanceLifecycle.RUNNING
        self.counters = InstanceCounters()
        self.inputs = InstanceInputs(info, inputs)
        self.outputs = InstanceOutputs(info, outputs, routers, targets, self.counters)
        ctx = InstanceControlContext(self, kind, self.outputs.downstream())
        self.control = ControlPort(info, self.inputs.ids(), self.is_source, ctx)
        self.replicas = BinReplicas(info)  # copies of other instances' bins kept here
        self._held = HeldRecords(info.num_bins)  # records of bins whose state is on its way (migration)
        self._kept = KeptApart()  # a sink's data that came after a pending checkpoint's barrier
        self._kept_blocked: frozenset = frozenset()  # channels held back while ``_kept`` is full
        self.code: CodeChange | None = None  # the code an upgrade put in place of the submitted one
        self._trial: CanaryTrial | None = None  # new code on trial here (``start_trial``)
        self._call(self.logic.open, info)

    @property
    def records_in(self) -> int:
        """Records taken so far (a source: read); tests wait on it."""
        return self.counters.records_in

    @property
    def records_out(self) -> int:
        """Records emitted so far."""
        return self.counters.records_out

    @property
    def finished(self) -> bool:
        """All inputs ended and final output queued (``InstanceLifecycle.FINISHED``)."""
        return self.lifecycle is InstanceLifecycle.FINISHED

    @property
    def halted(self) -> bool:
        """A source halted at a stop's cut reads nothing (``SourceInstance``); never any other instance."""
        return False

    @property
    def exhausted(self) -> bool:
        """A source that read its last batch (``SourceInstance``); never any other instance."""
        return False

    def halt(self, halted: bool) -> None:
        raise RuntimeError(f"bug: {self.info} is no source, it cannot be halted")

    # -- scheduling ---------------------------------------------------------------

    def output_channels(self) -> list[OutputChannel]:
        return self.outputs.channels()

    def outputs_blocked(self) -> bool:
        return self.outputs.blocked()

    def has_work(self, now: float) -> bool:
        if self.lifecycle is InstanceLifecycle.FINISHED:
            return False
        return self.control.has_work() or self.inputs.has_ready()

    def refresh_input(self, channel: int) -> None:
        """Channel ``channel``'s queue or blocked flag changed: update the set of inputs to take from."""
        if not self.inputs.refresh(channel):
            raise RuntimeError(f"bug: {self.info} has no input channel {channel}; inputs {self.inputs.ids()}, "
                               f"pending changes {list(self.control.pending_changes)}, "
                               f"lifecycle {self.lifecycle.name}")

    def runnable(self, now: float) -> bool:
        """Work to do and credit on every output."""
        return self.has_work(now) and not self.outputs.blocked()

    def note_outputs(self, now: float) -> bool:
        """Account back-pressured time: called whenever output channels may have changed state.

        Returns True when the outputs were held back for credit until now and are free again.
        """
        return self.counters.note_outputs(self.outputs.blocked(), now)

    def wake_time(self) -> float | None:
        """For a paced source: when its next batch is due (None for other instances)."""
        return None

    # -- one step -----------------------------------------------------------------

    def step(self) -> StepResult:
        """Process one message (a source: read one batch); return what the host must act on.

        Raises:
            OperatorFailure: the operator's code raised.
        """
        started = time.perf_counter()
        try:
            sends, grants, took_control = self._take()
            return (sends + self.control.take_acks()).result(grants, took_control)
        finally:
            self.counters.busy_s += time.perf_counter() - started

    def _take(self) -> Taken:
        """Take the next message: along an extra edge, a control run, or from an input in turn."""
        if self.control.extra_inbox:
            message = self.control.extra_inbox.popleft()
            return self._on_control(message, extra_input(message.sender)), (), True  # type: ignore[arg-type]
        if self.control.runs:
            return self._take_run(self.control.runs.popleft()), (), True
        return self._step_input()

    def _step_input(self) -> Taken:
        """Take the next message of an input channel, in turn."""
        env, ich = self.inputs.take()
        grant = ich.grant_for(env)
        sends = self._dispatch(env, ich)
        took_control = isinstance(env.message, ControlMessage)
        if took_control:
            sends += self._take_control_heads()
        return sends, () if grant is None else (grant,), took_control

    def _take_control_heads(self) -> Sends:
        """Go on taking control messages while the next input in turn has one at its head.

        The same as that many steps of this instance, without a trip through the host's loop
        each (an instance with thousands of inputs aligns an op in one or a few steps). Stops
        at a data message, an empty turn, blocked outputs (an op completed and went out) or
        ``CONTROL_RUN`` messages.
        """
        sends = NO_SENDS
        for _ in range(CONTROL_RUN):
            if self.outputs.blocked() or not self.inputs.control_next():
                break
            sends += self._dispatch(*self.inputs.take())
        return sends

    def offer_run(self, run: ControlRun) -> None:
        """Queue control run ``run`` (see ``ControlPort.offer_run``)."""
        self.control.offer_run(run)

    def _take_run(self, run: ControlRun) -> Sends:
        """Count ``run``'s message on each of its channels where it is next in line, in one step; queue
        it on the others, to be taken in turn."""
        arrived, senders = self.inputs.take_run(run)
        if not arrived:
            return NO_SENDS
        self._settle_before(run.message)
        return self._complete_ops(self.control.arrive_many(run.message, arrived, senders))

    def _dispatch(self, env: Envelope, ich: InputChannel) -> Sends:
        message = env.message
        if isinstance(message, Data):
            self.inputs.took_data(ich, message.batch)
            depth = self.control.processor.apart(ich.channel)
            if depth:
                self._keep_apart(depth, message.batch, ich.input_index)
            else:
                self._take_in(message.batch, ich.input_index)
            return NO_SENDS
        if isinstance(message, Watermark):
            self._advance(self.inputs.on_watermark(ich, message))
            return NO_SENDS
        if isinstance(message, ControlMessage):
            return self._on_control(message, ich.channel)
        if isinstance(message, End):
            self.inputs.end(ich)
            sends = self._complete_ops(self.control.input_ended(ich.channel))
            if self.inputs.all_ended():
                return sends + self._maybe_finish()
            self._advance(self.inputs.on_end(ich))
            return sends
        raise TypeError(f"bug: {self.info} received an unknown message {type(message).__name__}")

    def _take_in(self, batch: pa.RecordBatch, input_index: int) -> None:
        batch = self._held.split(batch, input_index) if self._held.active else batch
        if batch is not None:
            self._process(batch, input_index)

    def _keep_apart(self, depth: int, batch: pa.RecordBatch, input_index: int) -> None:
        """A sink: ``batch`` came after ``depth`` pending checkpoints (``keptapart``). Its writer writes it into
        that epoch's output now where it can (and keeps nothing in memory before it); else it waits here until
        they pass."""
        if not self._kept and self._write_ahead(depth, batch, input_index):
            self._kept.note_ahead(depth, batch.num_rows)
            return
        self._kept.add(depth, batch, input_index)
        if self._kept.full:
            self._hold_kept()

    def _write_ahead(self, depth: int, batch: pa.RecordBatch, input_index: int) -> bool:
        if self._trial is not None or not isinstance(self.logic, SinkLogic):
            return False
        if not self._call(self.logic.write_ahead, batch, depth):
            return False
        self._count_in(batch, input_index)
        return True

    def _count_in(self, batch: pa.RecordBatch, input_index: int) -> None:
        self.counters.took(batch.num_rows)
        self.inputs.remember(batch, input_index)

    def take_in_kept(self) -> None:
        """The oldest pending op that kept data apart here completed: take in what came after it."""
        for batch, input_index in self._kept.take():
            self._take_in(batch, input_index)

    def _hold_kept(self) -> None:
        """Hold back the channels whose data is kept apart while that is over its bound; let them go after."""
        processor = self.control.processor
        want = frozenset(ch for ch in processor.kept_apart() if isinstance(ch, int)) if self._kept.full \
            else frozenset()
        held = processor.blocked()
        for channel in want - self._kept_blocked:
            self.inputs.set_blocked(channel, True)
        for channel in self._kept_blocked - want:
            self.inputs.set_blocked(channel, channel in held)
        self._kept_blocked = want

    def _process(self, batch: pa.RecordBatch, input_index: int) -> None:
        self._count_in(batch, input_index)
        if self._trial is not None:
            self.outputs.emit(self._call(self._trial.process, batch, input_index))
            if self._trial.verdict is not None:
                self._end_trial()
            return
        self.outputs.emit(self._call(self.logic.process, batch, input_index))  # type: ignore[union-attr]

    # -- upgrades: new code at a cut, a canary trial ------------------------------------

    def recent_input(self, rows: int = RECENT_ROWS) -> list[tuple[pa.RecordBatch, int]]:
        """A sample of the recent input: the last batch of each input, up to ``rows`` rows each."""
        return self.inputs.recent(rows)

    def upgrade_code(self, change: CodeChange, migrate: Migration | None = None) -> None:
        """Run ``change`` from the next batch on (at an upgrade's cut), ``migrate`` applied to the state first."""
        self._call(self.logic.replace_code, change.fn, change.on_timer, change.schema)  # type: ignore[union-attr]
        if migrate is not None:
            self._call(migrate_values, self.logic.state, migrate)  # type: ignore[union-attr]
        self.code = change

    def start_trial(self, trial: Callable[[], CanaryTrial]) -> None:
        """Run new code on trial here (a canary): its output is held, event time waits, until it ends."""
        self._trial = self._call(trial)
        self.pause_event_time()

    def _settle_before(self, message: ControlMessage) -> None:
        """A control op that does more than observe reached a canary: end its trial first."""
        if self._trial is not None and not getattr(message.op, "observes_only", False):
            self._settle_trial(f"control op {message.kind} reached the canary")

    def _settle_trial(self, why: str) -> None:
        """Something must see this instance's state or output now: end a trial under way first."""
        if self._trial is not None:
            self.outputs.emit(self._call(self._trial.settle, why))
            self._end_trial()

    def _end_trial(self) -> None:
        trial, self._trial = self._trial, None
        assert trial is not None and trial.verdict is not None
        if trial.verdict.passed:
            self.code = trial.change
        self.resume_event_time()

    # -- migration: holding the records of bins whose state is on its way -----------

    def hold_bins(self, bins: Sequence[int], key: str | Sequence[str]) -> None:
        """Buffer records of ``bins`` (in arrival order) until :meth:`release_bins`."""
        self._held.hold(bins, key)

    def release_bins(self, bins: Sequence[int]) -> None:
        """The state of ``bins`` is installed: process their buffered records, in arrival order."""
        for batch, input_index in self._held.release(bins):
            self._process(batch, input_index)
        self._advance(self._held.take_deferred())

    def send_installed_output(self) -> None:
        """Bins were just installed here (a migration step's op completes): emit what their state produced at
        once, ahead of the op. A window of them that the old owner had not fired, but that this instance's event
        time has passed, fires on install into the state's pending output (``WindowState.install_bins``); were
        it left there until the next batch or watermark, a checkpoint cut meanwhile would hold it neither in
        the state (the window is gone) nor downstream, and a recovery from it would lose its rows."""
        take = getattr(getattr(self.logic, "state", None), "take_pending", None)
        out = take() if take is not None else None
        if out:
            self.outputs.emit(out)

    def pause_event_time(self) -> None:
        """Keep incoming watermarks from the operator (the newest is applied on resume)."""
        self._held.pause_event_time()

    def resume_event_time(self) -> None:
        self._held.resume_event_time()
        self._advance(self._held.take_deferred())

    # -- topology changes (rescale) -----------------------------------------------------

    def prepare_change(self, op_id: str, change: InstanceChange) -> None:
        """Apply ``change`` when op ``op_id`` passes; its new inputs may receive deliveries now."""
        self.inputs.add(change.inputs)
        if change.inputs:
            self.lifecycle = self.lifecycle.reopen()  # it ends once the new inputs end too
        self.control.join(op_id, change, [ch.channel for ch in change.inputs])

    # -- control ------------------------------------------------------------------

    def _on_control(self, message: ControlMessage, source: object) -> Sends:
        self._settle_before(message)
        return self._complete_ops(self.control.arrive(message, source))  # type: ignore[arg-type]

    def _complete_ops(self, completions: list[Completion]) -> Sends:
        """Send on the ops that completed here, apply the input blocks they changed; finish if the
        instance's input had ended and it waited for these ops."""
        sends = NO_SENDS
        for c in completions:
            change = self.control.pending_changes.pop(c.message.op_id, None)
            if change is None:
                sent = self.outputs.forward(c)
            else:
                sent = self.outputs.apply_change(change, c)
                self.control.ctx.set_downstream(self.outputs.downstream())
            if sent.extra:
                self.control.extra_ops_sent.add(c.message.op_id)
            sends += sent
        for source, blocked in self.control.take_block_changes():
            if isinstance(source, int):
                self.inputs.set_blocked(source, blocked or source in self._kept_blocked)
        if self._kept_blocked:
            self._hold_kept()
        if completions and self.lifecycle is InstanceLifecycle.FINISHING:
            sends += self._maybe_finish()  # its input had ended; it waited for these ops
        return sends

    def senders_ended(self, ended: Sequence[tuple[InstanceId, frozenset[str]]]) -> StepResult:
        """Instances finished: each sends nothing along extra edges but the ops it lists."""
        sends = NO_SENDS
        for name, sent in ended:
            if not self.finished:
                sends += self._complete_ops(self.control.sender_ended(name, sent))
        return (sends + self.control.take_acks()).result((), True)

    def _advance(self, mark: Watermark | None) -> None:
        """Event time moved: let the operator react (fire windows, timers), then send ``mark`` on.

        While the state of some bins is on its way here (a migration step), event time waits: their
        held records and their windows must meet the watermark they were sent under, so the newest
        mark is kept and applied once the bins are installed and their records processed.
        """
        if mark is None:
            return
        if self._held.defer(mark):
            return
        if not mark.idle:
            self.outputs.emit(self._call(self.logic.on_watermark, mark.timestamp))  # type: ignore[union-attr]
        self.outputs.send_mark(mark)

    def _maybe_finish(self) -> Sends:
        """Finish, unless an op that is under way here still needs this instance.

        Its input has ended (every channel's ``End``; a source: its last batch).
        A topology change prepared here waits for its op (a source that ended
        first would leave its new channels without an ``End``); an op waiting
        for bin state on an extra edge, or records held for that state, would
        be lost by finishing now (the ``End`` of the data channels may overtake
        the old owner's message). The op's arrival finishes it then.
        """
        if self.lifecycle is InstanceLifecycle.FINISHED:
            return NO_SENDS
        self.lifecycle = self.lifecycle.input_ended()
        if self.control.pending_changes or self._held or self.control.pending_ops:
            return NO_SENDS
        return self._finish()

    def _finish(self) -> Sends:
        if self._kept:
            raise RuntimeError(f"bug: {self.info} finishes with data kept apart for an op that never completed")
        self._settle_trial("its input ended")
        self.outputs.emit(self._call(self.logic.finish))  # type: ignore[union-attr]
        return self._close_outputs()

    def _close_outputs(self) -> Sends:
        self.outputs.close()
        self.lifecycle = self.lifecycle.finish()
        return FINISHED

    def _call(self, fn: Callable[..., R], *args: object) -> R:
        return guarded(self.info, fn, *args)

    # -- results and statistics ---------------------------------------------------

    def sink_result(self) -> object:
        return self.logic.result if isinstance(self.logic, SinkLogic) else None

    @property
    def drained(self) -> bool:
        """Finished and every output message has left."""
        return self.finished and not self.outputs.blocked()

    def close(self) -> None:
        self.logic.close()

    def statistics(self) -> InstanceStatistics:
        """A snapshot of this instance now."""
        return instance_statistics(self.info, self.host, self.counters, self.inputs, self.outputs.channels(),
                                   self.control.completed, self.logic, self.finished, time.monotonic(),
                                   self._kept.records)


FINISHED = Sends(finished=True)
"""What finishing sends besides the ``End`` on every output channel: the news, for the host."""
