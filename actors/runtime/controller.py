"""controller.py: the job controller, a Ray-facing shell that takes the hosts' and the driver's calls.

``Controller`` (one per job) tracks the job's lifecycle (``control.coordination.JobLifecycle``), watches
its hosts, and is the job's *injector*: every control op, from it or from any side controller, gets the
next number of one global injection order here and is broadcast to the sources (directly, or through
the broadcast tree's relays), so every channel sees ops in the same order. ``SideController``s
(``Job.add_controller``) run their own ops: their handlers run there and the sinks return to them.
The decisions live in plain parts, unit-tested without Ray: the lifecycle and the ops' runs
(``control.coordination``), the injection order and its calls (``injector.Injector``), when a
checkpoint of its own starts (``control.checkpointtimer.CheckpointTimer``), what its checkpoints
commit through and commit (``checkpoints.CheckpointBook``) and the watchdog over long steps
(``stepwatch.StepWatch``).

Where the controller runs: by default inside host 0's process (``hosted.HostedController``), so a
job costs no process beyond its hosts; with ``JobConfig(controller_process=True)``, and from a job's
first recovery on (the hosts are replaced then), in an actor of its own (``JobController``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Callable, TypeAlias

import ray
from ray.actor import ActorHandle

from chiray.control.checkpointtimer import RESTORE_RETRY_S, CheckpointTimer
from chiray.control.coordination import JobLifecycle, JobState, LifecycleSnapshot
from chiray.control.message import ControlMessage, InstanceId
from chiray.control.oprun import JobView, OpState
from chiray.control.ops.checkpoint import ResumeSources
from chiray.control.trees import Tree
from chiray.operators.logic import Sink, Source

from .checkpoints import CheckpointBook
from .controlops import ControllerOps, OpItem
from ..config import JobConfig
from ..errors import JobFailedError
from .hosted import HostedController, controller_host
from .injector import Injector, ops_running
from .messages import Parcel
from .stepwatch import StepWatch
from .storage import CheckpointStorage
from .transport import when_returned

if TYPE_CHECKING:
    from chiray.control.op import ControlOp
    from chiray.control.ops.checkpoint import CheckpointStore

    from .mailbox import LongStep

__all__ = ["Controller", "HostedController", "JobController", "controller_host"]

Hosts: TypeAlias = "list[ActorHandle] | dict[int, ActorHandle]"
"""A job's hosts: their handles in host-id order, or by host id."""


class Controller(ControllerOps):
    """One per job: lifecycle, host watch, the global injection order, checkpoints.

    Reports from hosts carry the *incarnation* they were set up in; after a
    recovery, late reports of the old hosts are ignored. Its commits are fenced
    (``control.fencing``): each deployment takes a ``fence_token`` from the job's
    storage, and a controller whose token a newer deployment passed commits
    nothing and retires. Lifecycle follows its ``JobLifecycle``; ``stop()`` ends
    its tasks. Only its own event loop touches it.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        if args or kwargs:
            self._configure(*args, **kwargs)

    async def configure(self, *args: Any, **kwargs: Any) -> None:
        """A warm controller (started bare, see ``pool.py``) takes its job: the constructor's arguments."""
        self._configure(*args, **kwargs)

    async def ping(self) -> bool:
        return True

    def _configure(self, job_name: str, sinks: list[InstanceId], config: JobConfig,
                   view: JobView | None = None, broadcast: Tree | None = None,
                   placement: dict[InstanceId, int] | None = None, storage: CheckpointStorage | None = None,
                   sink_objects: dict[str, Sink] | None = None, next_checkpoint_id: int = 1,
                   source_objects: dict[str, Source] | None = None) -> None:
        self.job_name = job_name
        self.config = config
        self.lifecycle = JobLifecycle(sinks, config.max_restarts, config.restart_window_s)
        self.hosts: dict[int, ActorHandle] = {}
        self.checkpoints = CheckpointBook(job_name, config, storage, sink_objects or {}, source_objects or {},
                                          next_checkpoint_id, self.lifecycle, self._notify, self._checkpoints_taking)
        self.incarnation = 0
        self.side_controllers: dict[str, ActorHandle] = {}
        self._changed = asyncio.Event()
        self._monitor: asyncio.Task | None = None
        self._periodic: asyncio.Task | None = None
        self._first: asyncio.Task | None = None  # a restored job's first checkpoint
        self._checkpoint_op: str | None = None
        self._checkpoint_ops: dict[int, str] = {}  # checkpoint id -> its op, while it may still run
        self.stopping = False  # a stop is under way: only its final checkpoint may start
        self._steps = StepWatch(config.step_warning_s)
        self._init_ops("controller", view)
        self.injector: Injector[ActorHandle] = Injector(
            broadcast, placement or {}, lambda host: self.hosts[host], self._send, _schedule, _loop_time,
            functools.partial(ops_running, self.ops), config.control_batch_s)

    async def start(self, hosts: Hosts, incarnation: int = 0, restored: bool = False,
                    fence_token: int | None = None) -> None:
        """Run the job on ``hosts``; ``restored``: it started from another job's checkpoint; ``fence_token``:
        the one the deployment took (None: take the next one here)."""
        self.hosts = dict(hosts) if isinstance(hosts, dict) else dict(enumerate(hosts))
        self.incarnation = incarnation
        self.checkpoints.deployed(fence_token)
        loop = asyncio.get_running_loop()
        self._monitor = loop.create_task(self._watch_hosts(incarnation))
        self._start_timer()
        if self.stopping:
            return
        self._start_periodic()
        if restored and self.config.restore_checkpoint_s is not None and self._first is None:
            self._first = loop.create_task(self._checkpoint_after_restore(self.config.restore_checkpoint_s))

    # -- lifecycle ---------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        state = self.lifecycle.state
        if state in (JobState.FAILED, JobState.CANCELLED, JobState.RECOVERING):
            error = self.lifecycle.error or JobFailedError(
                f"job {self.job_name!r} is {state.value.lower()}: {self.lifecycle.recovery_reason}")
            self.ops.fail_all(error)
            self._ops_changed()
            for side in self.side_controllers.values():
                side.job_failed.remote(error)
            if state is not JobState.RECOVERING:
                for host in self.hosts.values():
                    host.abort.remote(self.config.run_id)  # the host may serve another job by the time it arrives

    def _current(self, incarnation: int) -> bool:
        return incarnation == self.incarnation and self.lifecycle.state is JobState.RUNNING

    async def instance_finished(self, operator: str, index: int, result: object, incarnation: int = 0) -> None:
        if not self._current(incarnation):
            return
        self.lifecycle.instance_finished((operator, index), result)
        if (operator, index) in self.lifecycle.results:
            self.ops.sinks_finished([(operator, index)])
            self._ops_changed()
            for side in self.side_controllers.values():
                side.sinks_finished.remote([(operator, index)])
        self._notify()

    async def instance_failed(self, operator: str, index: int, error: BaseException, incarnation: int = 0) -> None:
        if not self._current(incarnation):
            return
        reason = f"operator {operator!r} instance {index}: {error.__cause__!r}"
        self.lifecycle.lost(error, reason, recoverable=self.config.restart_on_operator_error)
        self._notify()

    async def host_error(self, host: int, reason: str, incarnation: int = 0) -> None:
        if not self._current(incarnation):
            return
        self.lifecycle.lost(JobFailedError(f"job {self.job_name!r}: {reason}"), reason)
        self._notify()

    async def cancel(self) -> LifecycleSnapshot:
        self.lifecycle.cancel()
        self._notify()
        return self.lifecycle.snapshot()

    async def wait(self, timeout: float | None) -> LifecycleSnapshot:
        """Return once terminal or after ``timeout`` seconds (None: no limit)."""
        return await self._wait_for(lambda: self.lifecycle.state.terminal, timeout)

    async def wait_event(self, timeout: float | None) -> LifecycleSnapshot:
        """Return once terminal or recovering (the supervisor's cue), or after ``timeout``."""
        return await self._wait_for(lambda: self.lifecycle.state is not JobState.RUNNING, timeout)

    async def _wait_for(self, condition: Callable[[], bool], timeout: float | None) -> LifecycleSnapshot:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not condition():
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

    async def results(self) -> dict[InstanceId, object]:
        return dict(self.lifecycle.results)

    async def stop(self) -> None:
        for task in (self._monitor, self._timer, self._periodic, self._first):
            if task is not None:
                task.cancel()

    async def _watch_hosts(self, incarnation: int) -> None:
        while self.incarnation == incarnation and self.lifecycle.state is JobState.RUNNING:
            await asyncio.sleep(self.config.poll_interval_s)
            for host_id, host in list(self.hosts.items()):
                if host_id not in self.hosts:  # retired by a rescale meanwhile
                    continue
                if self.incarnation != incarnation:
                    return
                try:
                    step = await asyncio.wait_for(host.liveness.remote(), timeout=self.config.liveness_timeout_s)
                except Exception as exc:
                    if self.hosts.get(host_id) is not host:  # retired by a rescale: gone on purpose
                        continue
                    await self.host_error(host_id, f"host {host_id} is unreachable: {exc!r}", incarnation)
                    return
                self._watch_step(host_id, step)

    def _watch_step(self, host_id: int, step: LongStep | None) -> None:
        """The watchdog (``StepWatch``): a step of operator code that runs long becomes an event."""
        event = self._steps.event(host_id, step)
        if event is not None:
            self.lifecycle.events.append(event)

    # -- recovery ----------------------------------------------------------------

    async def resume(self, hosts: Hosts, incarnation: int, checkpoint_id: int | None,
                     seconds: float, where: str | None = None, fence_token: int | None = None) -> None:
        """The supervisor re-created the hosts from ``checkpoint_id`` (``where``: that checkpoint in
        words, when it is not one of the job's own): run again, under ``fence_token`` (None: the next)."""
        self.incarnation = incarnation
        self.injector.reset()  # the old hosts' ops failed; new hosts' control inboxes start again at 0
        self._checkpoint_op = None
        self._checkpoint_ops.clear()  # the old hosts' checkpoints failed
        if checkpoint_id is not None and where is None:
            self.checkpoints.restarted_from(checkpoint_id)
        self.lifecycle.restarted(checkpoint_id, seconds, where)
        self.ops.finished_sinks.clear()
        if self._monitor is not None:
            self._monitor.cancel()
        await self.start(hosts, incarnation, fence_token=fence_token)
        self._notify()

    async def recovery_failed(self, error: BaseException, reason: str) -> None:
        """The supervisor could not restart the job: it fails."""
        self.lifecycle.fail(error, reason)
        self._notify()

    async def begin_recovery(self, reason: str, events: tuple[str, ...] = (), restarts: int = 0) -> None:
        """Roll the job back (the supervisor restarts its hosts), e.g. after the controller died.

        ``events`` and ``restarts``: the history of the controller this one replaces, kept, so that
        ``max_restarts`` bounds a job whose controller keeps dying.
        """
        self.lifecycle.inherit(events, restarts)
        self.lifecycle.lost(JobFailedError(f"job {self.job_name!r}: {reason}"), reason)
        self._notify()

    async def take_over_recovery(self, events: tuple[str, ...], restarts: int, reason: str) -> None:
        """Carry on the recovery that the controller this one replaces had begun (see ``Supervisor``)."""
        self.lifecycle.take_over_recovery(events, restarts, reason)
        self._notify()

    async def note(self, text: str) -> None:
        """Add an event to the job's history (the autoscaler's pauses, say)."""
        self.lifecycle.events.append(text)

    async def recovery_reason(self) -> str | None:
        return self.lifecycle.recovery_reason

    # -- checkpoints ---------------------------------------------------------------

    @property
    def fence_token(self) -> int:
        """This deployment's fence token (see ``control.fencing``); 0 until ``start`` or ``resume``."""
        return self.checkpoints.fence_token

    def commit_storage(self) -> CheckpointStore:
        """The storage a checkpoint commits through: fenced by this deployment's token."""
        return self.checkpoints.commit_storage()

    def _checkpoint_running(self) -> str | None:
        """The op id of the last checkpoint this controller started, while it still runs; else None."""
        running = self._checkpoint_op
        return running if running is not None and self.ops.runs[running].state is OpState.RUNNING else None

    async def begin_stop(self, timeout: float = 120.0) -> None:
        """A stop (``Job.stop``) is under way: no periodic or restore checkpoint starts from now on, and a
        running checkpoint ends first, so the stop's final checkpoint is the job's last: no later epoch
        is ever committed, and retention never deletes it."""
        self.stopping = True
        for task in (self._periodic, self._first):
            if task is not None:
                task.cancel()
        self._periodic = self._first = None
        running = self._checkpoint_running()
        if running is not None:
            try:
                await self.op_result(running, timeout)
            except Exception:  # it failed: the stop's checkpoint follows all the same
                pass

    async def cancel_stop(self) -> None:
        """The stop's final checkpoint failed and the job runs on: the sources it halted read on, and
        periodic checkpoints start again."""
        self.stopping = False
        if self.lifecycle.state is JobState.RUNNING:
            try:
                await self.op_result(await self.run_op(ResumeSources()), 60.0)
            except Exception as exc:  # a recovery meanwhile starts every source afresh
                self.lifecycle.events.append(f"stop cancelled: resuming the sources failed: {exc!r}")
        if self.lifecycle.state is JobState.RUNNING:
            self._start_periodic()

    async def checkpoint(self, final: bool = False, full: bool = False) -> str:
        """Start a checkpoint now; returns the op id (its result is the checkpoint id).

        Args:
            final: the last checkpoint of a stop (see :meth:`begin_stop`); any other is refused meanwhile.
            full: write every bin whole, not only what changed (a savepoint's: self-contained).
        """
        if self.checkpoints.storage is None:
            raise RuntimeError(f"job {self.job_name!r} has no checkpoint storage")
        if self.stopping and not final:
            raise RuntimeError(f"job {self.job_name!r} is stopping: its final checkpoint is the last")
        op = self.checkpoints.next_op(self.ops.view.operators, final, full)
        op_id = await self.run_op(op)
        self._checkpoint_op = self._checkpoint_ops[op.checkpoint_id] = op_id
        return op_id

    def _checkpoints_taking(self) -> set[int]:
        """The ids of this controller's checkpoints still running (those that ended are forgotten)."""
        for checkpoint_id, op_id in list(self._checkpoint_ops.items()):
            run = self.ops.runs.get(op_id)
            if run is None or run.state is not OpState.RUNNING:
                del self._checkpoint_ops[checkpoint_id]
        return set(self._checkpoint_ops)

    def _start_periodic(self) -> None:
        """Start the periodic checkpoints (``checkpoint_interval_s``), unless they run or are off."""
        if self.config.checkpoint_interval_s and self._periodic is None:
            self._periodic = asyncio.get_running_loop().create_task(
                self._checkpoint_periodically(self.config.checkpoint_interval_s))

    async def _checkpoint_periodically(self, interval: float) -> None:
        """Every ``interval`` seconds while the job runs, a checkpoint, unless the last one still runs."""
        timer = CheckpointTimer(interval, _loop_time)
        while not self.lifecycle.state.terminal:
            await asyncio.sleep(timer.wait_s())
            if timer.due(self.lifecycle.state, busy=self._checkpoint_running() is not None):
                try:
                    await self.checkpoint()
                except Exception:  # the job ended meanwhile; the loop condition stops us
                    pass
                timer.tried()

    async def _checkpoint_after_restore(self, delay: float) -> None:
        """A restored job's own first checkpoint, ``delay`` seconds in: until one completes, a recovery
        falls back to the checkpoint the job was restored from. Tried again after a failure (or a
        recovery) until one completes or the job ends, ``RESTORE_RETRY_S`` apart at least."""
        storage = self.checkpoints.storage
        assert storage is not None, "bug: a restored job without checkpoint storage"
        timer = CheckpointTimer(delay, _loop_time, retry_s=RESTORE_RETRY_S)
        while not self.lifecycle.state.terminal and not storage.committed():
            await asyncio.sleep(timer.wait_s())
            if not timer.due(self.lifecycle.state, busy=bool(storage.committed())):
                continue
            try:
                await self.op_result(await self.checkpoint(), None)
            except Exception:  # the job ended meanwhile; the loop decides
                pass
            timer.tried()

    # -- control ops ---------------------------------------------------------------

    async def add_sinks(self, instances: list[InstanceId], sinks: dict[str, Sink]) -> None:
        """A branch is being added (``job.add_branch``): the job finishes only once these sink instances have
        finished too, and its checkpoints commit these sinks' staged output."""
        self.lifecycle.add_sinks(instances)
        self.checkpoints.sinks.update(sinks)

    async def drop_sinks(self, instances: list[InstanceId], names: list[str]) -> None:
        """The branch of these sinks was not added after all (its op failed), or it was removed."""
        self.lifecycle.drop_sinks(instances)
        for name in names:
            self.checkpoints.sinks.pop(name, None)
        self._notify()

    async def register_controller(self, name: str, handle: ActorHandle) -> None:
        """Make a side controller known to every host (sinks return its ops to it)."""
        if name in self.side_controllers or name == self.ops.name:
            raise ValueError(f"job {self.job_name!r} already has a controller named {name!r}")
        run = self.config.run_id
        await asyncio.gather(*[h.add_controller.remote(name, handle, run) for h in self.hosts.values()])
        self.side_controllers[name] = handle
        handle.sinks_finished.remote(sorted(self.ops.finished_sinks))

    async def inject_many(self, messages: list[ControlMessage]) -> list[BaseException | None]:
        """``inject`` each message (a side controller's batch); returns once their injections left.

        Returns:
            Per message, None or the error that kept it from being injected.
        """
        errors: list[BaseException | None] = []
        for message in messages:
            try:
                await self.inject(message)
                errors.append(None)
            except Exception as exc:
                errors.append(exc)
        await self._until_injected()
        return errors

    async def _until_injected(self) -> None:
        """Wait until no injection is queued (at most a batch window and a call later).

        A caller that sends ops in batches with one call in flight (``actors.ophandle.OpSender``)
        waits here, so the ops it is given meanwhile go in its next call: one call per window
        rather than one per op.
        """
        if self.injector.idle:
            return
        waiter = asyncio.get_running_loop().create_future()
        self.injector.when_idle(lambda: None if waiter.done() else waiter.set_result(None))
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=self.config.control_batch_s + 1.0)
        except asyncio.TimeoutError:  # a host slow to take its call: the ops are queued all the same
            pass

    async def inject(self, message: ControlMessage) -> int:
        """Give ``message`` the next global sequence number and broadcast it to the sources."""
        if self.lifecycle.state is not JobState.RUNNING:
            why = self.lifecycle.error or self.lifecycle.recovery_reason
            raise JobFailedError(f"job {self.job_name!r} is {self.lifecycle.state.value}"
                                 f"{f' ({why})' if why else ''}: cannot start control op {message.op_id}")
        return self.injector.inject(message).seq  # no await before this: start + seq are atomic

    def _send(self, host: ActorHandle, parcel: Parcel, returned: Callable[[], None]) -> None:
        """The injector's call to ``host``: ``returned()`` once it returned or failed."""
        when_returned(host.receive.remote(parcel, self.config.run_id), lambda _: returned())

    async def set_hosts(self, hosts: dict[int, ActorHandle]) -> None:
        """A rescale added or retired hosts: watch (and inject into) these."""
        self.hosts = dict(hosts)

    async def run_op(self, op: ControlOp, op_id: str | None = None, view: JobView | None = None,
                     next_view: JobView | None = None) -> str:
        """Start ``op``; returns its id (wait with ``op_result``).

        A topology-changing op (a rescale step) runs with ``view`` (the old and
        new instances); ops injected after it see ``next_view``.
        """
        message = self._start(op, op_id, view)
        if next_view is not None:
            self.ops.view = next_view
        self._op_events[message.op_id] = asyncio.Event()
        try:
            await self.inject(message)
        except Exception as exc:
            self.ops.runs[message.op_id].fail(exc)
        self._ops_changed()
        return message.op_id

    async def run_ops(self, items: list[OpItem]) -> None:
        """Start each ``(op, op_id)`` in order (a driver's batch); returns once their injections left.

        An op that cannot start is reported by ``op_result``, as with ``run_op``.
        """
        for op, op_id in items:
            try:
                await self.run_op(op, op_id)
            except Exception:  # remembered in _start_errors by _start
                pass
        await self._until_injected()


def _loop_time() -> float:
    """The running event loop's clock (monotonic seconds)."""
    return asyncio.get_running_loop().time()


def _schedule(delay: float, callback: Callable[[], None]) -> None:
    """Run ``callback`` on the running event loop ``delay`` seconds from now (0: at its next turn)."""
    loop = asyncio.get_running_loop()
    if delay > 0:
        loop.call_later(delay, callback)
    else:
        loop.call_soon(callback)


JobController = ray.remote(num_cpus=0)(Controller)
"""The controller in an actor of its own."""
