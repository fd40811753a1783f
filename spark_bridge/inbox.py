"""inbox.py: the hand-off actor between Spark tasks and the dataflow's source instances.

A thin async Ray shell around :class:`units.UnitBuffer`: Spark tasks call
``push``, the driver's job launcher calls ``launch`` and ``job_done`` (which
commits the attempts Spark reported successful), source instances call
``take``. Calls on an async actor may run out of order, so every push
carries its sequence number, and a task reports success only after all its
pushes returned.

The actor is created by the driver (:class:`source.SparkSource`) as a named
actor in the bridge's namespace and killed by ``SparkSource.close()``.
Starting it costs a process start (about a second on a busy small node);
with ``from_spark(keep_warm=True)``, ``close()`` starts a bare one that the
next ``from_spark`` of this driver configures instead (``release_warm_inboxes``
stops it; it dies with the driver in any case).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import ray

from .units import BufferStatistics, Unit, UnitBuffer

__all__ = ["NAMESPACE", "SparkInbox", "kill_warm_inboxes", "start_warm_inbox", "take_warm_inbox"]

NAMESPACE = "chiray-spark"


class Changes:
    """Waking whoever waits for an inbox's state to change (shared by the batch and streaming inboxes)."""

    _event: asyncio.Event

    def _changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def _wait(self, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass


@ray.remote(num_cpus=0, max_restarts=0)
class SparkInbox(Changes):
    """Ray actor: the :class:`UnitBuffer` of one bridged DataFrame, plus waiting.

    Created with its units, or bare (a warm inbox, see :func:`take_warm_inbox`)
    and given them by ``configure``; calls that need the buffer wait for it.
    """

    def __init__(self, units: Sequence[Unit] | None = None, max_units: int = 1) -> None:
        self._event = asyncio.Event()
        self._configured = asyncio.Event()
        self._buffer: UnitBuffer | None = None
        if units is not None:
            self._configure(units, max_units)

    def _configure(self, units: Sequence[Unit], max_units: int) -> None:
        self._buffer = UnitBuffer([tuple(u) for u in units], max_units)  # type: ignore[misc]
        self._configured.set()

    async def configure(self, units: Sequence[Unit], max_units: int) -> None:
        """A warm inbox takes its DataFrame's units."""
        if self._buffer is not None:
            raise RuntimeError("bug in spark_bridge: a configured inbox was configured again")
        self._configure(units, max_units)

    async def ping(self) -> bool:
        return True

    async def _ready(self) -> UnitBuffer:
        if self._buffer is None:
            await self._configured.wait()
        assert self._buffer is not None
        return self._buffer

    async def take(self, unit: Unit) -> list[bytes]:
        """Wait until ``unit`` is committed and return its batches (Arrow IPC streams, in order)."""
        buffer = await self._ready()
        first = True
        while True:
            data = buffer.take(tuple(unit))  # type: ignore[arg-type]
            if first or data is not None:
                self._changed()  # a new want (wakes the launcher) or freed credit
            if data is not None:
                return data
            first = False
            await self._wait(None)

    async def launch(self, timeout_s: float) -> tuple[int, list[Unit]]:
        """Units to compute now (waits up to ``timeout_s`` for some)."""
        buffer = await self._ready()
        generation, units = buffer.launch()
        if not units:
            await self._wait(timeout_s)
            generation, units = buffer.launch()
        return generation, units

    async def job_done(
        self,
        generation: int,
        units: Sequence[Unit],
        error: str | None,
        succeeded: Sequence[tuple[Unit, int, int]] = (),
    ) -> None:
        buffer = await self._ready()
        buffer.job_done(generation, [tuple(u) for u in units], error, succeeded)  # type: ignore[misc]
        self._changed()

    async def push(self, unit: Unit, generation: int, attempt: int, seq: int, data: bytes, rows: int) -> bool:
        buffer = await self._ready()
        return buffer.push(tuple(unit), generation, attempt, seq, data, rows)  # type: ignore[arg-type]

    async def staged_rows(self, unit: Unit) -> int:
        return (await self._ready()).staged_rows(tuple(unit))  # type: ignore[arg-type]

    async def statistics(self) -> BufferStatistics:
        return (await self._ready()).statistics()


# -- warm inboxes ------------------------------------------------------------------------

_warm: list[tuple[str, str, Any]] = []  # (Ray job id, actor name, handle)
_warm_lock = threading.Lock()

WARM_PING_S = 30.0
"""How long a warm inbox may take to answer before a new one is started instead."""


def _session() -> str:
    return ray.get_runtime_context().get_job_id()


def start_warm_inbox() -> None:
    """Start a bare inbox (in the background) for the next ``from_spark`` of this driver, unless one is kept."""
    session = _session()
    with _warm_lock:
        _warm[:] = [w for w in _warm if w[0] == session]
        if _warm:
            return
        name = f"chiray-inbox-{uuid.uuid4().hex[:12]}"
        _warm.append((session, name, SparkInbox.options(name=name, namespace=NAMESPACE).remote()))  # type: ignore[attr-defined]


def take_warm_inbox() -> tuple[str, Any] | None:
    """A started bare inbox ``(name, handle)`` of this Ray session, or ``None``."""
    session = _session()
    with _warm_lock:
        mine = [w for w in _warm if w[0] == session]
        _warm.clear()
    for _, name, handle in mine:
        try:
            ray.get(handle.ping.remote(), timeout=WARM_PING_S)
            return name, handle
        except Exception:  # died or never came up: start a fresh one instead
            _kill(handle)
    return None


def kill_warm_inboxes() -> int:
    """Kill the warm inbox this driver keeps; returns how many."""
    with _warm_lock:
        warm = list(_warm)
        _warm.clear()
    for _, _, handle in warm:
        _kill(handle)
    return len(warm)


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone
        pass
