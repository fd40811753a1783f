"""Work a host runs off its processing thread: at low priority where asked (``actors.runtime.background``)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from chiray.actors.runtime.background import LOW_PRIORITY_NICE, run_off_loop


def own_nice() -> tuple[str, int]:
    """The calling thread's name and nice value."""
    return threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread has a nice value of its own on Linux")
def test_work_of_low_priority_runs_in_a_thread_at_low_priority_and_other_work_at_the_processs():
    process_nice = os.getpriority(os.PRIO_PROCESS, 0)

    async def both() -> tuple[tuple[str, int], tuple[str, int]]:
        return await run_off_loop(own_nice, low_priority=True), await run_off_loop(own_nice)

    (low_thread, low), (usual_thread, usual) = asyncio.run(both())
    main = threading.current_thread().name
    assert low_thread != main and usual_thread != main, "the work ran on the event loop's thread"
    assert low == max(process_nice, LOW_PRIORITY_NICE)
    assert usual == process_nice
    assert os.getpriority(os.PRIO_PROCESS, 0) == process_nice, "the process's own priority changed"


def test_the_work_s_exception_reaches_the_caller():
    def fails() -> None:
        raise ValueError("injected")

    with pytest.raises(ValueError, match="injected"):
        asyncio.run(run_off_loop(fails, low_priority=True))
