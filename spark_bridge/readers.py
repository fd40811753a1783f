"""readers.py: the split readers of the push-mode sources, where Spark's batches arrive.

A reader runs inside the host actor process of its source instance. When the
source instance opens it (``SplitReader.bind``) it registers its
:class:`~messages.Destination` (that host's handle, its split address and a
fresh token) with the bridge's coordinator; Spark tasks then push their
Arrow batches straight to its host (``OperatorHost.feed_reader``, which the
host's loop hands to :meth:`receive`), where they are staged per attempt
(``staging.py``) until the coordinator commits one attempt (its messages come
through ``OperatorHost.to_reader``). Nothing here blocks the host's loop:
``receive`` only records and answers, ``ready_at`` tells the host when to
look again, and calls to the coordinator are sent without waiting (the
outcome of the last one is checked on the next).

- :class:`UnitReader` (``from_spark``): one unit (a partition); offset 0 or 1.
- :class:`LaneReader` (``from_spark_stream``): one lane's share of every
  epoch, in epoch order; offset = the next epoch it needs.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pyarrow as pa

from chiray.operators import SplitAddress, SplitReader

from .messages import Commit, CommitEpoch, Destination, EndStream, Fail, Push
from .push import decode
from .schema import conform
from .staging import AttemptStage
from .units import SparkUnitFailed, Unit

__all__ = ["POLL_S", "WANT_REFRESH_S", "CoordinatorLink", "LaneReader", "UnitReader", "empty"]

POLL_S = 0.005
"""How often the host looks at a reader that waits for data (a local check, no call)."""

WANT_REFRESH_S = 2.0
"""A reader that still waits for its unit says so again this often (a lost call cannot stall it)."""

_handles: dict[tuple[str, str], Any] = {}


class CoordinatorLink:
    """A reader's calls to its coordinator actor, and its own host's handle.

    Calls are sent without waiting for them; the next call first checks that
    the previous one did not fail (a coordinator that is gone is an error,
    not a silent stall).
    """

    def __init__(self, name: str, namespace: str) -> None:
        self.name, self.namespace = name, namespace
        self._last: Any = None  # the previous call's future

    def handle(self) -> Any:
        import ray

        key = (self.name, self.namespace)
        if key not in _handles:
            _handles[key] = ray.get_actor(self.name, namespace=self.namespace)
        return _handles[key]

    def here(self) -> Any:
        """The handle of the host actor this code runs in."""
        import ray

        return ray.get_runtime_context().current_actor

    def ask(self, method: str, *args: Any) -> Any:
        """Call ``method`` and wait for its answer (for the driver or the job's owner, never in a host's loop)."""
        import ray

        return ray.get(getattr(self.handle(), method).remote(*args))

    def call(self, method: str, *args: Any) -> None:
        import ray

        last = self._last
        if last is not None and last.done() and isinstance(last.exception(), ray.exceptions.RayActorError):
            raise RuntimeError(
                f"spark_bridge: the coordinator {self.name!r} is gone (was the source closed?)"
            ) from last.exception()
        self._last = getattr(self.handle(), method).remote(*args).future()


def empty(schema: pa.Schema) -> pa.RecordBatch:
    """A batch with no rows: "nothing yet" to the host (it emits no empty batch); ``None`` means "done"."""
    return pa.RecordBatch.from_pylist([], schema=schema)


def _batch(data: list[pa.Buffer], schema: pa.Schema) -> pa.RecordBatch:
    """The pushed IPC streams ``data`` as one batch of ``schema`` (Spark's own batches arrive as Spark
    wrote them: other string or time-zone types are cast here)."""
    batches = [b for chunk in data for b in decode(chunk)]
    if not batches:
        return empty(schema)
    return conform(batches[0] if len(batches) == 1 else pa.concat_batches(batches), schema)


class UnitReader(SplitReader):
    """Receives one unit's batches and reads it as one batch once committed; offset 0 or 1.

    Lifecycle: ``OPEN --bind--> REGISTERED --first ready_at--> WANTED --Commit--> COMMITTED --read--> TAKEN``
    (or ``--Fail-->`` FAILED: ``read`` raises). ``read`` returns an empty batch
    while the unit is not there yet.
    """

    def __init__(self, link: CoordinatorLink, schema: pa.Schema, unit: Unit, taken: bool) -> None:
        self._link, self._schema, self._unit = link, schema, tuple(unit)
        self._taken = taken
        self._token = uuid.uuid4().hex
        self._destination: Destination | None = None
        self._stage = AttemptStage()
        self._data: list[pa.Buffer] | None = None  # the committed attempt's batches
        self._error: str | None = None
        self._next_want: float | None = None

    def bind(self, address: SplitAddress) -> None:
        if self._taken:
            return
        self._destination = Destination(
            self._link.here(), address.operator, address.index, address.split_id, self._token
        )
        self._link.call("register", self._unit, self._destination)

    def receive(self, message: Any) -> Any:
        if getattr(message, "token", None) != self._token:
            return None  # meant for a reader this one replaced
        if isinstance(message, Push):
            if self._taken or self._data is not None or self._error is not None:
                return False  # committed already: a late attempt's batch, dropped
            self._stage.push((message.generation, message.attempt), message.seq, message.data, message.rows)
            return True
        if isinstance(message, Commit):
            rows = 0
            if self._data is None and not self._taken:  # else: committed already (a repeated launch)
                key = (message.generation, message.attempt)
                self._data, rows = self._stage.commit(key, message.num_batches)
            return rows, self._stage.drop(lambda key: True)
        if isinstance(message, Fail):
            self._error = message.error
            return self._stage.drop(lambda key: True)
        raise TypeError(f"bug in spark_bridge: a unit reader got {message!r}")

    def ready_at(self) -> float | None:
        if self._taken or self._data is not None or self._error is not None:
            return None
        if self._destination is None:
            raise RuntimeError(
                f"spark_bridge: the reader of unit {self._unit} was never bound to a host (it runs in a "
                "source instance of a submitted dataflow)"
            )
        now = time.monotonic()
        if self._next_want is None or now >= self._next_want:
            self._link.call("want", self._unit, self._destination)
            self._next_want = now + WANT_REFRESH_S
        return now + POLL_S

    def read(self) -> pa.RecordBatch | None:
        if self._taken:
            return None
        if self._error is not None:
            raise SparkUnitFailed(self._error)
        if self._data is None:
            self.ready_at()
            return empty(self._schema)
        data, self._data = self._data, None
        self._taken = True
        batch = _batch(data, self._schema)
        self._link.call("taken", self._unit, self._token, batch.num_rows, sum(len(d) for d in data))
        return batch if batch.num_rows else None

    def offset(self) -> int:
        return int(self._taken)

    def close(self) -> None:
        self._data = None
        self._stage.drop(lambda key: True)


class LaneReader(SplitReader):
    """Receives one lane's share of each epoch and reads the epochs in order; offset = the next epoch.

    An epoch is read once it is committed and every committed epoch before it
    was read (``CommitEpoch.previous``), whatever order the commits arrive in;
    an epoch with no rows for this lane is an empty batch.
    """

    def __init__(self, link: CoordinatorLink, schema: pa.Schema, lane: int, next_epoch: int) -> None:
        self._link, self._schema, self._lane = link, schema, lane
        self._next = next_epoch
        self._token = uuid.uuid4().hex
        self._stage = AttemptStage()  # keys: (epoch, partition, generation, attempt)
        self._epochs: dict[int, tuple[int, list[pa.Buffer]]] = {}  # committed, not read: epoch -> (previous, data)
        self._last: int | None = None  # no epoch after this one will come
        self._end_error: str | None = None
        self._error: str | None = None

    def bind(self, address: SplitAddress) -> None:
        destination = Destination(self._link.here(), address.operator, address.index, address.split_id, self._token)
        self._link.call("register_lane", self._lane, destination, self._next)

    def receive(self, message: Any) -> Any:
        if getattr(message, "token", None) != self._token:
            return None
        if isinstance(message, Push):
            epoch, partition = message.unit
            if epoch < self._next or epoch in self._epochs:
                return False
            key = (epoch, partition, message.generation, message.attempt)
            self._stage.push(key, message.seq, message.data, message.rows)
            return True
        if isinstance(message, CommitEpoch):
            return self._commit(message)
        if isinstance(message, EndStream):
            self._last, self._end_error = message.last, message.error
            return True
        if isinstance(message, Fail):
            self._error = message.error
            return self._stage.drop(lambda key: True)
        raise TypeError(f"bug in spark_bridge: a lane reader got {message!r}")

    def _commit(self, message: CommitEpoch) -> tuple[int, int]:
        """``(rows, discarded)``; rows ``-1``: an attempt's batches are not here (pushed to a former reader)."""
        epoch = message.epoch
        of_epoch = lambda key: key[0] == epoch  # noqa: E731
        if epoch < self._next or epoch in self._epochs:
            return 0, self._stage.drop(of_epoch)  # had it already
        keys = [(epoch, p, message.generation, a) for p, a, _ in message.attempts]
        if any(n and not self._stage.has(k) for k, (_, _, n) in zip(keys, message.attempts)):
            return -1, self._stage.drop(lambda key: key[0] == epoch and key[2] == message.generation)
        data, rows = [], 0
        for key, (_, _, n) in zip(keys, message.attempts):
            got, got_rows = self._stage.commit(key, n)
            data += got
            rows += got_rows
        self._epochs[epoch] = (message.previous, data)
        return rows, self._stage.drop(of_epoch)

    def _readable(self) -> int | None:
        ready = [e for e, (previous, _) in self._epochs.items() if e >= self._next and previous < self._next]
        return min(ready) if ready else None

    def _ended(self) -> bool:
        return self._last is not None and self._last < self._next

    def ready_at(self) -> float | None:
        if self._error is not None or self._readable() is not None or self._ended():
            return None
        return time.monotonic() + POLL_S

    def read(self) -> pa.RecordBatch | None:
        if self._error is not None:
            raise RuntimeError(self._error)
        epoch = self._readable()
        if epoch is None:
            if not self._ended():
                return empty(self._schema)
            if self._end_error is not None:
                raise RuntimeError(f"from_spark_stream: {self._end_error}")
            return None
        _, data = self._epochs.pop(epoch)
        self._next = epoch + 1
        batch = _batch(data, self._schema)
        self._link.call("taken", self._lane, epoch, self._token, batch.num_rows, sum(len(d) for d in data))
        return batch

    def offset(self) -> int:
        return self._next

    def close(self) -> None:
        self._epochs.clear()
        self._stage.drop(lambda key: True)
