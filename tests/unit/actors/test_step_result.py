"""One instance's steps on a scripted input, each checked as the frozen value it returns to its host.

The instance is built as a host builds it (``LocalRun``) and fed envelopes by
hand on its one input channel; nothing else runs. The oracle is written out
by hand: the credit each data batch gives back, the op's message forwarded at
once on the output channel with the ack its handler made, the count per key
that a plain loop gives, and ``finished`` exactly once.
"""

from __future__ import annotations

import collections
import dataclasses

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.messages import Data, End, Envelope, Grant
from chiray.actors.runtime.stepresult import NO_SENDS, NOTHING, Ack, Sends, StepResult
from chiray.control.op import ControlOp, InstanceHandler
from chiray.operators import Dataflow, from_items


class AckingOp(ControlOp):
    """Every instance acknowledges the op directly with its name."""

    blocking = False

    class Instance(InstanceHandler):
        def on_complete(self, ctx):
            ctx.ack(("acked", ctx.instance))


def _instance():
    flow = Dataflow("steps")
    (flow.source(from_items([{"k": "a"}]), name="src").key_by("k").count(name="count").collect(name="out"))
    run = LocalRun(flow, JobConfig(num_hosts=2, placement={"src": [0], "count": [1], "out": [0]}))
    return run, run.instance(("count", 0))


def test_each_step_returns_what_it_produced_once():
    run, inst = _instance()
    ich = inst.inputs[0]
    och = inst.output_channels()[0]
    batches = [pa.RecordBatch.from_pylist([{"k": k} for k in keys]) for keys in (["a", "b", "a"], ["b", "c"])]
    for seq, batch in enumerate(batches):
        env = Envelope(ich.channel, seq, Data(batch), charge=batch.nbytes)
        ich.offer(env)
        inst.refresh_input(ich.channel)
        result = inst.step()
        assert isinstance(result, StepResult)
        assert result == StepResult(grants=(Grant(ich.channel, 1, batch.nbytes),)), result
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.finished = True  # type: ignore[misc]

    message = dataclasses.replace(run.ops.start(AckingOp()), seq=0)
    ich.offer(Envelope(ich.channel, 2, message))
    inst.refresh_input(ich.channel)
    result = inst.step()
    assert result.took_control and result.grants == () and not result.finished
    assert [(s.channel, s.seq, s.message.op_id) for s in result.control] == [(och.channel, 0, message.op_id)]
    assert result.acks == (Ack("controller", message.op_id, ("count", 0), ("acked", ("count", 0))),)
    assert inst.senders_ended([]) == StepResult(took_control=True), "what a step returned is forgotten"

    ich.offer(Envelope(ich.channel, 3, End()))
    inst.refresh_input(ich.channel)
    result = inst.step()
    assert result.finished and not result.control and not result.acks
    sent = och.drain()
    assert isinstance(sent[-1].message, End)
    counts = collections.Counter(k for b in batches for k in b.column("k").to_pylist())
    rows = [r for e in sent if isinstance(e.message, Data) for r in e.message.batch.to_pylist()]
    assert {r["k"]: r["count"] for r in rows} == dict(counts)
    assert not inst.runnable(0.0)


def test_sends_add_up_in_the_order_made_and_become_the_step_result():
    first, second = Ack("c", "op-1", ("m", 0), 1), Ack("c", "op-2", ("m", 0), 2, background=True)
    a, b = Sends(acks=(first,)), Sends(acks=(second,), finished=True)
    assert a + NO_SENDS is a and NO_SENDS + b is b, "adding nothing allocates nothing"
    total = a + b
    assert total.acks == (first, second) and total.finished and (b + a).acks == (second, first)
    grant = Grant(3, 1, 100)
    assert total.result((grant,), True) == StepResult(grants=(grant,), acks=(first, second), finished=True,
                                                      took_control=True)
    assert NO_SENDS.result((), False) is NOTHING
    assert NO_SENDS.result((grant,), False) == StepResult(grants=(grant,))
