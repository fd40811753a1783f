"""controller.py: the ``JobController`` Ray actor, a thin shell around ``control.coordination.JobLifecycle``.

Hosts report finished and failed instances here; a monitor task pings the
hosts and fails the job when one dies. ``wait()`` returns when the job
reaches a terminal state or the timeout passes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from control.coordination import JobLifecycle, LifecycleSnapshot

from .errors import JobFailedError

__all__ = ["JobController"]


@ray.remote(num_cpus=0)
class JobController:
    """One per job. Lifecycle follows its ``JobLifecycle``; ``stop()`` ends the monitor."""

    def __init__(self, job_name: str, sinks: list[tuple[str, int]], poll_interval_s: float):
        self.job_name = job_name
        self.lifecycle = JobLifecycle(sinks)
        self.poll_interval_s = poll_interval_s
        self.hosts: list[Any] = []
        self._changed = asyncio.Event()
        self._monitor: asyncio.Task | None = None

    async def start(self, hosts: list[Any]) -> None:
        self.hosts = hosts
        self._monitor = asyncio.get_running_loop().create_task(self._watch_hosts())

    def _notify(self) -> None:
        self._changed.set()
        if self.lifecycle.state.terminal and self.lifecycle.state.value != "FINISHED":
            for host in self.hosts:
                host.abort.remote()

    async def instance_finished(self, operator: str, index: int, result: Any) -> None:
        self.lifecycle.instance_finished((operator, index), result)
        self._notify()

    async def instance_failed(self, operator: str, index: int, error: BaseException) -> None:
        self.lifecycle.fail(error, f"operator {operator!r} instance {index}: {error.__cause__!r}")
        self._notify()

    async def host_error(self, host: int, reason: str) -> None:
        self.lifecycle.fail(JobFailedError(f"job {self.job_name!r}: {reason}"), reason)
        self._notify()

    async def cancel(self) -> LifecycleSnapshot:
        self.lifecycle.cancel()
        self._notify()
        return self.lifecycle.snapshot()

    async def wait(self, timeout: float | None) -> LifecycleSnapshot:
        """Return once terminal or after ``timeout`` seconds (None: no limit)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.lifecycle.state.terminal:
            self._changed.clear()
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                break
        return self.lifecycle.snapshot()

    async def snapshot(self) -> LifecycleSnapshot:
        return self.lifecycle.snapshot()

    async def results(self) -> dict:
        return dict(self.lifecycle.results)

    async def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()

    async def _watch_hosts(self) -> None:
        while not self.lifecycle.state.terminal:
            await asyncio.sleep(self.poll_interval_s)
            for host_id, host in enumerate(self.hosts):
                try:
                    await asyncio.wait_for(host.ping.remote(), timeout=120.0)
                except Exception as exc:
                    if not self.lifecycle.state.terminal:
                        await self.host_error(host_id, f"host {host_id} is unreachable: {exc!r}")
                    return
