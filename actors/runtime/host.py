"""host.py: the ``OperatorHost`` Ray actor, a thin async shell around ``mailbox.HostCore``.

One asyncio event loop and one thread of operator code per host (Chi's
single-threaded operator): ``receive()`` only enqueues and wakes the run
loop; the run loop lets one runnable instance process one message, sends what
it produced (``transport.py``), and yields to the event loop between messages
so deliveries keep flowing.

Sources fed from outside the dataflow get messages through ``to_reader``
(on the loop, answered by the reader) and ``feed_reader`` (bulk data: queued
from a thread of its own and answered at once, so the sender never waits for
a long step of operator code; the loop hands the queue to the readers).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import inspect
import logging
import os
import time
import traceback
from typing import Callable, cast

import pyarrow as pa
import ray
from ray.actor import ActorHandle

from chiray.control.message import InstanceId
from chiray.operators import rowcapture
from chiray.operators.endpoints import SinkLogic, SourceLogic
from chiray.operators.graph import PhysicalPlan

from ..config import JobConfig
from .controller import Controller
from ..errors import OperatorError, portable
from .instance import OperatorFailure
from .lifecycle import HostLifecycle
from .mailbox import HostCore, LongStep
from .messages import Parcel
from .restore import RestoreInfo
from .topology import ChangePrepared
from .transport import Transport

__all__ = ["OperatorHost"]

log = logging.getLogger(__name__)

STEP_BUDGET = 64
STEP_BUDGET_S = 0.002
"""The loop takes up to this many steps (or this long) before it sends and yields to deliveries."""

RECYCLE_WAIT_S = 2.0
"""How long :meth:`OperatorHost.recycle` waits for the host's loop to stop (a step of user code runs on)."""

SPARE_HOST_ID = -1
"""The id of a host started before its job knew it (a spare or warm host; it takes its id at setup)."""

CONTROL_STEP_BUDGET = 4096
"""Steps that only take control messages do not count against the budget above, up to this many a
round: an op injected at hundreds of sources of one host is forwarded in one round, so its messages
to each peer leave in one call."""


CONTROLLER_CONCURRENCY = 1000
"""Calls the controller hosted here may have under way at once (long polls among them)."""

STATISTICS_WAIT_S = 0.2
"""How long :meth:`OperatorHost.statistics` waits for the loop to be between steps before it answers with the
snapshot taken last (a long step of user code is running)."""

STATISTICS_REFRESH_S = 0.5
"""The loop takes a statistics snapshot at least this often while it runs, so the one a long step leaves
is at most this much older than the step."""


def use_memory_pool(name: str | None) -> None:
    """Allocate this process's Arrow buffers from pool ``name`` from now on (see ``JobConfig.memory_pool``)."""
    if name is None:
        return
    try:
        pool = {"jemalloc": pa.jemalloc_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
                "system": pa.system_memory_pool}[name]()
    except NotImplementedError:  # this pyarrow was built without it
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)


def _freeze_heap() -> None:
    """Leave every object alive now (modules, classes, functions, the operators' code and state objects) out of
    the cyclic collector's passes (``gc.freeze``), at the end of a host's setup.

    A full pass walks every object the collector tracks, with the interpreter held: in a host holding 4M keys
    of a count (126,000 objects tracked), 107-125 ms, a stall of every instance there and of every call it
    answers; with those objects frozen, 0.02 ms. Such passes are rare (in traced runs of the checkpoint
    benchmark, one per host as it restores and at most one in its windows), but each was among its job's
    longest stalls. A recycled host unfreezes them (:meth:`OperatorHost.recycle`): its next job's setup
    freezes what that job holds.
    """
    gc.freeze()


@ray.remote(concurrency_groups={"feed": 1, "control": CONTROLLER_CONCURRENCY,  # type: ignore[call-overload]
                                "liveness": 1, "statistics": 1})
class OperatorHost:
    """Hosts operator instances of one job (the Orleans "silo"; instances are its grains).

    Lifecycle: ``CREATED --setup()--> READY --start()--> RUNNING --> DONE | FAILED | ABORTED``.
    """

    def __init__(self, host_id: int, job_name: str):
        self.host_id = host_id
        self.job_name = job_name
        self.run: str | None = None  # the job life (``JobConfig.run_id``) this host serves, from setup on
        self.core: HostCore | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._lifecycle = HostLifecycle.RUNNING  # its run loop: STOPPED once aborted or failed
        self._background: set[asyncio.Task] = set()
        self._feed: collections.deque[tuple[str, int, str, object]] = collections.deque()  # see feed_reader
        self._loop: asyncio.AbstractEventLoop | None = None
        self._controller: Controller | None = None  # the job's controller, where it runs here
        self._statistics: list = []  # the last snapshot the loop took (see statistics())
        self._statistics_at = 0.0  # when (time.monotonic())

    async def setup(self, plan: PhysicalPlan, placement: dict[InstanceId, int], config: JobConfig,
                    peers: dict[int, ActorHandle], controller: ActorHandle, restore: RestoreInfo | None = None,
                    incarnation: int = 0,
                    host_id: int | None = None) -> OperatorError | None:
        """Build this host's instances (from a checkpoint if ``restore``); returns a user constructor's error.

        ``host_id`` names a spare host (started before its id was known) at its setup.
        """
        if host_id is not None:
            self.host_id = host_id
        self._loop = asyncio.get_running_loop()
        use_memory_pool(config.memory_pool)
        self.run = config.run_id
        self.controller = controller
        self.incarnation = incarnation
        self.controllers = {"controller": controller}
        self.transport = Transport(peers, self._peer_failed, self.controllers, run=self.run)
        try:
            self.core = HostCore(self.host_id, plan, placement, config, restore)
        except OperatorFailure as failure:
            return self._operator_error(failure)
        self._statistics = self.core.statistics()
        _freeze_heap()
        return None

    @ray.method(concurrency_group="control")
    async def controller_call(self, method: str, args: tuple, kwargs: dict, run: str | None = None) -> object:
        """Run the job controller's ``method`` here (``"configure"`` creates it); see ``HostedController``.

        On an event loop and thread of their own, so the controller answers while this host's loop
        runs operator code (they share only the interpreter). A call for another job life ``run`` (this
        host was recycled since) is refused.
        """
        if run is not None and run != self.run:
            raise RuntimeError(f"host {self.host_id} runs no controller of job life {run} (it serves {self.run})")
        if method == "configure":
            self._controller = Controller()
        if self._controller is None:
            raise RuntimeError(f"host {self.host_id} runs no job controller (called {method!r})")
        result = getattr(self._controller, method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def receive(self, parcel: Parcel, run: str | None = None) -> None:
        """What another host or a controller of job life ``run`` sent: envelopes, credit, control traffic
        (``Parcel``). A parcel of another life (sent to this host before a warm pool gave it to another
        job: see :meth:`recycle`) is dropped."""
        if run is not None and run != self.run:
            log.debug("host %s: dropped a parcel of job life %s (this host serves %s)", self.host_id, run, self.run)
            return
        assert self.core is not None, "bug: receive() before setup()"
        self.core.receive(parcel)
        self._wake.set()

    async def to_reader(self, operator: str, index: int, split_id: str, message: object) -> object:
        """Hand ``message`` to the reader of split ``split_id`` of source instance ``(operator, index)`` here.

        For sources fed from outside the dataflow (``SplitReader.receive``, which
        only records and answers: this runs between two steps of operator code,
        after the messages queued by ``feed_reader`` before it). Returns the
        reader's answer, or ``None`` where no such reader is open here (not
        opened yet, finished, or the instance is not on this host).
        """
        self._take_feed()
        answer = self._to_reader(operator, index, split_id, message)
        self._wake.set()
        return answer

    @ray.method(concurrency_group="feed")
    async def feed_reader(self, operator: str, index: int, split_id: str, message: object) -> bool:
        """Queue ``message`` for the reader of split ``split_id`` of source instance ``(operator, index)``.

        Answers ``True`` at once, from a thread of its own: the sender (bulk
        data, whose answer it does not need) never waits for a step of
        operator code. The loop hands queued messages to their readers in
        arrival order, before its next step and before any later
        ``to_reader`` call; one for a reader that is not open here is dropped.
        """
        self._feed.append((operator, index, split_id, message))
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        return True

    def _to_reader(self, operator: str, index: int, split_id: str, message: object) -> object:
        inst = self.core.by_name.get((operator, index)) if self.core is not None else None
        logic = getattr(inst, "logic", None)
        if not isinstance(logic, SourceLogic):
            return None
        try:
            return logic.receive(split_id, message)
        except LookupError:
            return None

    def _take_feed(self) -> None:
        """Hand the messages ``feed_reader`` queued to their readers, in arrival order (on the loop)."""
        while self._feed:
            operator, index, split_id, message = self._feed.popleft()
            try:
                self._to_reader(operator, index, split_id, message)
            except Exception:  # a reader's bug: what depends on the message (a commit) fails with a clear error
                log.exception("host %s: the reader of %s[%s] %s refused a message", self.host_id, operator,
                              index, split_id)

    async def prepare_change(self, op_id: str, plan: PhysicalPlan, placement: dict[InstanceId, int],
                             peers: dict[int, ActorHandle]) -> ChangePrepared:
        """A rescale: op ``op_id`` will change the topology to ``plan`` (see ``topology.py``); returns
        what this host did (a ``ChangePrepared``)."""
        self.transport.peers.update(peers)
        try:
            prepared = self.core.prepare_change(op_id, plan, placement)  # type: ignore[union-attr]
        except OperatorFailure as failure:  # a new instance's constructor raised
            raise self._operator_error(failure) from None
        self._wake.set()
        return prepared

    async def forget_peers(self, host_ids: list) -> None:
        """Hosts retired by a rescale: drop what would still go to them (credit, end notices)."""
        self.transport.forget(host_ids)

    async def is_done(self) -> bool:
        """Every instance here finished and its output left (a retired host may go)."""
        return self.core is not None and self.core.done and self.transport.idle

    async def add_controller(self, name: str, handle: ActorHandle, run: str | None = None) -> None:
        """A side controller: sinks return its ops to it. A call for another job life ``run`` is ignored (see
        :meth:`abort`)."""
        if run is not None and run != self.run:
            return
        self.controllers[name] = handle

    @ray.method(concurrency_group="liveness")
    async def ping(self) -> int:
        return self.host_id

    @ray.method(concurrency_group="liveness")
    async def liveness(self) -> LongStep | None:
        """The controller's liveness check, answered from a thread of its own, so a long step of user code
        neither looks like a dead host nor delays the answer: the step running now (``HostCore.long_step``)."""
        return self.core.long_step() if self.core is not None else None

    async def node_id(self) -> str:
        """The Ray node this host runs on."""
        return ray.get_runtime_context().get_node_id()

    async def pid(self) -> int:
        """The host's process id (for tooling that measures memory)."""
        return os.getpid()

    @ray.method(concurrency_group="statistics")
    async def statistics(self) -> list:
        """Each instance's ``InstanceStatistics``, from a thread of its own so that a long step of user code
        never holds the answer up: taken by the loop between two steps if it gets there within
        ``STATISTICS_WAIT_S``, else the snapshot it took last (as old as the step running now)."""
        loop = self._loop
        if self.core is None or loop is None:
            return []
        taken = asyncio.run_coroutine_threadsafe(self._take_statistics(), loop)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(taken)), STATISTICS_WAIT_S)
        except asyncio.TimeoutError:  # the snapshot is taken all the same, once the step ends
            return self._statistics

    async def _take_statistics(self) -> list:
        """On the loop, between two steps: a new snapshot (kept for :meth:`statistics`)."""
        self._statistics = self.core.statistics() if self.core is not None else []
        self._statistics_at = time.monotonic()
        return self._statistics

    async def tail(self, operator: str, n: int) -> list:
        """The newest ``n`` rows (at most) that reached each instance of sink ``operator`` here, as
        ``(arrival time, batch)`` (``job.tail``)."""
        instances = self.core.instances if self.core is not None else []
        return [part for inst in instances if inst.info.operator == operator and isinstance(inst.logic, SinkLogic)
                for part in inst.logic.recent.last(n)]

    async def abort(self, run: str | None = None) -> None:
        """Stop the loop and abort unfinished sinks. Idempotent.

        A call for another job life ``run`` is ignored. A job's controller sends its aborts on its own when the
        job fails or is cancelled, and nothing orders them with the driver's calls: one may arrive after the
        driver recycled this host (:meth:`recycle`) and gave it to the next job, whose loop it would stop.
        """
        if run is not None and run != self.run:
            log.debug("host %s: ignored an abort of job life %s (this host serves %s)", self.host_id, run, self.run)
            return
        self._lifecycle = self._lifecycle.stop()
        self._wake.set()
        if self.core is not None:
            self.transport.close()
            self.core.close()

    async def recycle(self) -> bool:
        """End this host's part in its job and make it a bare host again, as if just started (the warm
        pool hands it to the next job: a process start is most of a short job's cost). Its loop stops,
        its instances close (unfinished sinks abort), a job controller running here stops, and parcels
        still in flight from the old job are dropped when they arrive (see :meth:`receive`).

        Returns:
            False if the host cannot be reused (its loop did not stop in time): kill it.
        """
        await self.abort()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), RECYCLE_WAIT_S)
            except Exception:
                return False
        for task in list(self._background):
            task.cancel()
        if self._controller is not None:
            await self._controller.stop()
        self.__init__(SPARE_HOST_ID, "")  # type: ignore[misc]
        gc.unfreeze()  # what the last job's setup froze may be garbage now
        gc.collect()
        return True

    def _peer_failed(self, host: int, exc: BaseException) -> None:
        if not self._lifecycle.stopped:
            self.controller.host_error.remote(
                host, f"a call from host {self.host_id} to host {host} failed: {exc}", self.incarnation)

    async def _run(self) -> None:
        core = self.core
        assert core is not None
        # start() answers first: its reply is queued behind this task's first step, and a step of user code
        # can be long (a source and its consumers on one host have work at once, as a warm host's do)
        await asyncio.sleep(0)
        rowcapture.FOREGROUND.busy()
        try:
            await self._steps(core)
        finally:
            rowcapture.FOREGROUND.idle()  # a stopped host holds no background work up

    async def _steps(self, core: HostCore) -> None:
        while not self._lifecycle.stopped:
            self._wake.clear()
            self._take_feed()
            try:
                progressed = self._run_some(core)
            except OperatorFailure as failure:
                self._report_failure(failure)
                return
            except Exception:
                self._lifecycle = self._lifecycle.stop()
                self.controller.host_error.remote(
                    self.host_id, f"bug in host {self.host_id}: {traceback.format_exc()}", self.incarnation)
                log.exception("host %s failed", self.host_id)
                return
            self._report_finished()
            if time.monotonic() - self._statistics_at > STATISTICS_REFRESH_S:
                await self._take_statistics()
            outbox = core.take_outbox()
            if outbox:
                self.transport.send(outbox)
                for ack in outbox.acks:
                    self._send_ack(ack.origin, ack.op_id, ack.instance, ack.payload, ack.background)
            if progressed:
                await asyncio.sleep(0)
                continue
            await self._idle(core.next_wakeup())

    @staticmethod
    def _run_some(core: HostCore) -> bool:
        """Steps until nothing is runnable or the budget is spent, so sends to a peer share one call."""
        deadline = time.perf_counter() + STEP_BUDGET_S
        progressed = False
        steps = control_steps = 0
        while steps < STEP_BUDGET and control_steps < CONTROL_STEP_BUDGET:
            if not core.run_step():
                break
            progressed = True
            if core.took_control:
                control_steps += 1
                continue
            steps += 1
            if time.perf_counter() > deadline:
                break
        return progressed

    async def _idle(self, wake_at: float | None) -> None:
        timeout = None if wake_at is None else max(0.0, wake_at - time.monotonic())
        rowcapture.FOREGROUND.idle()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            rowcapture.FOREGROUND.busy()

    def _report_finished(self) -> None:
        for inst in self.core.take_finished():  # type: ignore[union-attr]
            self.controller.instance_finished.remote(inst.info.operator, inst.info.index, inst.sink_result(),
                                                     self.incarnation)

    def _send_ack(self, origin: str, op_id: str, instance: InstanceId, payload: object, background: bool) -> None:
        if background:
            work = cast(Callable[[], object], payload)  # a background ack's payload is the work that makes it
            task = asyncio.ensure_future(self._background_ack(origin, op_id, instance, work))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        handle = self.controllers.get(origin)
        if handle is not None:
            handle.op_ack.remote(op_id, instance, payload)

    async def _background_ack(self, origin: str, op_id: str, instance: InstanceId,
                              work: Callable[[], object]) -> None:
        try:
            payload = await asyncio.to_thread(work)
        except Exception as exc:  # reported to the op, which fails with it
            payload = portable(exc)
        self._send_ack(origin, op_id, instance, payload, False)

    @staticmethod
    def _operator_error(failure: OperatorFailure) -> OperatorError:
        cause = failure.cause
        tb = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
        return OperatorError(failure.info.operator, failure.info.index, portable(cause), tb)

    def _report_failure(self, failure: OperatorFailure) -> None:
        self._lifecycle = self._lifecycle.stop()
        error = self._operator_error(failure)
        self.controller.instance_failed.remote(failure.info.operator, failure.info.index, error, self.incarnation)
        if self.core is not None:
            self.core.close()
