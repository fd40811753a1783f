"""A dataflow that captures something unpicklable is refused at submit, naming the operator and the object."""

from __future__ import annotations

import threading

import pytest

import chiray
from chiray.operators import Dataflow, Sink, SinkWriter, from_items
from chiray.operators.pickling import UnpicklableError, check_picklable, find_unpicklable

LOCK = threading.Lock()


def test_a_captured_lock_is_found_by_name_through_the_closure():
    lock = threading.Lock()
    path, part, error = find_unpicklable(lambda b: (lock, b))
    assert path == "closure variable 'lock'" and part is lock and "pickle" in str(error)
    table = {"nested": [1, lock]}
    path, part, _ = find_unpicklable(lambda b: table)
    assert path == "closure variable 'table' -> item 'nested' -> item 1" and part is lock
    assert find_unpicklable(lambda b: b) is None


def test_submit_refuses_a_map_over_a_global_lock_naming_operator_and_object_first():
    flow = Dataflow("locked")
    flow.source(from_items([{"k": 1}]), name="src").map(lambda b: (LOCK, b)[1], name="guarded").collect(name="out")
    with pytest.raises(UnpicklableError) as info:
        chiray.submit(flow)
    message = str(info.value)
    assert message.startswith("operator 'guarded' (")
    assert "global 'LOCK', a _thread.lock, which cannot be pickled" in message
    assert len(message) < 600  # not the plan's repr


class _ConnectionSink(Sink):
    def __init__(self) -> None:
        self.connection = threading.Condition()  # made at build time: the mistake (say, a client's lock)

    def create_writer(self, info: object) -> SinkWriter:  # pragma: no cover - never reached
        raise AssertionError


def test_a_sink_holding_a_connection_is_named_with_the_attribute():
    flow = Dataflow("client-sink")
    flow.source(from_items([{"k": 1}]), name="src").sink(_ConnectionSink(), name="client")
    with pytest.raises(UnpicklableError, match=r"operator 'client' \(_ConnectionSink\): its sink refers to attribute 'connection' "
                                               r"-> attribute '_lock', a _thread.RLock"):
        check_picklable(flow.graph)
