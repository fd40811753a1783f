"""background.py: where a host runs work off its processing thread (a checkpoint's copying, encoding and writes).

Work goes to a thread, so the host's event loop goes on stepping its instances and taking calls. Work of
*low priority* (a checkpoint that writes the changes of its bins and copies none whole) goes to threads whose
own nice value is ``LOW_PRIORITY_NICE`` (Linux: each thread has one): the kernel runs them in the time the
operators, the Ray calls between hosts and the other processes of the node leave. At the operators'
priority, such a thread takes a core from them while it runs, and on a busy node the calls between hosts
wait: at 8M keys and 200,000 records/s, a checkpoint a second (the checkpoint benchmark's windows), the
median call from one host to the other took 15-25 ms while a checkpoint copied and encoded its changes,
against 10 ms otherwise.

Measured there, seven pairs of runs in turn over two days, the copying and encoding of every checkpoint at
nice 19 against at the operators' priority: the latency p99 of the records ingested outside full copies was
97-150 ms against 81-214 ms, lower in six of the seven pairs; checkpoints took no longer (p50 231-353 ms
against 241-378 ms). Full copies stay at the operators' priority: a node kept busy by other work gives a
thread at nice 19 about 1.5 % of a core (the kernel weighs nice 19 against 0 as 15 to 1024), which would
stretch a full copy of millions of rows to tens of seconds; the changes of a second are a few tens of
milliseconds of work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import threading
from typing import Callable, TypeVar

__all__ = ["LOW_PRIORITY_NICE", "run_off_loop", "low_priority_threads"]

T = TypeVar("T")

LOW_PRIORITY_NICE = 19
"""The nice value of the threads that run a host's work of low priority (Linux; elsewhere they keep the
process's)."""

LOW_PRIORITY_THREADS = 8
"""At most this many such threads at once. Work that waits for earlier work (a checkpoint's write for the
files it builds on) only waits for work started before it, so the threads, taken in order, never wait for
each other in a cycle."""

_low_priority: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()


def low_priority_threads() -> concurrent.futures.ThreadPoolExecutor:
    """This process's threads for work of low priority, started on first use."""
    global _low_priority
    with _lock:
        if _low_priority is None:
            _low_priority = concurrent.futures.ThreadPoolExecutor(
                LOW_PRIORITY_THREADS, thread_name_prefix="chiray-low-priority", initializer=_lower_own_priority)
        return _low_priority


def _lower_own_priority() -> None:
    """Give the calling thread ``LOW_PRIORITY_NICE`` (on Linux a thread id names a thread; elsewhere it would
    name the process, which must keep its priority)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):  # a sandbox may refuse it: the work still runs, at the usual priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOW_PRIORITY_NICE)


async def run_off_loop(work: Callable[[], T], low_priority: bool = False) -> T:
    """Run ``work()`` in a thread, at low priority if asked; its result (or its exception)."""
    if low_priority:
        return await asyncio.get_running_loop().run_in_executor(low_priority_threads(), work)
    return await asyncio.to_thread(work)
