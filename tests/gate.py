"""gate.py: a source that runs at full speed to a point, then holds until the test opens its gate.

A test that must act while a job is mid-stream (rescale it, kill a host,
take a checkpoint) used to pace its input so that the job would still be
running when the test acted: seconds of waiting per job, and a race with a
slow machine. ``Gated`` instead lets each split emit ``hold_after`` records
at once, then ``trickle`` records a second (so that records are in flight
while the test acts) up to ``hold_at`` records, and then nothing until the
gate (a file the test creates) opens; from then on it reads unpaced to the
end. The test waits until the sources emitted ``hold_after`` records a
split, acts, opens the gate and waits for the job to finish: the job cannot
end before the test says so, and no test waits for a schedule.

The gate is a file, so it reaches every host of the job on this machine,
including those of a ``ray start`` cluster, without a call into the test.
Offsets and replays are the wrapped source's own. By default a split counts
the records it emitted since it was opened, so a reader reopened after a
recovery emits another ``hold_after`` records before it holds again; give
``position`` (the split's record position at an offset) where a job recovers
while the gate is still shut, and the hold stays at the same place in the data.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from typing import Any, Callable

import pyarrow as pa

from chiray.operators.logic import Source, SourceSplit, SplitReader

__all__ = ["Gated", "Gate", "gated"]

POLL_S = 0.01
"""How long a held reader tells its host to wait before asking again."""


class Gate:
    """The file that holds a ``Gated`` source: ``Gate(tmp_path)`` makes a closed one; ``open()`` opens it."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = str(pathlib.Path(directory) / "gate-open")
        if os.path.exists(self.path):
            raise ValueError(f"gate {self.path} is open already: use a new directory per gate")

    def open(self) -> None:
        pathlib.Path(self.path).touch()

    @property
    def is_open(self) -> bool:
        return os.path.exists(self.path)


class _GatedReader(SplitReader):
    def __init__(self, inner: SplitReader, source: "Gated") -> None:
        self._inner, self._source = inner, source
        self._emitted = 0
        self._trickled = 0  # records emitted past hold_after by this reader
        self._held_since: float | None = None  # when this reader reached hold_after
        self._open = False

    def _position(self) -> int:
        where = self._source.position
        return self._emitted if where is None else where(self._inner.offset())

    def ready_at(self) -> float | None:
        src = self._source
        if self._open:
            return None  # unpaced once open
        position = self._position()
        if position < src.hold_after:
            return self._inner.ready_at()
        self._open = os.path.exists(src.gate)
        if self._open:
            return None
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        if src.trickle <= 0 or (src.hold_at is not None and position >= src.hold_at):
            return now + POLL_S
        return max(self._held_since + self._trickled / src.trickle, now - 1.0)

    def read(self) -> pa.RecordBatch | None:
        past_hold = self._held_since is not None
        batch = self._inner.read()
        if batch is not None:
            self._emitted += batch.num_rows
            self._trickled += batch.num_rows if past_hold else 0
        return batch

    def offset(self) -> Any:
        return self._inner.offset()

    def backlog(self) -> int | None:
        return self._inner.backlog()


@dataclasses.dataclass(frozen=True)
class Gated(Source):
    """``inner`` whose every split slows after ``hold_after`` records and stops until ``gate`` opens.

    Attributes:
        inner: the wrapped source (its pacing applies before the hold only).
        gate: the path of the ``Gate``.
        hold_after: records a split emits at once (rounded up to whole batches).
        trickle: records a second a split emits after ``hold_after`` while the gate is shut (0: none).
        hold_at: records after which a split emits nothing until the gate opens (``None``: no limit).
        position: a split's record position at a reader's offset (``None``: records since it opened).
    """

    inner: Source
    gate: str
    hold_after: int
    trickle: float = 0.0
    hold_at: int | None = None
    position: Callable[[Any], int] | None = None

    def schema(self) -> pa.Schema | None:
        return self.inner.schema()

    def splits(self) -> list[SourceSplit]:
        return self.inner.splits()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _GatedReader(self.inner.open_split(split, offset), self)

    def for_parallelism(self, parallelism: int) -> "Gated":
        return dataclasses.replace(self, inner=self.inner.for_parallelism(parallelism))

    def describe(self) -> str:
        return f"gated({self.inner.describe()})"


def gated(inner: Source, gate: Gate, per_split: float, fast: float, trickle: float = 0.0,
          hold: float = 0.8, position: Callable[[Any], int] | None = None) -> Gated:
    """``inner`` gated by fractions of its ``per_split`` records: ``fast`` at once, ``hold`` at most before
    the gate opens, and ``trickle`` records a second per split in between."""
    return Gated(inner, gate.path, int(fast * per_split), trickle, int(hold * per_split), position)
