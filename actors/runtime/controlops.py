"""controlops.py: control-op bookkeeping shared by every controller actor, and ``SideController``.

``ControllerOps`` runs ops at a controller: starts them (``on_init``), keeps
their runs, collects sink returns and acks, times them out and answers
``op_result`` / ``op_progress``. The job controller (``controller.py``) and
side controllers (``Job.add_controller``) both build on it; a side
controller's ops are injected through the job controller.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, TypeAlias

import ray
from ray.actor import ActorHandle

from chiray.control.coordination import OpCoordinator
from chiray.control.message import ControlMessage, ControlReturn, InstanceId
from chiray.control.oprun import JobView, OpFailedError, OpState

from .hosted import HostedController

if TYPE_CHECKING:
    from chiray.control.op import ControlOp

__all__ = ["ControllerOps", "OpItem", "OpResult", "SideController"]

OpItem: TypeAlias = "tuple[ControlOp, str]"
"""An op of a driver's batch and the id the driver gave it."""

OpResult: TypeAlias = "tuple[str, object, BaseException | None, float]"
"""What ``op_result`` answers: the op's state, its result, its error and the seconds it ran."""


class ControllerOps:
    """The op-running half shared by both controller actors."""

    def _init_ops(self, name: str, view: JobView | None) -> None:
        self.ops = OpCoordinator(name, view)
        self._op_events: dict[str, asyncio.Event] = {}
        self._start_errors: dict[str, BaseException] = {}
        self._timer: asyncio.Task | None = None

    def _start(self, op: ControlOp, op_id: str | None, view: JobView | None = None) -> ControlMessage:
        """``ops.start``; an op that cannot start is remembered as failed, for ``op_result``."""
        try:
            return self.ops.start(op, op_id, view)
        except Exception as exc:
            if op_id is not None:
                self._start_errors[op_id] = OpFailedError(f"control op {op_id} could not start: {exc}")
                self._start_errors[op_id].__cause__ = exc
            raise

    async def op_not_sent(self, op_id: str, reason: str) -> None:
        """The driver could not send op ``op_id`` (e.g. it does not pickle): ``op_result`` reports it."""
        self._start_errors.setdefault(op_id, OpFailedError(f"control op {op_id} could not start: {reason}"))

    def _ops_changed(self) -> None:
        for op_id in self.ops.take_finished():
            event = self._op_events.pop(op_id, None)
            if event is not None:
                event.set()

    async def _check_timeouts(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self.ops.check_timeouts()
            self._ops_changed()

    def _start_timer(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().create_task(self._check_timeouts())

    async def op_returned(self, returns: list[ControlReturn]) -> None:
        for ret in returns:
            self.ops.on_return(ret)
        self._ops_changed()

    async def op_ack(self, op_id: str, instance: InstanceId, payload: object) -> None:
        self.ops.on_ack(op_id, (instance[0], instance[1]), payload)  # a list after a round trip: a tuple again
        self._ops_changed()

    async def pid(self) -> int:
        """This controller's process id (tools measure its memory)."""
        return os.getpid()

    async def sinks_finished(self, sinks: list[InstanceId]) -> None:
        self.ops.sinks_finished(sinks)
        self._ops_changed()

    async def job_failed(self, error: BaseException) -> None:
        self.ops.fail_all(error)
        self._ops_changed()

    async def op_result(self, op_id: str, timeout: float | None) -> OpResult:
        """Wait up to ``timeout`` s; return (state, result, error, elapsed seconds)."""
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:  # run_op may still be on its way (run_control does not wait for it)
            run = self.ops.runs.get(op_id)
            if run is not None:
                break
            if op_id in self._start_errors:  # the op could not start (its on_init or extra edges)
                return "FAILED", None, self._start_errors[op_id], 0.0
            if deadline is not None and asyncio.get_running_loop().time() >= deadline:
                return "RUNNING", None, None, 0.0
            await asyncio.sleep(0.005)
        event = self._op_events.get(op_id)
        if run.state is OpState.RUNNING and event is not None:
            remaining = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return run.state.value, run.result, run.error, run.elapsed_s

    async def set_view(self, view: JobView) -> None:
        """The job's topology changed (a rescale): later ops see ``view``."""
        self.ops.view = view

    async def op_progress(self, op_id: str) -> dict[str, object]:
        run = self.ops.runs[op_id]
        return {"state": run.state.value, "waiting": len(run.waiting), "elapsed_s": run.elapsed_s,
                "sinks_waiting": sorted(run.waiting), "acks_waiting": sorted(run.acks_waiting)}


@ray.remote(num_cpus=0)
class SideController(ControllerOps):
    """A further controller of a job: runs its own ops, injected through the job controller."""

    def __init__(self, name: str, view: JobView, job_controller: ActorHandle | HostedController):
        self.job_controller = job_controller
        self._init_ops(name, view)

    async def set_job_controller(self, job_controller: ActorHandle | HostedController) -> None:
        """A new job controller took over (a recovery moved it, or the old one died): inject through it."""
        self.job_controller = job_controller

    async def run_op(self, op: ControlOp, op_id: str | None = None) -> str:
        self._start_timer()
        message = self._start(op, op_id)
        self._op_events[message.op_id] = asyncio.Event()
        try:
            await self.job_controller.inject.remote(message)
        except Exception as exc:
            self.ops.runs[message.op_id].fail(exc)
        self._ops_changed()
        return message.op_id

    async def run_ops(self, items: list[OpItem]) -> None:
        """Start each ``(op, op_id)`` in order, injected in one call to the job controller."""
        self._start_timer()
        messages = []
        for op, op_id in items:
            try:
                message = self._start(op, op_id)
            except Exception:  # remembered in _start_errors by _start
                continue
            self._op_events[message.op_id] = asyncio.Event()
            messages.append(message)
        if messages:
            try:
                errors = await self.job_controller.inject_many.remote(messages)
            except Exception as exc:
                errors = [exc] * len(messages)
            for message, error in zip(messages, errors):
                if error is not None:
                    self.ops.runs[message.op_id].fail(error)
        self._ops_changed()
