"""instance.py: one operator instance: its input and output channels, its dispatcher and its statistics.

The dispatcher is the one place that branches on a message's type: ``Data``
goes to the operator logic, a ``Watermark`` advances the instance's event-time
clock (``watermarks.py``: the minimum over its inputs), which the logic sees
through ``on_watermark`` before the new watermark is sent on every output,
``End`` closes an input, a ``ControlMessage`` goes to the instance's control
processor, whose completed ops are forwarded on every output channel (behind
the data already queued there), along the op's extra edges, or back to the
controller from a sink. An instance is *runnable* when none of its output
channels holds messages waiting for credit and it has input it may take: a
message on an unblocked input channel, an extra-edge control message or a
control run (one op arriving on many of its channels at once, counted in one
step). Sources are ``source.SourceInstance``. Each step returns a frozen
``StepResult`` to the host.

Lifecycle: ``RUNNING -> FINISHED`` (all inputs ended, final output and
``End`` queued on every output) ``-> CLOSED``. Only the owning host touches it.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from chiray.control.message import CONTROLLER, ControlMessage, ControlReturn, InstanceId, instance_id
from chiray.control.processor import Completion, ControlProcessor, extra_input
from chiray.operators.endpoints import SinkLogic, SourceLogic
from chiray.operators.errors import ChirayError
from chiray.operators.logic import InstanceInfo, OperatorLogic, SideOutput
from chiray.operators.upgrade import CanaryTrial, CodeChange, migrate_values

from .channel import InputChannel, OutputChannel
from .held import HeldRecords
from .replicas import BinReplicas
from .statistics import InstanceStatistics, instance_statistics
from .context import InstanceControlContext
from .messages import ControlRun, Data, End, Envelope, Grant, Watermark
from .router import Router
from .stepresult import NOTHING, Ack, ControlSend, StepResult
from .watermarks import InputWatermarks

if TYPE_CHECKING:
    from .topology import InstanceChange

CONTROL_RUN = 256
"""At most this many control messages at the heads of its inputs an instance takes in one step."""

RECENT_ROWS = 64
"""Rows per input an instance hands an upgrade's checks (a slice of its last batch)."""

__all__ = ["OperatorInstance", "OperatorFailure"]


class OperatorFailure(ChirayError):
    """Raised by :meth:`OperatorInstance.step` when the operator's code raised."""

    def __init__(self, info: InstanceInfo, cause: BaseException):
        super().__init__(f"{info}: {type(cause).__name__}: {cause}")
        self.info = info
        self.cause = cause


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
    """

    is_source = False
    halted = False  # a source halted at a stop's cut reads nothing (``SourceInstance``)
    exhausted = False  # a source read its last batch (it finishes once no change is pending)

    def __init__(self, info: InstanceInfo, logic: OperatorLogic | SourceLogic,
                 inputs: Sequence[InputChannel], outputs: Sequence[Sequence[OutputChannel]],
                 routers: Sequence[Router], host: int = 0,
                 targets: Sequence[Sequence[InstanceId]] = (), kind: str = "transform"):
        self.info = info
        self.name: InstanceId = (info.operator, info.index)
        self.logic = logic
        self.inputs = list(inputs)
        self.outputs = [list(chs) for chs in outputs]
        self.routers = list(routers)
        self.targets = [list(t) for t in targets] or [[] for _ in self.outputs]
        self.host = host
        self.kind = kind
        self.finished = False
        self._index_of = {ch.channel: i for i, ch in enumerate(self.inputs)}
        # Inputs with a message to take and not blocked, in turn. Ordered (not a dict): taking from
        # the front of a dict again and again leaves holes that each look-up of its first key walks.
        self._ready_inputs: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.watermarks = InputWatermarks(len(self.inputs))
        self.control = ControlProcessor(self.name, [ch.channel for ch in self.inputs], self.is_source)
        self.extra_inbox: collections.deque[ControlMessage] = collections.deque()
        self.control_runs: collections.deque[ControlRun] = collections.deque()  # taken before the inputs
        # What a step produces for the host besides its output channels' queues (see ``_result``).
        self._extra: list[tuple[InstanceId, ControlMessage]] = []
        self._control_out: list[ControlSend] = []  # sent at once: the host gathers them into runs
        self._returns: list[ControlReturn] = []
        self._acks: list[Ack] = []
        self._closed: list[OutputChannel] = []
        self._finished_now = False
        self.ctx = InstanceControlContext(self, kind, [t for ts in self.targets for t in ts])
        self._bp_since: float | None = None
        self.backpressured_s = self.busy_s = 0.0
        self.records_in = self.records_out = self.batches_in = self.batches_out = 0
        self.pending_changes: dict[str, "InstanceChange | None"] = {}  # op id -> the change it activates
        self.extra_ops_sent: set[str] = set()  # ops sent along extra edges (told with the end notice)
        self.replicas = BinReplicas(info)  # copies of other instances' bins kept here
        self._held = HeldRecords(info.num_bins)  # records of bins whose state is on its way (migration)
        self._sent_mark: Watermark | None = None  # the last watermark sent on the outputs
        self.code: CodeChange | None = None  # the code an upgrade put in place of the submitted one
        self._recent: dict[int, pa.RecordBatch] = {}  # input index -> a slice of its last batch (upgrade checks)
        self.records_by_channel: dict[int, int] = {}  # records taken per input channel (an upgrade's cut)
        self._trial: CanaryTrial | None = None  # new code on trial here (``start_trial``)
        self._call(self.logic.open, info)

    # -- scheduling ---------------------------------------------------------------

    def output_channels(self) -> list[OutputChannel]:
        return [ch for chs in self.outputs for ch in chs]

    def outputs_blocked(self) -> bool:
        for chs in self.outputs:  # a plain loop: asked several times a step
            for ch in chs:
                if ch.pending:
                    return True
        return False

    def has_work(self, now: float) -> bool:
        if self.finished:
            return False
        return bool(self.extra_inbox or self.control_runs or self._ready_inputs)

    def refresh_input(self, channel: int) -> None:
        """Channel ``channel``'s queue or blocked flag changed: update the set of inputs to take from."""
        i = self._index_of.get(channel)
        if i is None:
            raise RuntimeError(f"bug: {self.info} has no input channel {channel}; inputs "
                               f"{[ch.channel for ch in self.inputs]}, pending changes {list(self.pending_changes)}, "
                               f"finished {self.finished}")
        if self.inputs[i].ready():
            self._ready_inputs.setdefault(i, None)
        else:
            self._ready_inputs.pop(i, None)

    def runnable(self, now: float) -> bool:
        """Work to do and credit on every output."""
        return self.has_work(now) and not self.outputs_blocked()

    def note_outputs(self, now: float) -> bool:
        """Account back-pressured time: called whenever output channels may have changed state.

        Returns True when the outputs were held back for credit until now and are free again.
        """
        blocked = self.outputs_blocked()
        if blocked and self._bp_since is None:
            self._bp_since = now
        elif not blocked and self._bp_since is not None:
            self.backpressured_s += now - self._bp_since
            self._bp_since = None
            return True
        return False

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
            if self.extra_inbox:
                message = self.extra_inbox.popleft()
                self._on_control(message, extra_input(message.sender))  # type: ignore[arg-type]
                return self._result((), True)
            if self.control_runs:
                self._take_run(self.control_runs.popleft())
                return self._result((), True)
            return self._step_input()
        finally:
            self.busy_s += time.perf_counter() - started

    def _step_input(self) -> StepResult:
        """Take the next message of an input channel, in turn."""
        env = self._take_input()
        grant = self.inputs[self._current].grant_for(env)
        self._dispatch(env, self.inputs[self._current])
        took_control = isinstance(env.message, ControlMessage)
        if took_control:
            self._take_control_heads()
        return self._result(() if grant is None else (grant,), took_control)

    def _result(self, grants: tuple[Grant, ...], took_control: bool) -> StepResult:
        """Hand over what this step produced for the host (and forget it here)."""
        if not (self._control_out or self._extra or self._returns or self._acks or self._closed
                or self._finished_now):
            if not grants and not took_control:
                return NOTHING
            return StepResult(grants, took_control=took_control)
        result = StepResult(grants, tuple(self._control_out), tuple(self._extra), tuple(self._returns),
                            tuple(self._acks), tuple(self._closed), self._finished_now, took_control)
        self._control_out.clear()
        self._extra.clear()
        self._returns.clear()
        self._acks.clear()
        self._closed.clear()
        self._finished_now = False
        return result

    def _take_control_heads(self) -> None:
        """Go on taking control messages while the next input in turn has one at its head.

        The same as that many steps of this instance, without a trip through the host's loop
        each (an instance with thousands of inputs aligns an op in one or a few steps). Stops
        at a data message, an empty turn, blocked outputs (an op completed and went out) or
        ``CONTROL_RUN`` messages.
        """
        for _ in range(CONTROL_RUN):
            if not self._ready_inputs or self.outputs_blocked():
                return
            channel = self.inputs[next(iter(self._ready_inputs))]
            if not isinstance(channel.queue[0].message, ControlMessage):
                return
            self._dispatch(self._take_input(), channel)

    def offer_run(self, run: ControlRun) -> None:
        """Queue control run ``run``; it joins the run queued last if that carries the same message
        (but for the senders), so copies that reach this instance over several steps of its
        senders are still counted in one step."""
        if self.control_runs:
            last = self.control_runs[-1]
            if last.message.op_id == run.message.op_id and last.message.payload is run.message.payload:
                last.channels.extend(run.channels)
                last.seqs.extend(run.seqs)
                last.senders.extend(run.senders)
                return
        self.control_runs.append(run)

    def _take_run(self, run: ControlRun) -> None:
        """Count ``run``'s message on each of its channels where it is next in line (nothing queued
        before it, not blocked), in one step; queue it on the others, to be taken in turn."""
        message = run.message
        arrived: list[int] = []
        senders: list[Any] = []
        for channel, seq, sender in zip(run.channels, run.seqs, run.senders):
            i = self._index_of.get(channel)
            if i is None:
                raise RuntimeError(f"bug: {self.info} has no input channel {channel} for control message "
                                   f"{message.op_id}; inputs {[ch.channel for ch in self.inputs]}")
            ich = self.inputs[i]
            if ich.take_in_place(seq):
                arrived.append(channel)
                senders.append(sender)
                if ich.queue:  # what waited behind it in the reorder buffer
                    self.refresh_input(channel)
            else:
                copy = message if message.sender == sender else message.hop(sender, message.payload)
                if ich.offer(Envelope(channel, seq, copy)):
                    self.refresh_input(channel)
        if arrived:
            if self._trial is not None and not getattr(message.op, "observes_only", False):
                self._settle_trial(f"control op {message.kind} reached the canary")
            self._complete_ops(self._call(self.control.arrive_many, message, arrived, senders, self.ctx))

    def _take_input(self) -> Envelope:
        if not self._ready_inputs:
            raise AssertionError(f"bug in scheduler: {self.info} stepped without input")
        i = self._ready_inputs.popitem(last=False)[0]  # back of the line if it has more: inputs take turns
        self._current = i
        env = self.inputs[i].take()
        if self.inputs[i].ready():
            self._ready_inputs[i] = None
        return env

    def _dispatch(self, env: Envelope, channel: InputChannel) -> None:
        message = env.message
        if isinstance(message, Data):
            self.records_by_channel[channel.channel] = (self.records_by_channel.get(channel.channel, 0)
                                                        + message.batch.num_rows)
            batch = self._held.split(message.batch, channel.input_index) if self._held.active else message.batch
            if batch is not None:
                self._process(batch, channel.input_index)
        elif isinstance(message, Watermark):
            self._advance(self.watermarks.on_watermark(self._index_of[channel.channel], message))
        elif isinstance(message, ControlMessage):
            self._on_control(message, channel.channel)
        elif isinstance(message, End):
            channel.ended = True
            self._complete_ops(self._call(self.control.input_ended, channel.channel, self.ctx))
            if all(ch.ended for ch in self.inputs):
                self._maybe_finish()
            else:
                self._advance(self.watermarks.on_end(self._index_of[channel.channel]))
        else:
            raise TypeError(f"bug: {self.info} received an unknown message {type(message).__name__}")

    def _process(self, batch: pa.RecordBatch, input_index: int) -> None:
        self.records_in += batch.num_rows
        self.batches_in += 1
        self._recent[input_index] = batch
        if self._trial is not None:
            self._emit(self._call(self._trial.process, batch, input_index))
            if self._trial.verdict is not None:
                self._end_trial()
            return
        self._emit(self._call(self.logic.process, batch, input_index))  # type: ignore[union-attr]

    # -- upgrades: new code at a cut, a canary trial ------------------------------------

    def recent_input(self, rows: int = RECENT_ROWS) -> list[tuple[pa.RecordBatch, int]]:
        """A sample of the recent input: the last batch of each input, up to ``rows`` rows each."""
        return [(batch.slice(0, rows), index) for index, batch in sorted(self._recent.items())]

    def upgrade_code(self, change: CodeChange, migrate: Any = None) -> None:
        """Run ``change`` from the next batch on (at an upgrade's cut), ``migrate`` applied to the state first."""
        self._call(self.logic.replace_code, change.fn, change.on_timer, change.schema)  # type: ignore[union-attr]
        if migrate is not None:
            self._call(migrate_values, self.logic.state, migrate)  # type: ignore[union-attr]
        self.code = change

    def start_trial(self, trial: Any) -> None:
        """Run new code on trial here (a canary): its output is held, event time waits, until it ends."""
        self._trial = self._call(trial)
        self.pause_event_time()

    def _settle_trial(self, why: str) -> None:
        """Something must see this instance's state or output now: end a trial under way first."""
        if self._trial is not None:
            self._emit(self._call(self._trial.settle, why))
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

    def pause_event_time(self) -> None:
        """Keep incoming watermarks from the operator (the newest is applied on resume)."""
        self._held.pause_event_time()

    def resume_event_time(self) -> None:
        self._held.resume_event_time()
        self._advance(self._held.take_deferred())

    # -- topology changes (rescale) -----------------------------------------------------

    def prepare_change(self, op_id: str, change: "InstanceChange") -> None:
        """Apply ``change`` when op ``op_id`` passes; its new inputs may receive deliveries now."""
        self.pending_changes[op_id] = change
        for ch in change.inputs:
            self._index_of[ch.channel] = len(self.inputs)
            self.inputs.append(ch)
        if change.inputs:
            self.watermarks.add_inputs(len(self.inputs))
        self.control.join(op_id, [ch.channel for ch in change.inputs])

    # -- control ------------------------------------------------------------------

    def _on_control(self, message: ControlMessage, source: Any) -> None:
        if self._trial is not None and not getattr(message.op, "observes_only", False):
            self._settle_trial(f"control op {message.kind} reached the canary")
        self._complete_ops(self._call(self.control.arrive, message, source, self.ctx))

    def _complete_ops(self, completions: list[Completion]) -> None:
        for c in completions:
            change = self.pending_changes.pop(c.message.op_id, None)
            if change is None:
                self._forward(c)
            else:
                self._apply_change(change, c)
        for source, blocked in self.control.take_block_changes():
            i = self._index_of.get(source) if isinstance(source, int) else None
            if i is not None:
                self.inputs[i].blocked = blocked
                self.refresh_input(source)  # type: ignore[arg-type]
        if completions and (self.exhausted or (self.inputs and all(ch.ended for ch in self.inputs))):
            self._maybe_finish()  # its input had ended; it waited for these ops

    def _apply_change(self, change: "InstanceChange", c: Completion) -> None:
        """The op that activates ``change`` completed here: forward it on the old and the new output
        channels (on a new one it is the first message, after the watermark sent on the others), then
        close the channels the change removes and take the change's outputs, targets and routers."""
        self.outputs, self.targets = change.during(self.outputs, self.targets)
        if self._sent_mark is not None:
            for ch in change.added:
                ch.enqueue(self._sent_mark)
        self._forward(c)
        for ch in change.removed:
            ch.enqueue(End())
            self._closed.append(ch)  # no longer this instance's, but the host still flushes it
        self.outputs, self.targets = change.after()
        self.routers = change.routers(self.routers, self.info)
        self.ctx.set_downstream([t for ts in self.targets for t in ts])

    def _forward(self, c: Completion) -> None:
        """Send a completed op on: every output channel, its extra edges, or back to the controller.

        On a channel with nothing waiting for credit it goes at once, as a ``control_out`` entry
        that the host gathers into runs; behind waiting data it is queued (targets with the same
        payload share one immutable message).
        """
        message = c.message
        hops: dict[int, ControlMessage] = {}
        for chans, targets in zip(self.outputs, self.targets):
            for ch, target in zip(chans, targets):
                payload = c.payload_for(target)
                if not ch.pending:
                    self._control_out.append(ControlSend(ch.channel, ch.sequence_nowait(), message, payload))
                    continue
                hop = hops.get(id(payload))
                if hop is None:
                    hop = hops[id(payload)] = message.hop(self.name, payload)
                ch.enqueue(hop)
        for src, dst in message.extra_edges:
            if tuple(src) == self.name:
                target = instance_id(dst)
                self._extra.append((target, message.hop(self.name, c.payload_for(target))))
                self.extra_ops_sent.add(message.op_id)
        if not self.outputs:
            payload = {self.name: c.payload_for(CONTROLLER)}
            self._returns.append(ControlReturn(message.op_id, (self.name,), payload, message.origin, message.op))

    def senders_ended(self, ended: Sequence[tuple[InstanceId, frozenset]]) -> StepResult:
        """Instances finished: each sends nothing along extra edges but the ops it lists."""
        for name, sent in ended:
            if not self.finished:
                self._complete_ops(self._call(self.control.input_ended, extra_input(name), self.ctx, sent))
        return self._result((), True)

    def queue_ack(self, op_id: str, origin: str, payload: Any, background: bool) -> None:
        """Acknowledge op ``op_id`` to controller ``origin`` (it leaves with this step's result)."""
        self._acks.append(Ack(origin, op_id, self.name, payload, background))


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
            self._emit(self._call(self.logic.on_watermark, mark.timestamp))  # type: ignore[union-attr]
        self._send_mark(mark)

    def _send_mark(self, mark: Watermark) -> None:
        self._sent_mark = mark
        for ch in self.output_channels():
            ch.enqueue(mark)

    def _maybe_finish(self) -> None:
        """Finish, unless an op that is under way here still needs this instance.

        Its input has ended (every channel's ``End``; a source: its last batch).
        A topology change prepared here waits for its op (a source that ended
        first would leave its new channels without an ``End``); an op waiting
        for bin state on an extra edge, or records held for that state, would
        be lost by finishing now (the ``End`` of the data channels may overtake
        the old owner's message). The op's arrival finishes it then.
        """
        if self.finished or self.pending_changes or self._held or self.control.pending_ops:
            return
        self._finish()

    def _finish(self) -> None:
        self._settle_trial("its input ended")
        self._emit(self._call(self.logic.finish))  # type: ignore[union-attr]
        self._close_outputs()

    def _close_outputs(self) -> None:
        for ch in self.output_channels():
            ch.enqueue(End())
        self.finished = True
        self._finished_now = True

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # the user's code: report it, with its operator
            raise OperatorFailure(self.info, exc) from exc

    def _emit(self, batches: Sequence[pa.RecordBatch | SideOutput]) -> None:
        for batch in batches:
            port = None
            if isinstance(batch, SideOutput):  # only the edges taken from that side output carry it
                port, batch = batch.port, batch.batch
            if batch.num_rows == 0:
                continue
            self.records_out += batch.num_rows
            for edge, router in enumerate(self.routers):
                if router.port != port:
                    continue
                try:
                    routed = router.route(batch)
                except Exception as exc:
                    raise OperatorFailure(self.info, exc) from exc
                for target, part in routed:
                    self.outputs[edge][target].enqueue(Data(part))
                    self.batches_out += 1

    # -- results and statistics ---------------------------------------------------

    def sink_result(self) -> Any:
        return self.logic.result if isinstance(self.logic, SinkLogic) else None

    @property
    def drained(self) -> bool:
        """Finished and every output message has left."""
        return self.finished and not self.outputs_blocked()

    def close(self) -> None:
        self.logic.close()

    def backpressured_until(self, now: float) -> float:
        """Seconds its outputs held messages waiting for credit, up to ``now``."""
        return self.backpressured_s + (now - self._bp_since if self._bp_since is not None else 0.0)

    def statistics(self) -> InstanceStatistics:
        return instance_statistics(self, time.monotonic())
