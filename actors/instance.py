"""instance.py: one operator instance: its input and output channels, its dispatcher and its statistics.

The dispatcher is the one place that branches on a message's type: ``Data``
goes to the operator logic, a ``Watermark`` advances the instance's event-time
clock (``watermarks.py``: the minimum over its inputs), which the logic sees
through ``on_watermark`` before the new watermark is sent on every output,
``End`` closes an input, a ``ControlMessage`` goes
to the instance's control processor, whose completed ops are forwarded on
every output channel (behind the data already queued there), along the op's
extra edges, or back to the controller from a sink. An instance is
*runnable* when none of its output channels holds messages waiting for
credit and it has input it may take: a message on an unblocked input
channel, an injected control message (sources), an extra-edge control
message, a control run (one op arriving on many of its channels at once,
counted in one step), or (a source) its next batch is due.

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
from chiray.operators.logic import InstanceInfo, OperatorLogic, SideOutput

from .channel import InputChannel, OutputChannel
from .held import HeldRecords
from .statistics import InstanceStatistics
from .context import InstanceControlContext
from .messages import ControlRun, Data, End, Envelope, Grant, Watermark
from .router import Router
from .watermarks import MIN_WATERMARK, InputWatermarks

if TYPE_CHECKING:
    from .topology import InstanceChange

CONTROL_INBOX = -1
"""The channel id of a source's control inbox (ordered by global injection sequence)."""

CONTROL_RUN = 256
"""At most this many control messages at the heads of its inputs an instance takes in one step."""

__all__ = ["OperatorInstance", "OperatorFailure"]


class OperatorFailure(Exception):
    """Raised by :meth:`OperatorInstance.step` when the operator's code raised."""

    def __init__(self, info: InstanceInfo, cause: BaseException):
        super().__init__(f"{info}: {type(cause).__name__}: {cause}")
        self.info = info
        self.cause = cause


class OperatorInstance:
    """An operator instance and its channels.

    Args:
        info: its identity.
        logic: an ``OperatorLogic`` or, for sources, a ``SourceLogic``.
        inputs: its input channels.
        outputs: per output edge, the channels by target position.
        routers: per output edge, its router.
        targets: per output edge, the receiving instance of each channel.
        kind: "source", "transform", "keyed" or "sink".
    """

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
        self.is_source = isinstance(logic, SourceLogic)
        self.finished = False
        self.exhausted = False  # a source read its last batch (it finishes once no change is pending)
        self._index_of = {ch.channel: i for i, ch in enumerate(self.inputs)}
        # Inputs with a message to take and not blocked, in turn. Ordered (not a dict): taking from
        # the front of a dict again and again leaves holes that each look-up of its first key walks.
        self._ready_inputs: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.watermarks = InputWatermarks(len(self.inputs))
        self.control = ControlProcessor(self.name, [ch.channel for ch in self.inputs], self.is_source)
        self.inbox = InputChannel(CONTROL_INBOX, -1) if self.is_source else None
        self.extra_inbox: collections.deque[ControlMessage] = collections.deque()
        self.control_runs: collections.deque[ControlRun] = collections.deque()  # taken before the inputs
        self.extra_sends: list[tuple[InstanceId, ControlMessage]] = []
        # Control messages sent on output channels (channel, seq, message as received, payload): the host
        # sends them as runs, this instance the sender.
        self.control_out: list[tuple[int, int, ControlMessage, Any]] = []
        self.returns: list[ControlReturn] = []
        self.acks: list[tuple[str, str, Any, bool]] = []  # (op id, origin, payload or work, background)
        downstream = [t for ts in self.targets for t in ts]
        self.ctx = InstanceControlContext(self, kind, downstream)
        self._bp_since: float | None = None
        self.backpressured_s = 0.0
        self.busy_s = 0.0
        self.records_in = self.records_out = self.batches_in = self.batches_out = 0
        self.pending_changes: dict[str, "InstanceChange"] = {}
        self.closed_outputs: list[OutputChannel] = []
        self.extra_ops_sent: set[str] = set()  # ops sent along extra edges (told with the end notice)  # closed by a rescale, to flush once more  # op id -> topology change it activates
        self.replicas: dict[tuple[str, int], tuple[int, bytes]] = {}  # (operator, bin) -> (version, state)
        self._held = HeldRecords(info.num_bins)  # records of bins whose state is on its way (migration)
        self._deferred_mark: Watermark | None = None  # event time held back while they wait
        self._sent_mark: Watermark | None = None  # the last watermark sent on the outputs
        self._event_time_paused = 0  # > 0 while bins are leaving (a non-blocking migration step)
        self.took_control = False  # the last step took a control message (no data, no operator code)
        self._call(self.logic.open, info)

    # -- scheduling ---------------------------------------------------------------

    def output_channels(self) -> list[OutputChannel]:
        return [ch for chs in self.outputs for ch in chs]

    def _outputs_blocked(self) -> bool:
        for chs in self.outputs:  # a plain loop: asked several times a step
            for ch in chs:
                if ch.pending:
                    return True
        return False

    def has_work(self, now: float) -> bool:
        if self.finished:
            return False
        if self.extra_inbox or self.control_runs:
            return True
        if self.is_source:
            return self.inbox.ready() or self._source_due(now)  # type: ignore[union-attr]
        return bool(self._ready_inputs)

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

    def _source_due(self, now: float) -> bool:
        if self.exhausted:
            return False  # it waits for the op of a pending change (its inbox wakes it)
        ready = self.logic.ready_at()  # type: ignore[union-attr]
        return ready is None or ready <= now

    def control_ready(self) -> bool:
        """A source with a control message to take next (injected, or along an extra edge)."""
        return not self.finished and (bool(self.extra_inbox) or self.inbox.ready())  # type: ignore[union-attr]

    def runnable(self, now: float) -> bool:
        """Work to do and credit on every output."""
        return self.has_work(now) and not self._outputs_blocked()

    def note_outputs(self, now: float) -> bool:
        """Account back-pressured time: called whenever output channels may have changed state.

        Returns True when the outputs were held back for credit until now and are free again.
        """
        blocked = self._outputs_blocked()
        if blocked and self._bp_since is None:
            self._bp_since = now
        elif not blocked and self._bp_since is not None:
            self.backpressured_s += now - self._bp_since
            self._bp_since = None
            return True
        return False

    def wake_time(self) -> float | None:
        """For a paced source: when its next batch is due."""
        if self.is_source and not self.finished:
            return self.logic.ready_at()  # type: ignore[union-attr]
        return None

    # -- one step -----------------------------------------------------------------

    def step(self) -> list[Grant]:
        """Process one message (a source: read one batch); return the credit to give back.

        Raises:
            OperatorFailure: the operator's code raised.
        """
        started = time.perf_counter()
        self.took_control = True
        try:
            if self.extra_inbox:
                message = self.extra_inbox.popleft()
                self._on_control(message, extra_input(message.sender))  # type: ignore[arg-type]
                return []
            if self.control_runs:
                self._take_run(self.control_runs.popleft())
                return []
            if self.is_source:
                if self.inbox.ready():  # type: ignore[union-attr]
                    self._on_control(self.inbox.take().message, CONTROLLER)  # type: ignore[union-attr]
                else:
                    self.took_control = False
                    self._step_source()
                return []
            env = self._take_input()
            grant = self.inputs[self._current].grant_for(env)
            self._dispatch(env, self.inputs[self._current])
            self.took_control = isinstance(env.message, ControlMessage)
            if self.took_control:
                self._take_control_heads()
            return [grant] if grant is not None else []
        finally:
            self.busy_s += time.perf_counter() - started

    def _take_control_heads(self) -> None:
        """Go on taking control messages while the next input in turn has one at its head.

        The same as that many steps of this instance, without a trip through the host's loop
        each (an instance with thousands of inputs aligns an op in one or a few steps). Stops
        at a data message, an empty turn, blocked outputs (an op completed and went out) or
        ``CONTROL_RUN`` messages.
        """
        for _ in range(CONTROL_RUN):
            if not self._ready_inputs or self._outputs_blocked():
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
        self._emit(self._call(self.logic.process, batch, input_index))  # type: ignore[union-attr]

    # -- migration: holding the records of bins whose state is on its way -----------

    def hold_bins(self, bins: Sequence[int], key: str | Sequence[str]) -> None:
        """Buffer records of ``bins`` (in arrival order) until :meth:`release_bins`."""
        self._held.hold(bins, key)

    def release_bins(self, bins: Sequence[int]) -> None:
        """The state of ``bins`` is installed: process their buffered records, in arrival order."""
        for batch, input_index in self._held.release(bins):
            self._process(batch, input_index)
        self._apply_deferred_mark()

    def pause_event_time(self) -> None:
        """Keep incoming watermarks from the operator (the newest is applied on resume)."""
        self._event_time_paused += 1

    def resume_event_time(self) -> None:
        self._event_time_paused = max(0, self._event_time_paused - 1)
        self._apply_deferred_mark()

    def _apply_deferred_mark(self) -> None:
        if not self._held.active and not self._event_time_paused and self._deferred_mark is not None:
            mark, self._deferred_mark = self._deferred_mark, None
            self._advance(mark)

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
        self._complete_ops(self._call(self.control.arrive, message, source, self.ctx))

    def _complete_ops(self, completions: list[Completion]) -> None:
        for c in completions:
            change = self.pending_changes.pop(c.message.op_id, None)
            if change is None:
                self._forward(c)
                continue
            before = {ch.channel for chans in self.outputs for ch in chans}
            change.open_outputs(self)
            self._announce_watermark([ch for chans in self.outputs for ch in chans if ch.channel not in before])
            self._forward(c)
            change.close_outputs(self)
        for source, blocked in self.control.take_block_changes():
            i = self._index_of.get(source) if isinstance(source, int) else None
            if i is not None:
                self.inputs[i].blocked = blocked
                self.refresh_input(source)  # type: ignore[arg-type]
        if completions and (self.exhausted or (self.inputs and all(ch.ended for ch in self.inputs))):
            self._maybe_finish()  # its input had ended; it waited for these ops

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
                    self.control_out.append((ch.channel, ch.sequence_nowait(), message, payload))
                    continue
                hop = hops.get(id(payload))
                if hop is None:
                    hop = hops[id(payload)] = message.hop(self.name, payload)
                ch.enqueue(hop)
        for src, dst in message.extra_edges:
            if tuple(src) == self.name:
                target = instance_id(dst)
                self.extra_sends.append((target, message.hop(self.name, c.payload_for(target))))
                self.extra_ops_sent.add(message.op_id)
        if not self.outputs:
            payload = {self.name: c.payload_for(CONTROLLER)}
            self.returns.append(ControlReturn(message.op_id, (self.name,), payload, message.origin, message.op))

    def sender_ended(self, name: InstanceId, sent: frozenset = frozenset()) -> None:
        """Instance ``name`` finished: it sends nothing along extra edges but the ops in ``sent``."""
        if not self.finished:
            self._complete_ops(self._call(self.control.input_ended, extra_input(name), self.ctx, sent))

    def inject(self, message: ControlMessage) -> None:
        """A control message from the controller (sources only), placed by its global sequence."""
        assert self.inbox is not None, f"bug: control message injected at non-source {self.info}"
        self.inbox.offer(Envelope(CONTROL_INBOX, message.seq, message))

    def take_control_output(self) -> tuple[list[tuple[InstanceId, ControlMessage]], list[ControlReturn]]:
        """Extra-edge messages and controller returns produced since the last call."""
        sends, self.extra_sends = self.extra_sends, []
        returns, self.returns = self.returns, []
        return sends, returns

    def _step_source(self) -> None:
        batch = self._call(self.logic.poll)  # type: ignore[union-attr]
        if batch is None:
            self.exhausted = True
            self._maybe_finish()
            return
        self.records_in += batch.num_rows
        self.batches_in += 1
        self._emit([batch])
        self._advance(self.watermarks.output.offer(*self._call(self.logic.watermark)))  # type: ignore[union-attr]

    def _announce_watermark(self, channels: list[Any]) -> None:
        """New output channels (a rescale) start from the watermark already sent on the others."""
        if channels and self._sent_mark is not None:
            for ch in channels:
                ch.enqueue(self._sent_mark)

    def _advance(self, mark: Watermark | None) -> None:
        """Event time moved: let the operator react (fire windows, timers), then send ``mark`` on.

        While the state of some bins is on its way here (a migration step), event time waits: their
        held records and their windows must meet the watermark they were sent under, so the newest
        mark is kept and applied once the bins are installed and their records processed.
        """
        if mark is None:
            return
        if (self._held.active or self._event_time_paused) and not self.is_source:
            self._deferred_mark = mark
            return
        if not mark.idle and not self.is_source:
            self._emit(self._call(self.logic.on_watermark, mark.timestamp))  # type: ignore[union-attr]
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
        if not self.is_source:
            self._emit(self._call(self.logic.finish))  # type: ignore[union-attr]
        for ch in self.output_channels():
            ch.enqueue(End())
        self.finished = True

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
        return self.finished and not self._outputs_blocked()

    def close(self) -> None:
        self.logic.close()

    def statistics(self) -> InstanceStatistics:
        queued = [ch.buffered() for ch in self.inputs]
        return InstanceStatistics(
            self.info.operator, self.info.index, self.host,
            self.records_in, self.records_out, self.batches_in, self.batches_out,
            sum(q[0] for q in queued), sum(q[1] for q in queued),
            sum(len(ch.pending) for ch in self.output_channels()),
            self.backpressured_s + (time.monotonic() - self._bp_since if self._bp_since else 0.0),
            self.busy_s,
            self.finished,
            tuple(ch.statistics() for ch in self.output_channels()),
            self.control.completed,
            None if self.watermarks.output.timestamp == MIN_WATERMARK else self.watermarks.output.timestamp,
            int(getattr(self.logic, "late_records", 0)),
            self.logic.backlog() if isinstance(self.logic, SourceLogic) and not self.finished else 0,
        )
