"""processor.py: the control processor of one instance: it drives every op's state machine and handlers there.

The dispatcher hands it each control message with the input it arrived on.
The processor creates the op's :class:`~control.op.InstanceHandler` on first
arrival, calls ``on_begin`` / ``on_next``, advances the op's alignment
(blocking) or tracking (non-blocking) state, and when the op has arrived on
every expected input runs ``on_complete`` and ``on_dispose`` and hands back a
:class:`Completion`: the message and what to attach for each downstream
instance. Completions are released in global injection order, so every
channel sees control messages in one order.

Expected inputs of an op at an instance: its data input channels that have
not ended, the controller (for a source), and the senders of the op's extra
edges that point at it. A channel added by a rescale *joins* with the op that
activates it (:meth:`ControlProcessor.join`): that op and every later one (by
global sequence) expect it, earlier ones do not (its sender never sees them),
even where an earlier op first arrives here after the activating one did (it
can come over the new channel before an earlier op comes over an old one).
Only the owning instance touches a processor.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Hashable, Iterable, Sequence

from .alignment import AlignmentState, WaitingForFirst
from .message import CONTROLLER, ControlMessage, InstanceId, instance_id
from .op import handles_nothing
from .tracker import Tracking

__all__ = ["ControlProcessor", "Completion", "extra_input"]


def extra_input(sender: InstanceId) -> tuple[str, InstanceId]:
    """The input name of an extra (control-only) edge from ``sender``."""
    return ("extra", sender)


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """An op completed at an instance.

    Attributes:
        message: the op's message as it first arrived (header, op, configs).
        attachments: target (downstream instance, or ``CONTROLLER``) -> payload.
        default: payload for targets without their own attachment.
    """

    message: ControlMessage
    attachments: dict[Any, Any]
    default: Any = None

    def payload_for(self, target: Any) -> Any:
        return self.attachments.get(target, self.default)


class _Attaching:
    """The runtime's context, plus the attach and ack calls of one ``on_complete``."""

    def __init__(self, ctx: Any, message: ControlMessage):
        self._ctx = ctx
        self._message = message
        self.attachments: dict[Any, Any] = {}
        self.default: Any = None

    def ack(self, payload: Any) -> None:
        """Acknowledge the op to its controller directly (outside the dataflow)."""
        self._ctx.queue_ack(self._message, payload, background=False)

    def ack_in_background(self, work: Any) -> None:
        """Run ``work()`` off the processing path; acknowledge with its result (or its exception)."""
        self._ctx.queue_ack(self._message, work, background=True)

    def attach(self, target: Any, payload: Any) -> None:
        self.attachments[target] = payload

    def attach_all(self, payload: Any) -> None:
        self.default = payload

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


@dataclasses.dataclass(slots=True)
class _Pending:
    message: ControlMessage
    handler: Any  # None: the op handles nothing here (``handles_nothing``)
    state: AlignmentState
    holds: bool  # a blocking op that holds this instance's inputs
    apart: bool = False  # a blocking op that keeps apart what comes after it (``keeps_input_apart``)


class ControlProcessor:
    """Drives the control ops at one instance.

    Args:
        instance: the instance's name.
        inputs: its data input channel ids.
        is_source: whether the controller injects into it.
    """

    def __init__(self, instance: InstanceId, inputs: Iterable[Hashable], is_source: bool):
        self.instance = instance
        self.inputs = list(inputs)
        self.is_source = is_source
        self.ended: set[Hashable] = set()
        self._pending: dict[str, _Pending] = {}
        self.completed = 0
        # Instances that finished (shared by the host) -> the ops they sent along extra edges before.
        self.ended_senders: dict[InstanceId, frozenset] = {}
        self._blocking: dict[Hashable, int] = {}  # input -> pending blocking ops that hold it
        self._apart: dict[Hashable, int] = {}  # input -> pending ops that keep apart what it brings now
        self._changes: list[tuple[Hashable, bool]] = []
        self._joins: dict[str, list[Hashable]] = {}
        self._joined: dict[Hashable, int] = {}  # joined input -> seq of the op that activated it

    def join(self, op_id: str, channels: Iterable[Hashable]) -> None:
        """New input ``channels`` take part in op ``op_id`` (activated by it) and every later op."""
        self._joins.setdefault(op_id, []).extend(channels)

    def _may_send(self, sender: InstanceId, op_id: str) -> bool:
        """Whether extra-edge sender ``sender`` has sent or will send op ``op_id``."""
        sent = self.ended_senders.get(sender)
        return sent is None or op_id in sent

    def expected(self, message: ControlMessage) -> frozenset:
        """The inputs ``message`` must arrive on at this instance."""
        exp: set[Hashable] = {ch for ch in self.inputs if ch not in self.ended} if self.ended else set(self.inputs)
        if self._joined:  # inputs that an op after this one activated never carry it
            exp.difference_update(ch for ch, seq in self._joined.items() if seq > message.seq)
        if self.is_source:
            exp.add(CONTROLLER)
        if message.extra_edges:
            exp.update(extra_input(src) for src, dst in message.extra_edges
                       if tuple(dst) == self.instance and self._may_send(instance_id(src), message.op_id))
        return frozenset(exp)

    def arrive(self, message: ControlMessage, source: Hashable, ctx: Any) -> list[Completion]:
        """``message`` arrived on input ``source``; return the ops that completed, in order."""
        pending = self._pending.get(message.op_id)
        if pending is None:
            joined = self._joins.pop(message.op_id, ())
            self.inputs.extend(joined)
            self._joined.update(dict.fromkeys(joined, message.seq))
            op = message.op
            handler = None if handles_nothing(op.Instance) else op.Instance(op, message.configs.get(self.instance))
            expected = self.expected(message)
            if not self._pending and len(expected) == 1 and source in expected:
                # Its only input, and no earlier op waits here: it completes now (nothing to block).
                if handler is not None:
                    handler.on_begin(ctx)
                    handler.on_next(ctx, message.payload, message.sender)
                return [self._complete(message, handler, ctx)]
            if handler is not None:
                handler.on_begin(ctx)  # it may decide there whether it holds the inputs
            holds = message.blocking and (handler.holds_inputs if handler is not None else op.Instance.holds_inputs)
            apart = message.blocking and not holds and handler is not None and handler.keeps_input_apart
            kind = WaitingForFirst if holds else Tracking
            pending = _Pending(message, handler, kind(expected), holds, apart)
            self._pending[message.op_id] = pending
        if pending.handler is not None:
            pending.handler.on_next(ctx, message.payload, message.sender)
        if source not in pending.state.expected and (
                source in self.ended or (isinstance(message.sender, tuple)
                                         and not self._may_send(message.sender, message.op_id))):
            return self._release(ctx)  # its sender ended meanwhile; the notice overtook this message
        pending.state = pending.state.arrive(source)
        if pending.holds:
            self._hold(source)
        elif pending.apart:
            self._apart[source] = self._apart.get(source, 0) + 1
        if not pending.state.complete:
            return []  # nothing else changed: no op can be released
        return self._release(ctx)

    def arrive_many(self, message: ControlMessage, sources: Sequence[Hashable], senders: Sequence[Any],
                    ctx: Any) -> list[Completion]:
        """``message`` arrived on each of ``sources`` in turn, sent on ``sources[i]`` by ``senders[i]``
        (the copies differ only in their sender): the same as :meth:`arrive` on each, but counted in
        one step where the op handles nothing here (one set operation, however many inputs)."""
        copies = (message if message.sender == sender else message.hop(sender, message.payload)
                  for sender in senders)
        if not sources:
            return []
        done = self.arrive(next(copies), sources[0], ctx)
        pending = self._pending.get(message.op_id)
        rest = sources[1:]
        if not rest:
            return done
        if pending is None or pending.handler is not None:
            for source, copy in zip(rest, copies):
                done += self.arrive(copy, source, ctx)
            return done
        pending.state = pending.state.arrive_all(rest)
        if pending.holds:
            for source in rest:
                self._hold(source)
        elif pending.apart:
            for source in rest:
                self._apart[source] = self._apart.get(source, 0) + 1
        return (done + self._release(ctx)) if pending.state.complete else done

    def _hold(self, source: Hashable) -> None:
        count = self._blocking.get(source, 0)
        self._blocking[source] = count + 1
        if count == 0:
            self._changes.append((source, True))

    def _let_go(self, source: Hashable) -> None:
        count = self._blocking[source] - 1
        if count:
            self._blocking[source] = count
        else:
            del self._blocking[source]
            self._changes.append((source, False))

    def take_block_changes(self) -> list[tuple[Hashable, bool]]:
        """Inputs whose blocked state changed since the last call: (input, now blocked)."""
        changes, self._changes = self._changes, []
        return changes

    def input_ended(self, channel: Hashable, ctx: Any, sent: frozenset = frozenset()) -> list[Completion]:
        """Input ``channel`` ended (a data channel's ``End``, or an extra-edge sender that finished):
        ops still waiting on it stop expecting it, except the ops in ``sent``, which an extra-edge
        sender sent before it finished (the end notice may overtake them)."""
        if not (isinstance(channel, tuple) and channel and channel[0] == "extra"):
            self.ended.add(channel)
        for pending in self._pending.values():
            if pending.message.op_id not in sent:
                pending.state = pending.state.input_ended(channel)
        return self._release(ctx)

    def _release(self, ctx: Any) -> list[Completion]:
        done: list[Completion] = []
        while self._pending:
            first = min(self._pending.values(), key=lambda p: p.message.seq)
            if not first.state.complete:
                break
            del self._pending[first.message.op_id]
            if first.holds:
                for source in first.state.arrived:
                    self._let_go(source)
            elif first.apart:
                for source in first.state.arrived:
                    self._apart[source] -= 1
                    if not self._apart[source]:
                        del self._apart[source]
            done.append(self._complete(first.message, first.handler, ctx, first.apart))
        return done

    def _complete(self, message: ControlMessage, handler: Any, ctx: Any, apart: bool = False) -> Completion:
        """Run ``on_complete`` and ``on_dispose`` (none for an op that handles nothing here); then, for an op
        that kept input apart here, hand the operator what it kept."""
        self.completed += 1
        if self._joined:  # every earlier op has arrived here on the old inputs, before this one
            self._joined = {ch: seq for ch, seq in self._joined.items() if seq > message.seq}
        if handler is None:
            return Completion(message, {})
        attaching = _Attaching(ctx, message)
        returned = handler.on_complete(attaching)
        if returned is not None and attaching.default is None:
            attaching.default = returned
        handler.on_dispose(ctx)
        if apart:
            ctx.take_in_kept()
        return Completion(message, attaching.attachments, attaching.default)

    def blocked(self) -> frozenset:
        """Input channels held back by pending blocking ops.

        A blocking op keeps the inputs it arrived on blocked until its
        ``on_complete`` has run, even once aligned while it waits behind an
        earlier op (completions are released in global order).
        """
        return frozenset(self._blocking)

    def apart(self, source: Hashable) -> int:
        """How many pending ops keep apart what input ``source`` brings now (``keeps_input_apart``): 0 for
        none; ``k`` when it came after ``k`` of them, so it goes to the operator once the k-th oldest of
        those has completed."""
        return self._apart.get(source, 0) if self._apart else 0

    def kept_apart(self) -> frozenset:
        """The inputs whose data pending ops keep apart now."""
        return frozenset(self._apart)

    @property
    def pending_ops(self) -> list[str]:
        return [p.message.op_id for p in sorted(self._pending.values(), key=lambda p: p.message.seq)]
