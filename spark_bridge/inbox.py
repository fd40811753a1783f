"""inbox.py: the hand-off actor between Spark tasks and the dataflow's source instances.

A thin async Ray shell around :class:`units.UnitBuffer`: Spark tasks call
``push``, the driver's job launcher calls ``launch`` and ``job_done`` (which
commits the attempts Spark reported successful), source instances call
``take``. Calls on an async actor may run out of order, so every push
carries its sequence number, and a task reports success only after all its
pushes returned.

The actor is created by the driver (:class:`source.SparkSource`) as a named,
detached-from-nothing actor in the bridge's namespace and killed by
``SparkSource.close()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import ray

from .units import BufferStatistics, Unit, UnitBuffer

__all__ = ["NAMESPACE", "SparkInbox"]

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
    """Ray actor: the :class:`UnitBuffer` of one bridged DataFrame, plus waiting."""

    def __init__(self, units: Sequence[Unit], max_units: int) -> None:
        self._buffer = UnitBuffer([tuple(u) for u in units], max_units)  # type: ignore[misc]
        self._event = asyncio.Event()

    async def take(self, unit: Unit) -> list[bytes]:
        """Wait until ``unit`` is committed and return its batches (Arrow IPC streams, in order)."""
        first = True
        while True:
            data = self._buffer.take(tuple(unit))  # type: ignore[arg-type]
            if first or data is not None:
                self._changed()  # a new want (wakes the launcher) or freed credit
            if data is not None:
                return data
            first = False
            await self._wait(None)

    async def launch(self, timeout_s: float) -> tuple[int, list[Unit]]:
        """Units to compute now (waits up to ``timeout_s`` for some)."""
        generation, units = self._buffer.launch()
        if not units:
            await self._wait(timeout_s)
            generation, units = self._buffer.launch()
        return generation, units

    async def job_done(
        self,
        generation: int,
        units: Sequence[Unit],
        error: str | None,
        succeeded: Sequence[tuple[Unit, int, int]] = (),
    ) -> None:
        self._buffer.job_done(generation, [tuple(u) for u in units], error, succeeded)  # type: ignore[misc]
        self._changed()

    async def push(self, unit: Unit, generation: int, attempt: int, seq: int, data: bytes, rows: int) -> bool:
        return self._buffer.push(tuple(unit), generation, attempt, seq, data, rows)  # type: ignore[arg-type]

    async def staged_rows(self, unit: Unit) -> int:
        return self._buffer.staged_rows(tuple(unit))  # type: ignore[arg-type]

    async def statistics(self) -> BufferStatistics:
        return self._buffer.statistics()
