"""channel.py: a bounded FIFO channel and its credit accounting, sender and receiver sides.

The sender (:class:`OutputChannel`) numbers messages and spends one batch
credit and the batch's bytes per ``Data`` message; the receiver
(:class:`InputChannel`) puts deliveries back in sequence (Ray does not order
calls to async actors), drops duplicates and returns credit as its instance
consumes. So a channel never holds more than its capacity of data, in flight
plus buffered, and a sender without credit holds its messages back.

Credit consumed from a sender on another host goes back through the
receiving host's :class:`CreditLedger`, at once to a sender on the same host:
a call that carried one credit alone was up to half of all calls between
hosts, so the ledger holds it back until half the channel's bound is owed,
until a parcel goes to the sender's host anyway, or until the oldest credit
owed is ``CREDIT_DELAY_S`` old. That cannot stall a sender: one without
credit has its whole bound outstanding, so once it is consumed half of it is
owed and goes at once (a batch larger than the byte credit left waits at most
the delay). The ledger reads no clock: every call gets ``now``.

Each side, and a host's ledger, is touched only by the host that owns it.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Collection

from chiray.operators.errors import ChirayError

from .messages import Data, Envelope, Grant, Message

__all__ = ["WouldBlock", "ChannelError", "OutputChannel", "InputChannel", "ChannelStatistics", "CreditLedger",
           "CREDIT_DELAY_S"]


class WouldBlock(ChirayError):
    """``sequence_nowait`` found older messages still waiting for credit."""


class ChannelError(ChirayError, RuntimeError):
    """A broken channel invariant (a gap that cannot close, a credit overflow)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """A snapshot of one channel as its sender sees it.

    Attributes:
        channel: the channel id.
        outstanding_batches: data messages sent and not yet consumed (in flight or buffered).
        outstanding_bytes: their bytes.
        pending: messages waiting at the sender for credit.
        capacity_batches / capacity_bytes: the bounds.
        sent_batches: data messages sent so far.
    """

    channel: int
    outstanding_batches: int
    outstanding_bytes: int
    pending: int
    capacity_batches: int
    capacity_bytes: int
    sent_batches: int


class OutputChannel:
    """Sender side: sequence numbers, credit, and messages waiting for credit.

    A ``Data`` message may be sent when one batch credit is left and its bytes
    fit in the byte credit, or when nothing is outstanding (so one batch
    larger than the byte bound still goes, alone). Other messages need no
    credit but never overtake data queued before them.
    """

    def __init__(self, channel: int, capacity_batches: int, capacity_bytes: int):
        if capacity_batches < 1 or capacity_bytes < 1:
            raise ValueError(
                f"channel {channel}: capacity must be >= 1 batch and >= 1 byte, "
                f"got {capacity_batches} batches, {capacity_bytes} bytes"
            )
        self.channel = channel
        self.capacity_batches = capacity_batches
        self.capacity_bytes = capacity_bytes
        self.credit_batches = capacity_batches
        self.credit_bytes = capacity_bytes
        self.pending: collections.deque[Message] = collections.deque()
        self.next_seq = 0
        self.sent_batches = 0

    def _can_send(self, message: Message) -> bool:
        if not isinstance(message, Data):
            return True
        if self.credit_batches < 1:
            return False
        nbytes = message.batch.nbytes
        return nbytes <= self.credit_bytes or self.credit_bytes == self.capacity_bytes

    def _wrap(self, message: Message) -> Envelope:
        charge = 0
        if isinstance(message, Data):
            charge = min(message.batch.nbytes, self.credit_bytes)
            self.credit_batches -= 1
            self.credit_bytes -= charge
            self.sent_batches += 1
        env = Envelope(self.channel, self.next_seq, message, charge)
        self.next_seq += 1
        return env

    def sequence_nowait(self) -> int:
        """The sequence number of a message that needs no credit (control) sent now, unwrapped: the
        caller carries it (a ``ControlRun`` entry).

        Raises:
            WouldBlock: older messages are still waiting (enqueue it behind them instead).
        """
        if self.pending:
            raise WouldBlock(f"channel {self.channel}: messages wait for credit")
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def enqueue(self, message: Message) -> None:
        """Queue ``message``; :meth:`drain` releases it when credit allows."""
        self.pending.append(message)

    def drain(self) -> list[Envelope]:
        """Envelopes for the queued messages that credit allows, in order."""
        out: list[Envelope] = []
        while self.pending and self._can_send(self.pending[0]):
            out.append(self._wrap(self.pending.popleft()))
        return out

    def grant(self, batches: int, nbytes: int) -> None:
        """Credit returned by the receiver."""
        self.credit_batches += batches
        self.credit_bytes += nbytes
        if self.credit_batches > self.capacity_batches or self.credit_bytes > self.capacity_bytes:
            raise ChannelError(
                f"bug in credit accounting: channel {self.channel} has credit "
                f"{self.credit_batches}/{self.capacity_batches} batches, "
                f"{self.credit_bytes}/{self.capacity_bytes} bytes"
            )

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(
            self.channel,
            self.capacity_batches - self.credit_batches,
            self.capacity_bytes - self.credit_bytes,
            len(self.pending),
            self.capacity_batches,
            self.capacity_bytes,
            self.sent_batches,
        )


class InputChannel:
    """Receiver side: a reorder buffer that releases messages strictly in sequence.

    Deliveries with a sequence number already seen are dropped (counted in
    ``duplicates``). ``blocked`` is set by control alignment to hold the
    channel's messages back. Lifecycle: ``OPEN -> ENDED`` once ``End`` is taken.
    """

    def __init__(self, channel: int, input_index: int, max_out_of_order: int = 1 << 16):
        self.channel = channel
        self.input_index = input_index
        self.max_out_of_order = max_out_of_order
        self.next_seq = 0
        self._reorder: dict[int, Envelope] = {}
        self.queue: collections.deque[Envelope] = collections.deque()
        self.blocked = False
        self.ended = False
        self.duplicates = 0

    def offer(self, env: Envelope) -> bool:
        """Accept a delivery; returns False for a duplicate.

        Raises:
            ChannelError: more than ``max_out_of_order`` messages wait for a gap to close.
        """
        if env.seq < self.next_seq or env.seq in self._reorder:
            self.duplicates += 1
            return False
        if env.seq != self.next_seq:
            if len(self._reorder) >= self.max_out_of_order:
                raise ChannelError(
                    f"channel {self.channel}: expected seq {self.next_seq}, received {env.seq} "
                    f"with {len(self._reorder)} messages already waiting for the gap"
                )
            self._reorder[env.seq] = env
            return True
        self.queue.append(env)
        self.next_seq += 1
        while self.next_seq in self._reorder:
            self.queue.append(self._reorder.pop(self.next_seq))
            self.next_seq += 1
        return True

    def take_in_place(self, seq: int) -> bool:
        """Take message ``seq`` as it arrives, without queueing it, if it is the one the receiver
        would take next: in sequence, nothing queued, not blocked. False: offer it as usual.

        For control messages counted where they arrive (``ControlRun``); what waited for it in the
        reorder buffer moves to the queue.
        """
        if seq != self.next_seq or self.queue or self.blocked:
            return False
        self.next_seq += 1
        while self.next_seq in self._reorder:
            self.queue.append(self._reorder.pop(self.next_seq))
            self.next_seq += 1
        return True

    def ready(self) -> bool:
        """A message can be taken now."""
        return bool(self.queue) and not self.blocked

    def take(self) -> Envelope:
        """The next message in sequence (call :meth:`ready` first)."""
        return self.queue.popleft()

    def buffered(self) -> tuple[int, int]:
        """(data messages, bytes) buffered here, in order or waiting for a gap."""
        batches = nbytes = 0
        for env in (*self.queue, *self._reorder.values()):
            if isinstance(env.message, Data):
                batches += 1
                nbytes += env.message.batch.nbytes
        return batches, nbytes

    def grant_for(self, env: Envelope) -> Grant | None:
        """The credit to return once ``env`` is consumed (None for non-data)."""
        if isinstance(env.message, Data):
            return Grant(self.channel, 1, env.charge)
        return None


CREDIT_DELAY_S = 0.05
"""Credit owed to a sender on another host waits at most this long."""


class CreditLedger:
    """Credit consumed on this host and not yet returned to senders on other hosts.

    Args:
        capacity_batches: a channel's bound in batches (its initial credit).
        capacity_bytes: a channel's bound in bytes.
        delay_s: the longest any credit is held.
    """

    def __init__(self, capacity_batches: int, capacity_bytes: int, delay_s: float = CREDIT_DELAY_S):
        self._capacity_batches = capacity_batches
        self._capacity_bytes = capacity_bytes
        self.delay_s = delay_s
        self._owed: dict[int, tuple[int, list[int]]] = {}  # channel -> (sender's host, [batches, bytes])
        self._since: float | None = None  # when the oldest credit owed was consumed

    def __bool__(self) -> bool:
        return bool(self._owed)

    @property
    def deadline(self) -> float | None:
        """When the credit owed must go at the latest (None: nothing is owed)."""
        return None if self._since is None else self._since + self.delay_s

    def owe(self, grant: Grant, host: int, now: float) -> Grant | None:
        """``grant`` was consumed from a sender on ``host``; returns the channel's credit if it goes now."""
        entry = self._owed.get(grant.channel)
        if entry is None:
            entry = self._owed[grant.channel] = (host, [0, 0])
            if self._since is None:
                self._since = now
        owed = entry[1]
        owed[0] += grant.batches
        owed[1] += grant.nbytes
        if 2 * owed[0] >= self._capacity_batches or 2 * owed[1] >= self._capacity_bytes:
            del self._owed[grant.channel]
            if not self._owed:
                self._since = None
            return Grant(grant.channel, owed[0], owed[1])
        return None

    def settle(self, now: float, going: Collection[int]) -> list[tuple[int, Grant]]:
        """The credit to send now, as (host, grant): all of it once the deadline passed, else the credit
        owed to the hosts in ``going`` (they get a parcel anyway)."""
        overdue = self._since is not None and now >= self._since + self.delay_s
        out = []
        for channel in list(self._owed):
            host, (batches, nbytes) = self._owed[channel]
            if overdue or host in going:
                del self._owed[channel]
                out.append((host, Grant(channel, batches, nbytes)))
        if not self._owed:
            self._since = None
        return out
