"""ophandle.py: the driver's side of control ops: their handles, and the sender that batches them."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import ray

from chiray.control.op import ControlOp
from chiray.control.oprun import OpFailedError, OpState, OpTimeoutError
from chiray.operators.inflight import CallWindow, concat

from ..runtime.controller import controller_host

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["OpHandle", "OpSender", "OpAnswer"]

OpAnswer = tuple[str, object, "BaseException | None", float]
"""A controller's answer on an op: its ``OpState`` value, its result, its error, its elapsed seconds."""


class OpSender:
    """Sends a driver's ``run_control`` ops to one controller: one call in flight, the rest batched.

    A Ray call costs about a millisecond of CPU at each end, which at a hundred
    ops a second was most of what an op cost the controller and the driver. The
    controller answers a ``run_ops`` call once the batch's injections have left
    (within ``JobConfig.control_batch_s`` while other ops run), and the ops
    started meanwhile go together in the next call, in the order they were
    started. An op that finds no call in flight goes at once.

    An op that cannot be sent (it does not pickle) is reported to the
    controller, so its handle fails instead of waiting. Lifecycle:
    ``OPEN -> CLOSED`` (``close()``: what is queued is still sent, then the
    thread ends). The sending thread and ``submit`` touch ``_calls`` under
    ``_cond`` only.
    """

    def __init__(self, controller: ActorHandle, name: str):
        self._controller = controller
        self._name = name
        self._calls: CallWindow[str, list[tuple[ControlOp, str]]] = CallWindow(concat)  # one key: the controller
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.calls = 0

    def submit(self, op: ControlOp, op_id: str) -> None:
        """Queue ``op`` under ``op_id``; it leaves with the next call."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"control op {op_id}: the job's control sender is closed (the job ended)")
            self._calls.put(self._name, [(op, op_id)])
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"chiray-ops-{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Send what is queued, then stop. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._calls.take(self._name)
                while batch is None and not self._closed:
                    self._cond.wait()
                    batch = self._calls.take(self._name)
                if batch is None:
                    return
            self._send(batch)
            with self._cond:
                self._calls.returned(self._name)

    def _send(self, batch: list[tuple[ControlOp, str]]) -> None:
        try:
            ref = self._controller.run_ops.remote(batch)
        except Exception:  # one of them does not serialise: send one by one, report the ones that fail
            if len(batch) > 1:
                for item in batch:
                    self._send([item])
                return
            op, op_id = batch[0]
            try:
                self._controller.op_not_sent.remote(op_id, f"{type(op).__name__} could not be sent to the "
                                                           f"controller: {self._why_not_sent(op)}")
            except Exception:
                pass
            return
        self.calls += 1
        try:
            ray.get(ref, timeout=60)
        except Exception:  # a dead controller: the handles report it when they poll
            pass

    @staticmethod
    def _why_not_sent(op: object) -> str:
        try:
            ray.cloudpickle.dumps(op)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "unknown error"


class OpHandle:
    """A control op started with ``Job.run_control``.

    Attributes:
        op_id: the op's id.
        elapsed_s: once finished, how long the op took at its controller.
    """

    def __init__(self, op_id: str, controller: ActorHandle, timeout_s: float | None):
        self.op_id = op_id
        self._controller = controller
        self._timeout_s = timeout_s
        self._final: OpAnswer | None = None
        self.elapsed_s: float | None = None

    def _poll(self, timeout: float | None) -> OpAnswer:
        if self._final is None:
            try:
                state = ray.get(self._controller.op_result.remote(self.op_id, timeout))
            except ray.exceptions.RayActorError as exc:
                host = controller_host(self._controller)
                died = ("its controller died" if host is None else
                        f"host {host} died, and its controller with it (it ran there)")
                error = OpFailedError(f"control op {self.op_id} failed: {died}")
                state = ("FAILED", None, error, 0.0)
                error.__cause__ = exc
            if OpState(state[0]) is not OpState.RUNNING:
                self._final = state
                self.elapsed_s = state[3]
            return state
        return self._final

    def done(self) -> bool:
        """True once the op completed or failed."""
        return OpState(self._poll(0)[0]) is not OpState.RUNNING

    def progress(self) -> dict:
        """{"state", "waiting" (how many sinks are still to return it), "elapsed_s", "sinks_waiting" and
        "acks_waiting" (the instances still to return it, still to acknowledge it)}."""
        return ray.get(self._controller.op_progress.remote(self.op_id))

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the op and return its result (``on_complete``'s value).

        Args:
            timeout: seconds; None waits forever (the op's own timeout still applies), 0 polls.

        Raises:
            TimeoutError: still running after ``timeout``.
            OpTimeoutError: the op's own timeout passed.
            OpFailedError: the op failed (a handler raised, a host died, the job ended).
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be None (wait forever), 0 (poll) or positive, got {timeout}")
        raw, result, error, _ = self._poll(timeout)
        state = OpState(raw)
        if state is OpState.RUNNING:
            raise TimeoutError(f"control op {self.op_id} still running after {timeout} s")
        if state is OpState.FAILED:
            if isinstance(error, (OpFailedError, OpTimeoutError)):
                raise error
            raise OpFailedError(f"control op {self.op_id} failed: {error!r}") from error
        return result
