"""inputs.py: an operator instance's input side: its input channels in turn, its event-time clock, what it took.

:class:`InstanceInputs` owns the instance's input channels and decides which
one it takes from next: the inputs with a message to take and not blocked
take turns. It keeps the instance's event-time clock (``watermarks.py``: the
minimum over its inputs), the records taken per channel (an upgrade's cut)
and a slice of the last batch of each input (an upgrade's checks). It is a
sequence of its channels. Only the owning instance (on its host's loop)
touches it.
"""

from __future__ import annotations

import collections
from typing import Iterator, Sequence

import pyarrow as pa

from chiray.control.message import ControlMessage, InstanceId
from chiray.operators.logic import InstanceInfo

from .channel import InputChannel
from .messages import ControlRun, Envelope, Watermark
from .watermarks import InputWatermarks

__all__ = ["InstanceInputs"]


class InstanceInputs(Sequence[InputChannel]):
    """The input channels of one instance, in the order it took them on (rescales append)."""

    def __init__(self, info: InstanceInfo, channels: Sequence[InputChannel]):
        self._info = info
        self._channels = list(channels)
        self._index_of = {ch.channel: i for i, ch in enumerate(self._channels)}
        # Inputs with a message to take and not blocked, in turn. Ordered (not a dict): taking from
        # the front of a dict again and again leaves holes that each look-up of its first key walks.
        self._ready: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.watermarks = InputWatermarks(len(self._channels))
        self.records_by_channel: dict[int, int] = {}  # records taken per input channel (an upgrade's cut)
        self._recent: dict[int, pa.RecordBatch] = {}  # input index -> a slice of its last batch (upgrade checks)

    def __len__(self) -> int:
        return len(self._channels)

    def __iter__(self) -> Iterator[InputChannel]:
        return iter(self._channels)

    def __getitem__(self, i: int) -> InputChannel:  # type: ignore[override]
        return self._channels[i]

    def ids(self) -> list[int]:
        return [ch.channel for ch in self._channels]

    def has_ready(self) -> bool:
        """A message to take on some input (not blocked)."""
        return bool(self._ready)

    def refresh(self, channel: int) -> bool:
        """Channel ``channel``'s queue or blocked flag changed: update the inputs to take from.
        False if it is no input of this instance."""
        i = self._index_of.get(channel)
        if i is None:
            return False
        if self._channels[i].ready():
            self._ready.setdefault(i, None)
        else:
            self._ready.pop(i, None)
        return True

    def take(self) -> tuple[Envelope, InputChannel]:
        """The next message of the next input in turn, and that input."""
        if not self._ready:
            raise AssertionError(f"bug in scheduler: {self._info} stepped without input")
        i = self._ready.popitem(last=False)[0]  # back of the line if it has more: inputs take turns
        ich = self._channels[i]
        env = ich.take()
        if ich.ready():
            self._ready[i] = None
        return env, ich

    def control_next(self) -> bool:
        """The next input in turn has a control message at its head."""
        if not self._ready:
            return False
        return isinstance(self._channels[next(iter(self._ready))].queue[0].message, ControlMessage)

    def take_run(self, run: ControlRun) -> tuple[list[int], list[InstanceId]]:
        """Take ``run``'s message on each of its channels where it is next in line (nothing queued before
        it, not blocked); queue it on the others, to be taken in turn. Returns the channels it was taken
        on and their senders."""
        message = run.message
        arrived: list[int] = []
        senders: list[InstanceId] = []
        for channel, seq, sender in zip(run.channels, run.seqs, run.senders):
            i = self._index_of.get(channel)
            if i is None:
                raise RuntimeError(f"bug: {self._info} has no input channel {channel} for control message "
                                   f"{message.op_id}; inputs {self.ids()}")
            ich = self._channels[i]
            if ich.take_in_place(seq):
                arrived.append(channel)
                senders.append(sender)
                if ich.queue:  # what waited behind it in the reorder buffer
                    self.refresh(channel)
            else:
                copy = message if message.sender == sender else message.hop(sender, message.payload)
                if ich.offer(Envelope(channel, seq, copy)):
                    self.refresh(channel)
        return arrived, senders

    def set_blocked(self, channel: int, blocked: bool) -> None:
        """Control alignment holds channel ``channel`` back (or lets it go); not an input here: nothing."""
        i = self._index_of.get(channel)
        if i is not None:
            self._channels[i].blocked = blocked
            self.refresh(channel)

    def add(self, channels: Sequence[InputChannel]) -> None:
        """Input channels new with a topology change (they may receive deliveries now)."""
        for ch in channels:
            self._index_of[ch.channel] = len(self._channels)
            self._channels.append(ch)
        if channels:
            self.watermarks.add_inputs(len(self._channels))

    def took_data(self, ich: InputChannel, batch: pa.RecordBatch) -> None:
        """Count ``batch``, taken on ``ich`` (an upgrade's cut)."""
        self.records_by_channel[ich.channel] = self.records_by_channel.get(ich.channel, 0) + batch.num_rows

    def remember(self, batch: pa.RecordBatch, input_index: int) -> None:
        """``batch`` is the last one processed of input ``input_index`` (a sample for an upgrade's checks)."""
        self._recent[input_index] = batch

    def recent(self, rows: int) -> list[tuple[pa.RecordBatch, int]]:
        """The last batch of each input, up to ``rows`` rows each, with its input index."""
        return [(batch.slice(0, rows), index) for index, batch in sorted(self._recent.items())]

    def on_watermark(self, ich: InputChannel, mark: Watermark) -> Watermark | None:
        """``mark`` arrived on ``ich``: the instance's new watermark, if it moved."""
        return self.watermarks.on_watermark(self._index_of[ich.channel], mark)

    def end(self, ich: InputChannel) -> None:
        """``ich``'s ``End`` was taken."""
        ich.ended = True

    def all_ended(self) -> bool:
        return all(ch.ended for ch in self._channels)

    def on_end(self, ich: InputChannel) -> Watermark | None:
        """``ich`` ended (and not every input has): the instance's new watermark, if it moved."""
        return self.watermarks.on_end(self._index_of[ich.channel])
