"""logic.py: what one operator instance runs, and what sources and sinks offer.

These are the pure contracts between the user-facing operator library and the
runtime in ``actors/``. Nothing here knows about Ray: a logic object is created
inside a host actor from its (cloudpickled) spec and driven one message at a
time by the host's mailbox loop.

Lifecycle of an :class:`OperatorLogic`::

    CREATED --open()--> OPEN --process()*--> finish() --> FINISHED --close()--> CLOSED

Only the instance that owns a logic object touches it; it is never shared
between threads.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pyarrow as pa

if TYPE_CHECKING:
    from .sides import SourceSide

__all__ = [
    "InstanceInfo",
    "OperatorLogic",
    "SideOutput",
    "Source",
    "SourceSplit",
    "SplitAddress",
    "SplitReader",
    "Sink",
    "SinkWriter",
]


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceInfo:
    """Identity of one operator instance.

    Attributes:
        operator: the logical operator's unique name.
        index: this instance's index in ``range(parallelism)``.
        parallelism: how many instances the operator has.
        num_bins: the operator's number of key bins (keyed operators), else 0.
    """

    operator: str
    index: int
    parallelism: int
    num_bins: int = 0

    def __str__(self) -> str:
        return f"{self.operator}[{self.index}]"


@dataclasses.dataclass(frozen=True, slots=True)
class SideOutput:
    """A batch an operator emits on a named side output instead of its main output.

    Only the streams taken with ``Stream.side_output(port)`` receive it.
    """

    port: str
    batch: pa.RecordBatch


class OperatorLogic(abc.ABC):
    """The per-instance behaviour of an operator: batches in, batches out.

    ``process`` receives whole ``pyarrow.RecordBatch``es and returns the
    batches to emit (possibly none). Built-in operators are vectorised.
    """

    info: InstanceInfo

    def open(self, info: InstanceInfo) -> None:
        """Called once before the first batch, inside the host actor."""
        self.info = info

    def where(self, verb: str) -> str:
        """What messages call this operator: ``operator 'name'`` once opened, else ``verb`` (its verb)."""
        info = getattr(self, "info", None)
        return f"operator {info.operator!r}" if info is not None else verb

    @abc.abstractmethod
    def process(self, batch: pa.RecordBatch, input_index: int) -> Sequence[pa.RecordBatch]:
        """Process one input batch from input ``input_index``; return output batches."""

    def on_watermark(self, watermark: int) -> Sequence[pa.RecordBatch]:
        """Event time reached ``watermark`` (no record with time ``<= watermark`` follows): return output.

        Called in order with the data, before the watermark is sent on; windows
        and timers fire here. Default: nothing.
        """
        return ()

    def finish(self) -> Sequence[pa.RecordBatch]:
        """All inputs have ended: return any final output (e.g. final aggregates)."""
        return ()

    def close(self) -> None:
        """Release resources. Idempotent."""

    @property
    def state(self) -> Any | None:
        """The instance's keyed state (a ``state.BinnedState``) or ``None`` if stateless."""
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class SourceSplit:
    """One replayable unit of a source's input.

    Attributes:
        split_id: unique within the source, stable across runs.
        payload: whatever the source needs to read the split (a path and a
            row group, a slice of batches, a seed...). Must be picklable.
    """

    split_id: str
    payload: Any


@dataclasses.dataclass(frozen=True, slots=True)
class SplitAddress:
    """Where a split is being read: its source instance and the split's id.

    A message sent from outside the dataflow to this address (the host's
    ``to_reader``) reaches the reader of that split, see :meth:`SplitReader.receive`.
    """

    operator: str
    index: int
    split_id: str


class SplitReader(abc.ABC):
    """Reads one split, batch by batch, resumable from an offset."""

    @abc.abstractmethod
    def read(self) -> pa.RecordBatch | None:
        """Return the next batch, or ``None`` when the split is exhausted."""

    @abc.abstractmethod
    def offset(self) -> Any:
        """The position after the last batch returned (picklable, for checkpoints)."""

    def ready_at(self) -> float | None:
        """``time.monotonic()`` before which ``read`` must not be called, or ``None``.

        Rate-controlled sources use this to pace themselves without sleeping
        inside the host's loop.
        """
        return None

    def backlog(self) -> int | None:
        """Records offered to this split but not read yet, where the source can say (``None``: unknown).

        Autoscaling reads it: a source that falls behind is offered more than the dataflow takes.
        """
        return None

    def bind(self, address: SplitAddress) -> None:
        """Called once, right after the split was opened inside a host: where this reader runs.

        A reader fed from outside the dataflow tells its feeder this address
        (and its host). Default: nothing.
        """

    def receive(self, message: Any) -> Any:
        """A message sent to this reader's address from outside the dataflow; returns the answer.

        Runs on the host's event loop, between two steps of operator code: it
        must only record the message and answer, never block. ``None`` is
        what the host answers where no reader of the split is open, so a
        reader should not answer ``None`` itself.

        Raises:
            TypeError: this reader takes no messages (the default).
        """
        raise TypeError(f"{type(self).__name__} takes no messages (got a {type(message).__name__})")

    def close(self) -> None:
        """Release resources. Idempotent."""


class Source(abc.ABC):
    """A pull-based, replayable source: a set of splits, each read from an offset.

    ``splits()`` is called once on the driver at ``submit()``; split ``i`` goes
    to source instance ``i % parallelism``.
    """

    @abc.abstractmethod
    def schema(self) -> pa.Schema | None:
        """The schema of every batch, if known before running."""

    @abc.abstractmethod
    def splits(self) -> list[SourceSplit]:
        """The splits of this source (computed on the driver)."""

    @abc.abstractmethod
    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        """Open ``split`` positioned at ``offset`` (``None``: from the start)."""

    def for_parallelism(self, parallelism: int) -> "Source":
        """This source as read by ``parallelism`` instances (``Dataflow.source`` asks once).

        A source whose splits are cut for the job (``from_arrow`` without ``num_splits``: one row
        range per instance) returns a copy cut so; the default is the source itself.
        """
        return self

    def read_ahead(self) -> int:
        """How many splits after the one it reads an instance opens early (default 0).

        A source whose data is pushed to its readers from elsewhere opens the
        next splits' readers early, so that their data has somewhere to go
        before their turn (see :meth:`SplitReader.bind`). Readers opened early
        are read in split order all the same.
        """
        return 0

    def fed_from_outside(self) -> bool:
        """Whether processes outside the dataflow send its readers data (``SplitReader.receive``, through
        the host actor). A job with such a source never hands its hosts to the next job
        (``JobConfig.reuse_hosts``): those senders hold the hosts' handles beyond the job."""
        return False

    def bounded(self) -> bool | None:
        """Whether the source ends by itself: ``True`` (a file, a table, ``generate(n)``), ``False`` (it never
        does: ``generate(None)``) or ``None`` (it cannot tell; the default).

        ``submit`` refuses an aggregation left to emit only at end of input (``emit="final"``, the
        default) downstream of a source that answers ``False``, and warns where it answers ``None``.
        A custom source that ends should answer ``True``.
        """
        return None

    def driver_bound(self) -> str | None:
        """Why this source needs the process that submitted the job to stay alive (``None``: it does not).

        A detached job (``submit(..., detached=True)``) outlives its driver, so
        ``submit`` refuses a source that answers with a reason.
        """
        return None

    def side(self) -> "SourceSide | None":
        """What ``splits()`` started beside the job for this source (a Spark driver), or ``None`` (the default).

        The job's owner (a detached job's manager) watches it, restarts the job from its last checkpoint
        when it fails, and closes it with the job (see ``operators.sides``).
        """
        return None

    def checkpoint_complete(self, checkpoint_id: int, offsets: dict[str, Any]) -> None:
        """Checkpoint ``checkpoint_id`` completed, holding these offsets (split id -> offset).

        Called at the job's controller, once per completed checkpoint, on a copy
        of the source pickled at ``submit()`` (driver-side attributes are not
        there). A source whose upstream keeps data for a replay may release
        what lies before these offsets: a restore never goes further back.
        The default does nothing. It must not block.
        """

    def describe(self) -> str:
        """A short name for messages."""
        return type(self).__name__


class SinkWriter(abc.ABC):
    """Writes the batches that reach one sink instance."""

    @abc.abstractmethod
    def write(self, batch: pa.RecordBatch) -> None:
        """Accept one batch."""

    def write_ahead(self, batch: pa.RecordBatch, epochs: int) -> bool:
        """Accept a batch of the output ``epochs`` epochs after the one being written (it came after the
        barriers of that many checkpoints whose epochs are not staged yet, while their barriers are still on
        their way on other inputs); return True. Each ``prepare_commit`` stages one epoch, the oldest first:
        what ``write`` wrote, then what came ``epochs=1`` ahead, and so on.

        Default: False, the writer cannot; the sink keeps the batch in memory and ``write``s it once the
        epochs before it are staged (above a bound it holds back those inputs instead).
        """
        return False

    def prepare_commit(self, epoch: int) -> Any:
        """Checkpoint barrier ``epoch``: stage the output written since the last one.

        Returns what was staged (picklable, e.g. file paths); ``Sink.commit``
        makes it visible once the checkpoint is durable. Default: nothing.
        """
        return None

    def finish(self) -> Any:
        """End of input: stage the rest; return a picklable result for the job (committed by the driver)."""
        return None

    def abort(self) -> None:
        """The job failed or was cancelled: discard uncommitted output. Idempotent."""


class Sink(abc.ABC):
    """A sink: creates one writer per sink instance and combines their results."""

    @abc.abstractmethod
    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        """Create the writer for one sink instance (called inside the host)."""

    def combine(self, results: Iterable[Any]) -> Any:
        """Combine the per-instance ``finish()`` results on the driver."""
        return list(results)

    def bind_schema(self, schema: pa.Schema | None) -> "Sink":
        """This sink, told the schema of the stream it ends (known at build time, or None)."""
        return self

    def bind_output(self, directory: str, name: str, run: str = "") -> "Sink":
        """This sink, told its operator name, a durable directory for staged output (checkpoints on) and the
        job's run id (one per submit or restore: name files by it so that runs never overwrite each other)."""
        return self

    def claim(self, job: str) -> None:
        """At submit: refuse (``OutputInUseError``) output that another running job writes; else hold it."""

    def release(self) -> None:
        """The job ended: drop what :meth:`claim` holds (idempotent)."""

    def commit(self, staged: Iterable[Any]) -> Any:
        """Make staged output visible (``prepare_commit``/``finish`` results); idempotent."""
        return None

    def commit_final(self, results: Iterable[Any]) -> Any:
        """End of input, every instance finished: commit their ``finish()`` results."""
        return self.commit(results)

    def recover(self, committed: Iterable[Any]) -> None:
        """Before a replay: finish committing ``committed`` and discard anything else staged."""

    def take_back(self, checkpoint_id: int) -> None:
        """A recovery falls back to checkpoint ``checkpoint_id`` (0: the start, or the checkpoint the job
        was restored from) because newer ones are unreadable: remove this run's output committed after
        it, which the replay writes again. The default does nothing (a sink without two-phase commit
        writes replayed records again at any recovery)."""

    def describe(self) -> str:
        """A short name for messages."""
        return type(self).__name__
