"""messages.py: what travels between Spark tasks, the coordinator and the readers in the hosts.

Row data goes in one message only, :class:`Push`, from a Spark task straight
to the host actor that runs the reader of its unit.
Everything the coordinator sends or receives is small: where a unit goes
(:class:`Destination`), commit decisions, errors, the end of a stream.

Pushes are queued at the host (``OperatorHost.feed_reader``), which answers
at once, from a thread of its own: a Spark task never waits for a step of
operator code. The host's loop hands them to the reader in arrival order,
before any later commit; the reader drops what is not its own (another
token) or comes too late (the unit or epoch is committed already). A commit
sent to a reader that is not open any more, or not the one a unit's tasks
pushed to, is answered ``None`` or ``-1`` by the host or the reader, and the
coordinator has the unit computed again for whoever registers for it next.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Commit", "CommitEpoch", "Destination", "EndStream", "Fail", "Forward", "Push"]


@dataclasses.dataclass(frozen=True, slots=True)
class Destination:
    """The reader a unit (or a lane's share of an epoch) is pushed to.

    Attributes:
        host: the ``OperatorHost`` actor handle that runs the reader.
        operator / index / split_id: the reader's ``SplitAddress``.
        token: names this reader (a reader opened again, e.g. after a
            restore, has a new one); messages carry it, and a reader refuses
            those meant for another token.
    """

    host: Any
    operator: str
    index: int
    split_id: str
    token: str

    def send(self, message: Any) -> Any:
        """``message`` to the reader: an ObjectRef of its answer (``OperatorHost.to_reader``)."""
        return self.host.to_reader.remote(self.operator, self.index, self.split_id, message)

    def feed(self, message: Any) -> Any:
        """``message`` queued for the reader: an ObjectRef of ``True`` once queued (``OperatorHost.feed_reader``)."""
        return self.host.feed_reader.remote(self.operator, self.index, self.split_id, message)


@dataclasses.dataclass(frozen=True, slots=True)
class Push:
    """One Arrow IPC stream of one task attempt, from a Spark task to the reader.

    ``unit`` is ``(epoch, partition)``; ``seq`` counts the attempt's pushes from 0. ``data`` is an
    Arrow buffer (``bytes`` also reads), which Ray ships out of band.
    """

    token: str
    unit: tuple[int, int]
    generation: int
    attempt: int
    seq: int
    data: Any
    rows: int


@dataclasses.dataclass(frozen=True, slots=True)
class Commit:
    """Coordinator to a unit's reader: this attempt succeeded with ``num_batches``; it is the unit's data.

    The reader answers ``(rows, discarded)``: rows committed and other
    attempts it dropped; ``None`` (from the host) when the reader is gone.
    """

    token: str
    generation: int
    attempt: int
    num_batches: int


@dataclasses.dataclass(frozen=True, slots=True)
class Fail:
    """Coordinator to a reader: its unit cannot be had; reading it raises with ``error``.

    The reader drops what it staged and answers how many attempts that was.
    """

    token: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class CommitEpoch:
    """Coordinator to a lane: epoch ``epoch`` is committed; these attempts are the lane's share of it.

    ``attempts`` lists ``(partition, attempt, num_batches)`` of the lane's
    partitions pushed in ``generation``; ``previous`` is the committed epoch
    before this one (``-1``: none), so that a lane takes epochs in order
    whatever order these messages arrive in. The lane answers the rows it
    committed, or ``-1`` if an attempt's batches did not reach it (they went
    to an earlier reader): the coordinator has that share pushed again.
    """

    token: str
    epoch: int
    previous: int
    generation: int
    attempts: tuple[tuple[int, int, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class EndStream:
    """Coordinator to a lane: no epoch after ``last`` will come (``error``: the query failed)."""

    token: str
    last: int
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Forward:
    """A decision of a coordinator's core: send ``message`` to ``destination`` (the shell does it).

    ``about`` names what it concerns for the core, when the answer comes back
    (a unit, or an ``(epoch, lane)``).
    """

    destination: Destination
    message: Any
    about: Any = None
