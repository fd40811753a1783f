"""ophandle.py: the driver's handle on a running control op."""

from __future__ import annotations

from typing import Any

import ray

from control.oprun import OpFailedError, OpTimeoutError

__all__ = ["OpHandle"]


class OpHandle:
    """A control op started with ``Job.run_control``.

    Attributes:
        op_id: the op's id.
        elapsed_s: once finished, how long the op took at its controller.
    """

    def __init__(self, op_id: str, controller: Any, timeout_s: float | None):
        self.op_id = op_id
        self._controller = controller
        self._timeout_s = timeout_s
        self._final: tuple[str, Any, BaseException | None, float] | None = None
        self.elapsed_s: float | None = None

    def _poll(self, timeout: float | None) -> tuple[str, Any, BaseException | None, float]:
        if self._final is None:
            try:
                state = ray.get(self._controller.op_result.remote(self.op_id, timeout))
            except ray.exceptions.RayActorError as exc:
                error = OpFailedError(f"control op {self.op_id} failed: its controller died")
                state = ("FAILED", None, error, 0.0)
                error.__cause__ = exc
            if state[0] != "RUNNING":
                self._final = state
                self.elapsed_s = state[3]
            return state
        return self._final

    def done(self) -> bool:
        """True once the op completed or failed."""
        return self._poll(0)[0] != "RUNNING"

    def progress(self) -> dict:
        """{"state", "waiting" (sinks still to return), "elapsed_s"}."""
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
        state, result, error, _ = self._poll(timeout)
        if state == "RUNNING":
            raise TimeoutError(f"control op {self.op_id} still running after {timeout} s")
        if state == "FAILED":
            if isinstance(error, (OpFailedError, OpTimeoutError)):
                raise error
            raise OpFailedError(f"control op {self.op_id} failed: {error!r}") from error
        return result
