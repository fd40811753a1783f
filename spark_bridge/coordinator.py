"""coordinator.py: the bridge's coordinator actors: a directory of where each unit goes, credit, commits.

Thin async Ray shells around the pure cores: :class:`UnitCoordinator` around
``units.UnitDirectory`` (``from_spark``), :class:`StreamCoordinator` around
``epochs.EpochDirectory`` (``from_spark_stream``). Readers in the hosts
register here, Spark tasks ask where to push (``route``), the driver's job
launcher asks what to compute (``launch``) and reports finished Spark jobs
(``job_done``); the cores' decisions to commit or fail a unit are sent to
the readers (``OperatorHost.to_reader``) from here. No row data passes
through a coordinator: tasks push their batches straight to the readers'
hosts, and every call's arguments are checked for row data
(``row_bytes_received`` in the statistics stays 0).

Calls on an async actor may run out of order, so readers' messages carry
tokens and Spark's tasks their launch's generation; a task reports success
only after all its pushes returned.

The actors are created by the driver as named actors in the bridge's
namespace and killed by the source's ``close()``. Starting one costs a
process start (about a second on a busy small node); with
``from_spark(keep_warm=True)``, ``close()`` starts a bare batch coordinator
that the next ``from_spark`` of this driver configures instead
(``release_warm_coordinators`` stops it; it dies with the driver in any case).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import ray

from .epochs import EpochDirectory, EpochStatistics
from .messages import Destination, Forward
from .units import WAIT, BufferStatistics, Unit, UnitDirectory

__all__ = [
    "NAMESPACE",
    "StreamCoordinator",
    "UnitCoordinator",
    "release_warm_coordinators",
    "row_bytes",
    "start_warm_coordinator",
    "take_warm_coordinator",
]

NAMESPACE = "chiray-spark"


def row_bytes(value: Any) -> int:
    """Bytes of row data (bytes-like or Arrow) inside a call's arguments, nested ones included."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, (pa.RecordBatch, pa.Table)):
        return int(value.nbytes)
    if isinstance(value, pa.Buffer):
        return int(value.size)
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(row_bytes(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(row_bytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return 0


class _Shell:
    """Waking whoever waits for the core's state to change, and sending its decisions to the readers."""

    _event: asyncio.Event
    _core: Any

    def _changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def _wait(self, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    async def _until(self, ask: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float) -> Any:
        """``ask()`` again after each change until ``done`` accepts its answer or ``timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            answer = ask()
            left = deadline - loop.time()
            if done(answer) or left <= 0:
                return answer
            await self._wait(left)

    def _note(self, *args: Any) -> None:
        self._core.note_received(row_bytes(args))

    async def _send(self, forwards: list[Forward]) -> None:
        """Send the core's messages to the readers; their answers may bring more."""
        while forwards:
            answers = await asyncio.gather(*(self._deliver(f) for f in forwards))
            forwards = [more for f, (answer, error) in zip(forwards, answers)
                        for more in self._core.answered(f, answer, error)]
        self._changed()

    @staticmethod
    async def _deliver(forward: Forward) -> tuple[Any, str | None]:
        try:
            return await forward.destination.send(forward.message), None
        except ray.exceptions.RayActorError:  # the reader's host died: its successor registers
            return None, None
        except Exception as e:  # the reader raised: a bug, which fails the unit with it
            cause = getattr(e, "cause", None) or e
            return None, f"{type(cause).__name__}: {cause}"


@ray.remote(num_cpus=0, max_restarts=0)
class UnitCoordinator(_Shell):
    """Ray actor: the :class:`UnitDirectory` of one bridged DataFrame, plus waiting and sending.

    Created with its units, or bare (a warm coordinator, see
    :func:`take_warm_coordinator`) and given them by ``configure``; calls
    that need the directory wait for it.
    """

    def __init__(self, units: Sequence[Unit] | None = None, max_units: int = 1) -> None:
        self._event = asyncio.Event()
        self._configured = asyncio.Event()
        self._core: UnitDirectory | None = None
        if units is not None:
            self._configure(units, max_units)

    def _configure(self, units: Sequence[Unit], max_units: int) -> None:
        self._core = UnitDirectory([tuple(u) for u in units], max_units)  # type: ignore[misc]
        self._configured.set()

    async def configure(self, units: Sequence[Unit], max_units: int) -> None:
        """A warm coordinator takes its DataFrame's units."""
        if self._core is not None:
            raise RuntimeError("bug in spark_bridge: a configured coordinator was configured again")
        self._configure(units, max_units)

    async def ping(self) -> bool:
        return True

    async def _ready(self) -> UnitDirectory:
        if self._core is None:
            await self._configured.wait()
        assert self._core is not None
        return self._core

    async def register(self, unit: Unit, destination: Destination) -> None:
        """A reader of ``unit`` was opened (maybe ahead of its turn) at ``destination``."""
        core = await self._ready()
        self._note(unit, destination)
        await self._send(core.register(tuple(unit), destination))  # type: ignore[arg-type]

    async def want(self, unit: Unit, destination: Destination) -> None:
        """The reader at ``destination`` waits for ``unit`` now."""
        core = await self._ready()
        self._note(unit, destination)
        await self._send(core.want(tuple(unit), destination))  # type: ignore[arg-type]

    async def taken(self, unit: Unit, token: str, rows: int, nbytes: int) -> None:
        core = await self._ready()
        self._note(unit, token, rows, nbytes)
        core.taken(tuple(unit), token, rows, nbytes)  # type: ignore[arg-type]
        self._changed()  # freed credit

    async def launch(self, timeout_s: float) -> list[tuple[int, list[Unit]]]:
        """Launches to run now, ``[(generation, units)]`` (waits up to ``timeout_s`` for some)."""
        core = await self._ready()
        generation, units = await self._until(core.launch, lambda answer: bool(answer[1]), timeout_s)
        return [(generation, units)] if units else []

    async def route(self, unit: Unit, generation: int, timeout_s: float) -> Destination | str | None:
        """Where a task pushes ``unit``: waits up to ``timeout_s`` for its reader to register (then ``WAIT``)."""
        core = await self._ready()
        self._note(unit, generation)
        unit = (unit[0], unit[1])
        return await self._until(lambda: core.route(unit, generation), lambda answer: answer != WAIT, timeout_s)

    async def job_done(self, generation: int, units: Sequence[Unit], error: str | None,
                       succeeded: Sequence[tuple[Unit, int, int, int]] = (), lost: Sequence[Unit] = ()) -> None:
        core = await self._ready()
        self._note(generation, units, error, succeeded, lost)
        await self._send(core.job_done(generation, [tuple(u) for u in units], error, succeeded, lost))  # type: ignore[misc]

    async def statistics(self) -> BufferStatistics:
        return (await self._ready()).statistics()


@ray.remote(num_cpus=0, max_restarts=0)
class StreamCoordinator(_Shell):
    """Ray actor: the :class:`EpochDirectory` of one streaming query, plus waiting and sending."""

    def __init__(self, lanes: int, max_epochs: int, retain_epochs: int) -> None:
        self._core: EpochDirectory = EpochDirectory(lanes, max_epochs, retain_epochs)
        self._event = asyncio.Event()

    async def wait_ready(self, timeout_s: float) -> bool:
        """Room for the next micro-batch and a reader for every lane (waits up to ``timeout_s``)."""
        if not self._core.ready():
            await self._wait(timeout_s)
        return self._core.ready()

    async def begin(self, epoch: int) -> int | None:
        """The generation to push micro-batch ``epoch`` with; ``None``: committed already (a re-run)."""
        return self._core.begin(epoch)

    async def route(self, unit: tuple[int, int], generation: int, timeout_s: float = 0.0) -> Destination | None:
        """Where a task pushes ``unit`` (its lane's reader); never waits (every lane has one before a push)."""
        self._note(unit, generation)
        return self._core.route(unit, generation)

    async def commit(self, epoch: int, generation: int, partitions: Sequence[int],
                     succeeded: Sequence[tuple[int, int, int, int]]) -> None:
        self._note(epoch, generation, partitions, succeeded)
        await self._send(self._core.commit(epoch, generation, partitions, succeeded))

    async def register_lane(self, lane: int, destination: Destination, from_epoch: int) -> None:
        self._note(lane, destination, from_epoch)
        await self._send(self._core.register(lane, destination, from_epoch))

    async def taken(self, lane: int, epoch: int, token: str, rows: int, nbytes: int) -> None:
        self._note(lane, epoch, token, rows, nbytes)
        self._core.taken(lane, epoch, rows, nbytes)
        self._changed()  # freed credit

    async def acknowledge(self, offsets: dict[int, int]) -> None:
        self._core.acknowledge(offsets)
        self._changed()

    async def launch(self, timeout_s: float) -> list[tuple[int, list[tuple[int, int]]]]:
        """Shares to push again from Spark's copy, one Spark job per epoch (waits up to ``timeout_s``)."""
        return await self._until(self._core.launch, bool, timeout_s)

    async def job_done(self, generation: int, units: Sequence[tuple[int, int]], error: str | None,
                       succeeded: Sequence[tuple[tuple[int, int], int, int, int]] = (),
                       lost: Sequence[tuple[int, int]] = ()) -> None:
        self._note(generation, units, error, succeeded, lost)
        await self._send(self._core.job_done(generation, [tuple(u) for u in units], error, succeeded))  # type: ignore[misc]

    async def end(self, error: str | None = None) -> None:
        await self._send(self._core.end(error))

    async def take_released(self) -> list[int]:
        return self._core.take_released()

    async def registered(self, timeout_s: float) -> dict[int, int] | None:
        """Each lane's epoch to start from, once every lane's reader registered (waits up to ``timeout_s``)."""
        return await self._until(self._core.registered, lambda answer: answer is not None, timeout_s)

    async def statistics(self) -> EpochStatistics:
        return self._core.statistics()


# -- warm batch coordinators -----------------------------------------------------------------

_warm: list[tuple[str, str, Any]] = []  # (Ray job id, actor name, handle)
_warm_lock = threading.Lock()

WARM_PING_S = 30.0
"""How long a warm coordinator may take to answer before a new one is started instead."""


def _session() -> str:
    return ray.get_runtime_context().get_job_id()


def start_warm_coordinator() -> None:
    """Start a bare coordinator (in the background) for the next ``from_spark`` of this driver, unless one is kept."""
    session = _session()
    with _warm_lock:
        _warm[:] = [w for w in _warm if w[0] == session]
        if _warm:
            return
        name = f"chiray-coordinator-{uuid.uuid4().hex[:12]}"
        handle = UnitCoordinator.options(name=name, namespace=NAMESPACE).remote()  # type: ignore[attr-defined]
        _warm.append((session, name, handle))


def take_warm_coordinator() -> tuple[str, Any] | None:
    """A started bare coordinator ``(name, handle)`` of this Ray session, or ``None``."""
    session = _session()
    with _warm_lock:
        mine = [w for w in _warm if w[0] == session]
        _warm.clear()
    for _, name, handle in mine:
        try:
            ray.get(handle.ping.remote(), timeout=WARM_PING_S)
            return name, handle
        except Exception:  # died or never came up: start a fresh one instead
            kill(handle)
    return None


def release_warm_coordinators() -> int:
    """Stop the warm coordinator this driver keeps (``from_spark(keep_warm=True)``); returns how many."""
    with _warm_lock:
        warm = list(_warm)
        _warm.clear()
    for _, _, handle in warm:
        kill(handle)
    return len(warm)


def kill(handle: Any) -> None:
    """Kill a coordinator actor; one already gone is fine."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        pass
