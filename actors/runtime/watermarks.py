"""watermarks.py: the event-time clock of one instance: per-input watermarks and their minimum.

An instance's watermark is the minimum of the last watermark of each input
channel that has neither ended nor been marked idle. It never goes backwards:
an input that comes back from idleness behind the others holds the minimum
still but cannot lower it. When every open input is idle the instance is
idle too and says so downstream. Sources have no inputs; their clock is the
watermark their ``SourceLogic`` computes from the batches it read.

Only the owning instance touches these objects.
"""

from __future__ import annotations

from .messages import Watermark

__all__ = ["MIN_WATERMARK", "InputWatermarks", "OutputWatermark"]

MIN_WATERMARK = -(1 << 63)
"""The watermark before any has arrived (the smallest int64)."""


class OutputWatermark:
    """The watermark an instance has announced downstream: monotone, with its idle flag."""

    def __init__(self) -> None:
        self.timestamp = MIN_WATERMARK
        self.idle = False

    def offer(self, timestamp: int | None, idle: bool = False) -> Watermark | None:
        """A new candidate watermark (``None``: none yet); the message to send on, if anything changed."""
        if idle:
            if self.idle:
                return None
            self.idle = True
            return Watermark(self.timestamp, idle=True)
        advanced = timestamp is not None and timestamp > self.timestamp
        if not advanced and not self.idle:
            return None
        if advanced:
            self.timestamp = int(timestamp)  # type: ignore[arg-type]
        self.idle = False
        return Watermark(self.timestamp)


class InputWatermarks:
    """The last watermark of each input channel (by input position) and the instance's watermark.

    Example:
        >>> w = InputWatermarks(2)
        >>> w.on_watermark(0, Watermark(5)) is None, w.on_watermark(1, Watermark(3))
        (True, Watermark(timestamp=3, idle=False))
        >>> w.on_watermark(1, Watermark(9, idle=True))
        Watermark(timestamp=5, idle=False)
    """

    def __init__(self, num_inputs: int) -> None:
        self._marks = [MIN_WATERMARK] * num_inputs
        self._idle = [False] * num_inputs
        self._ended = [False] * num_inputs
        self.output = OutputWatermark()

    @property
    def current(self) -> int:
        """The instance's watermark (``MIN_WATERMARK`` before the first)."""
        return self.output.timestamp

    def add_inputs(self, num_inputs: int) -> None:
        """The instance now has ``num_inputs`` inputs (a rescale added channels at the end): track them.

        A new input holds the minimum until its first watermark (its sender
        sends its current watermark when it opens the channel): records may come
        on it with any time before that. The instance's watermark never goes
        backwards because of it; it waits.
        """
        extra = num_inputs - len(self._marks)
        if extra > 0:
            self._marks += [MIN_WATERMARK] * extra
            self._idle += [False] * extra
            self._ended += [False] * extra

    def on_watermark(self, input: int, mark: Watermark) -> Watermark | None:
        """Input ``input`` sent ``mark``; returns the instance's new watermark message, if any."""
        self.add_inputs(input + 1)
        self._idle[input] = mark.idle
        if not mark.idle:
            self._marks[input] = max(self._marks[input], mark.timestamp)
        return self._recompute()

    def on_end(self, input: int) -> Watermark | None:
        """Input ``input`` ended (its watermark is now infinite); returns the new message, if any."""
        self.add_inputs(input + 1)
        self._ended[input] = True
        if all(self._ended):
            return None  # the instance finishes: End follows, which closes event time too
        return self._recompute()

    def _recompute(self) -> Watermark | None:
        open_inputs = [i for i, ended in enumerate(self._ended) if not ended]
        active = [self._marks[i] for i in open_inputs if not self._idle[i]]
        if not active:
            return self.output.offer(None, idle=bool(open_inputs))
        return self.output.offer(min(active))
