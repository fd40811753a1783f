"""gate.py: test-driven inputs: a source held at a gate until the test opens it, and one paced by a dial.

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

A test whose input must last exactly as long as it acts gives ``end_at_open``
over an unbounded source: each split then ends at its next read once the gate
opens, instead of reading on. With ``report`` each split writes the offset it
ended at, and ``Gated.emitted()`` reads back, after the job, the batches the
splits emitted: the oracle's input.

``Dialed`` is for tests of rate changes (the autoscaler): each split is paced
at the rate of the phase a ``Dial`` file names, and the test turns the dial
when the job has reacted (a scale-up done), not at fixed times; a last turn
ends the input.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle
import time
from typing import Any, Callable

import pyarrow as pa

from chiray.operators.logic import Source, SourceSplit, SplitReader

__all__ = ["Gated", "Gate", "gated", "Dial", "Dialed"]

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
    def __init__(self, inner: SplitReader, source: "Gated", split_id: str = "") -> None:
        self._inner, self._source, self._split_id = inner, source, split_id
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
            if src.end_at_open and os.path.exists(src.gate):
                self._open = True
                return None  # read() ends the split at once
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
        src = self._source
        if src.end_at_open and (self._open or os.path.exists(src.gate)):
            self._open = True
            if src.report is not None:  # written whole: the test never reads half an offset
                staged = f"{src.report}.{self._split_id}.staged"
                pathlib.Path(staged).write_bytes(pickle.dumps(self._inner.offset()))
                os.replace(staged, f"{src.report}.{self._split_id}")
            return None
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
        end_at_open: once the gate is open, each split ends at its next read (a batch boundary)
            instead of reading on to its end (``False``: it reads on, unpaced).
        report: with ``end_at_open``, a path prefix: a split that ends at the gate writes its
            reader's offset to ``<report>.<split id>``, which ``emitted()`` reads back (a split
            reopened by a recovery writes it again: the last offset written is the one the job kept).
    """

    inner: Source
    gate: str
    hold_after: int
    trickle: float = 0.0
    hold_at: int | None = None
    position: Callable[[Any], int] | None = None
    end_at_open: bool = False
    report: str | None = None

    def schema(self) -> pa.Schema | None:
        return self.inner.schema()

    def splits(self) -> list[SourceSplit]:
        return self.inner.splits()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _GatedReader(self.inner.open_split(split, offset), self, split.split_id)

    def bounded(self) -> bool | None:
        return True if self.end_at_open else self.inner.bounded()

    def emitted(self) -> list[pa.RecordBatch]:
        """After the job: the batches its splits emitted before they ended at the gate, each split read
        from its start up to the offset it reported (``end_at_open`` with ``report``).

        Raises:
            ValueError: no report (not ``end_at_open`` with ``report``, or a split that never ended at
                the gate), or a split that ends before the offset it reported.
        """
        if not self.end_at_open or self.report is None:
            raise ValueError("Gated.emitted() needs end_at_open=True and a report path")
        batches = []
        for split in self.inner.splits():
            path = pathlib.Path(f"{self.report}.{split.split_id}")
            if not path.exists():
                raise ValueError(f"split {split.split_id!r} did not end at the gate: no {path}")
            end = pickle.loads(path.read_bytes())
            reader = self.inner.open_split(split)
            while reader.offset() != end:
                batch = reader.read()
                if batch is None:
                    raise ValueError(f"split {split.split_id!r} ended before the offset it reported, {end!r}")
                batches.append(batch)
        return batches

    def for_parallelism(self, parallelism: int) -> "Gated":
        return dataclasses.replace(self, inner=self.inner.for_parallelism(parallelism))

    def describe(self) -> str:
        return f"gated({self.inner.describe()})"


def gated(inner: Source, gate: Gate, per_split: float, fast: float, trickle: float = 0.0,
          hold: float = 0.8, position: Callable[[Any], int] | None = None) -> Gated:
    """``inner`` gated by fractions of its ``per_split`` records: ``fast`` at once, ``hold`` at most before
    the gate opens, and ``trickle`` records a second per split in between."""
    return Gated(inner, gate.path, int(fast * per_split), trickle, int(hold * per_split), position)


class Dial:
    """A file that names the phase of a ``Dialed`` source; ``Dial(tmp_path)`` starts at phase 0."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = str(pathlib.Path(directory) / "dial")
        self.turn(0)

    def turn(self, phase: int) -> None:
        """Move every reader to ``phase`` (written whole: a reader never sees half a number)."""
        staged = f"{self.path}.{phase}"
        pathlib.Path(staged).write_text(str(phase))
        os.replace(staged, self.path)


class _DialedReader(SplitReader):
    def __init__(self, inner: SplitReader, source: "Dialed") -> None:
        self._inner, self._source = inner, source
        self._phase = -1
        self._phase_start = 0.0
        self._phase_rows = 0
        self._looked_at = float("-inf")

    def _current(self) -> int:
        now = time.monotonic()
        if now - self._looked_at >= POLL_S:
            self._looked_at = now
            phase = int(pathlib.Path(self._source.dial).read_text())
            if phase != self._phase:
                self._phase, self._phase_start, self._phase_rows = phase, now, 0
        return self._phase

    def ready_at(self) -> float | None:
        phase = self._current()
        if phase >= len(self._source.rates):
            return None  # the end: read() says so at once
        return self._phase_start + self._phase_rows / self._source.rates[phase]

    def read(self) -> pa.RecordBatch | None:
        if self._current() >= len(self._source.rates):
            return None
        batch = self._inner.read()
        if batch is not None:
            self._phase_rows += batch.num_rows
        return batch

    def offset(self) -> Any:
        return self._inner.offset()


@dataclasses.dataclass(frozen=True)
class Dialed(Source):
    """``inner`` paced at ``rates[phase]`` records a second per split, the phase set by the test's ``Dial``;
    a phase past the last rate ends every split (at a whole batch: the records emitted are a prefix of
    each split, which the job's statistics count).

    Attributes:
        inner: the wrapped, unpaced source (unbounded or long enough for every phase).
        dial: the path of the ``Dial``.
        rates: records a second per split, one per phase.
    """

    inner: Source
    dial: str
    rates: tuple[float, ...]

    def schema(self) -> pa.Schema | None:
        return self.inner.schema()

    def splits(self) -> list[SourceSplit]:
        return self.inner.splits()

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _DialedReader(self.inner.open_split(split, offset), self)

    def bounded(self) -> bool:
        return True  # the test's last turn of the dial ends it

    def describe(self) -> str:
        return f"dialed({self.inner.describe()})"
