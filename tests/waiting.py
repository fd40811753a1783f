"""waiting.py: the suite's one way to wait on a condition across processes (no sleeps as synchronisation).

Every test that waits for Ray, Spark or a subprocess to reach a state calls
:func:`wait_for` with a deadline and says what it waited for, so a timeout
reads as the condition that never held (and, through ``detail``, what was
seen instead), not as a bare ``AssertionError``.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

__all__ = ["job_picture", "wait_for"]

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05,
             detail: Callable[[], object] | None = None) -> T:
    """Poll ``condition`` until it returns a truthy value; return that value.

    Args:
        condition: called until it returns something truthy (exceptions propagate).
        timeout: seconds before giving up (``None`` is not accepted: a test always has a deadline).
        what: the condition in words, for the error.
        interval: seconds between polls.
        detail: called once on timeout; its value is added to the error (what was seen instead).

    Raises:
        AssertionError: ``condition`` did not hold within ``timeout`` seconds.
        ValueError: ``timeout`` or ``interval`` is negative.
    """
    if timeout < 0 or interval < 0:
        raise ValueError(f"timeout and interval must not be negative, got {timeout} and {interval}")
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f"; saw {detail()!r}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{seen}")
        time.sleep(interval)


def job_picture(job) -> str:  # type: ignore[no-untyped-def]
    """What a running job looks like, for a ``wait_for`` ``detail``: each instance's records in and out,
    whether it finished, what it has queued and waits to send, and the job's last events."""
    try:
        stats = job.statistics().instances
        lines = [f"{s.operator}/{s.index}@{s.host} in={s.records_in} out={s.records_out} "
                 f"fin={s.finished} queued={s.queued_batches} pending={s.pending_out}" for s in stats]
    except Exception as exc:  # the picture must not hide the timeout it explains
        lines = [f"statistics: {exc!r}"]
    try:
        lines += list(job.status().events[-8:])
    except Exception as exc:
        lines.append(f"status: {exc!r}")
    return "\n".join(lines)
