"""An instance's input and output sides alone (``inputs.py``, ``outputs.py``), on hand-made channels.

The oracles are written out by hand: ready inputs take turns in round-robin
order and a blocked one is skipped; a completed op goes at once (a
``ControlSend`` with the channel's next sequence number) on a channel with no
data waiting for credit and is queued behind the data on one that has some; a
sink (no outputs) returns it to the controller; an op's extra edge from this
instance becomes an extra send.
"""

from __future__ import annotations

import pyarrow as pa

from chiray.actors.runtime.channel import InputChannel, OutputChannel
from chiray.actors.runtime.inputs import InstanceInputs
from chiray.actors.runtime.messages import Data, Envelope
from chiray.actors.runtime.outputs import InstanceOutputs
from chiray.actors.runtime.router import ForwardRouter
from chiray.actors.runtime.statistics import InstanceCounters
from chiray.actors.runtime.stepresult import NO_SENDS, ControlSend
from chiray.control.message import CONTROLLER, Configs, ControlMessage
from chiray.control.ops import NoOp
from chiray.control.processor import Completion
from chiray.operators.logic import InstanceInfo

INFO = InstanceInfo("m", 0, 1, 0)


def _batch(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"x": i} for i in range(n)])


def _message(extra_edges=()) -> ControlMessage:
    return ControlMessage("op-1", "NoOp", False, 0, "controller", NoOp(blocking=False), Configs(),
                          extra_edges=extra_edges)


def test_ready_inputs_take_turns_and_a_blocked_one_waits():
    channels = [InputChannel(10 + i, i) for i in range(3)]
    inputs = InstanceInputs(INFO, channels)
    for ch in channels:
        for seq in range(2):
            ch.offer(Envelope(ch.channel, seq, Data(_batch(1))))
        assert inputs.refresh(ch.channel)
    assert not inputs.refresh(99), "no input of this instance"
    channels[1].blocked = True
    inputs.refresh(11)
    taken = []
    while inputs.has_ready():
        env, ich = inputs.take()
        taken.append((ich.channel, env.seq))
    assert taken == [(10, 0), (12, 0), (10, 1), (12, 1)]
    inputs.set_blocked(11, False)
    assert [(ich.channel, env.seq) for env, ich in (inputs.take(), inputs.take())] == [(11, 0), (11, 1)]
    assert not inputs.has_ready()


def test_a_completed_op_goes_at_once_where_nothing_waits_and_behind_data_elsewhere():
    free, busy = OutputChannel(1, 1, 1 << 20), OutputChannel(2, 1, 1 << 20)
    counters = InstanceCounters()
    outputs = InstanceOutputs(INFO, [[free], [busy]], [ForwardRouter(), ForwardRouter()], [[("a", 0)], [("b", 0)]],
                              counters)
    busy.enqueue(Data(_batch(3)))
    busy.enqueue(Data(_batch(2)))
    busy.drain()  # credit for one batch: the second waits
    assert busy.pending and not free.pending
    message = _message(extra_edges=((("m", 0), ("z", 1)), (("q", 0), ("z", 2))))
    sends = outputs.forward(Completion(message, {("a", 0): "for-a"}, "default"))
    assert sends.control == (ControlSend(1, 0, message, "for-a"),)
    assert [type(m).__name__ for m in busy.pending] == ["Data", "ControlMessage"]
    assert busy.pending[-1].payload == "default" and busy.pending[-1].sender == ("m", 0)
    assert [(target, m.sender, m.payload) for target, m in sends.extra] == [(("z", 1), ("m", 0), "default")]
    assert sends.returns == () and not sends.finished


def test_a_sink_returns_a_completed_op_to_the_controller_and_emit_counts_what_it_routes():
    outputs = InstanceOutputs(INFO, [], [], [], InstanceCounters())
    message = _message()
    sends = outputs.forward(Completion(message, {CONTROLLER: "result"}))
    assert [(r.op_id, r.instances, r.payload) for r in sends.returns] == [("op-1", (("m", 0),), {("m", 0): "result"})]
    assert sends.control == () and sends.extra == ()

    counters = InstanceCounters()
    out = OutputChannel(5, 8, 1 << 20)
    emitting = InstanceOutputs(INFO, [[out]], [ForwardRouter()], [[("k", 0)]], counters)
    emitting.emit([_batch(4), _batch(0), _batch(2)])
    assert (counters.records_out, counters.batches_out) == (6, 2), "an empty batch is not sent"
    assert [e.message.batch.num_rows for e in out.drain()] == [4, 2]
    assert emitting.forward(Completion(message, {})) is not NO_SENDS
