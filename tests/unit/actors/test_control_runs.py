"""Control runs: one op on many channels into one instance, as one message, counted in one step.

A fan-in instance (a count with 24 input channels) is driven by hand: each
channel gets some data, then the op, then more data. The op comes either as
one envelope per channel or in control runs (split at random, some copies
as plain envelopes, some delivered twice, runs before or after the data
around them), so the two are compared on the same inputs. The oracle is the
cut itself: a blocking op completes having processed exactly the records
queued before it on every channel, whatever the path; a non-blocking op
completes having processed at least those.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.messages import ControlRun, Data, Envelope, Parcel
from chiray.control.message import Configs, ControlMessage
from chiray.control.ops import NoOp
from chiray.operators import Dataflow, from_items

SOURCES = 24


def _fan_in() -> tuple[LocalRun, object]:
    flow = Dataflow("fan_in")
    (flow.source(from_items([{"key": 1}], num_splits=SOURCES), parallelism=SOURCES, name="src")
         .key_by("key").count(parallelism=1, name="count").collect(name="out"))
    run = LocalRun(flow, JobConfig(num_hosts=2, placement={"src": [1] * SOURCES, "out": [1]}))
    return run, run.instance(("count", 0))


def _batch(rows: int) -> Data:
    return Data(pa.RecordBatch.from_pydict({"key": list(range(rows))}))


def _message(blocking: bool) -> ControlMessage:
    return ControlMessage("op", "NoOp", blocking, 0, "controller", NoOp(blocking=blocking), Configs())


def _deliveries(rng: random.Random, inst, message: ControlMessage, as_runs: bool) -> tuple[list[Parcel], int]:
    """Data before the op, the op, data after it, on every channel; returns (parcels, rows before)."""
    before_rows = 0
    envelopes: list[Envelope] = []
    copies: list[tuple[int, int, tuple]] = []  # (channel, seq, sender) of the op
    for i, ch in enumerate(inst.inputs):
        seq = 0
        for _ in range(rng.randint(0, 3)):
            rows = rng.randint(1, 5)
            before_rows += rows
            envelopes.append(Envelope(ch.channel, seq, _batch(rows), 0))
            seq += 1
        copies.append((ch.channel, seq, ("src", i)))
        for _ in range(rng.randint(0, 2)):
            envelopes.append(Envelope(ch.channel, seq + 1, _batch(rng.randint(1, 5)), 0))
            seq += 1
    parcels: list[Parcel] = []
    rng.shuffle(copies)
    if as_runs:
        while copies:
            k = rng.randint(1, len(copies))
            part, copies = copies[:k], copies[k:]
            if rng.random() < 0.2:  # some copies travel as plain envelopes
                envelopes.extend(Envelope(c, s, message.hop(sender, None)) for c, s, sender in part)
                continue
            run = ControlRun(("count", 0), message.hop(part[0][2], None), [c for c, _, _ in part],
                             [s for _, s, _ in part], [sender for _, _, sender in part])
            parcels.append(Parcel(runs=[run] * (2 if rng.random() < 0.2 else 1)))  # a re-run call
    else:
        envelopes.extend(Envelope(c, s, message.hop(sender, None)) for c, s, sender in copies)
    rng.shuffle(envelopes)
    while envelopes:
        k = rng.randint(1, len(envelopes))
        parcels.append(Parcel(envelopes=envelopes[:k]))
        envelopes = envelopes[k:]
    rng.shuffle(parcels)
    return parcels, before_rows


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_a_run_aligns_like_one_envelope_per_channel(blocking, seed):
    outcomes = []
    for as_runs in (False, True):
        rng = random.Random(seed)
        run, inst = _fan_in()
        host = run.hosts[0]
        message = _message(blocking)
        parcels, before_rows = _deliveries(rng, inst, message, as_runs)
        at_completion = None
        steps = 0
        pending = list(parcels)
        while pending or host.run_step():
            if pending and (not rng.randint(0, 2) or not host.run_step()):
                host.receive(pending.pop())
            steps += 1
            if at_completion is None and inst.control.completed:
                at_completion = inst.records_in
            assert steps < 10_000
        assert inst.control.completed == 1 and not inst.control.pending_ops
        assert not any(ch.blocked for ch in inst.inputs), "the op left an input blocked"
        if blocking:
            assert at_completion == before_rows, "a blocking op is a cut: exactly the records before it"
        else:
            assert at_completion >= before_rows
        outcomes.append((at_completion if blocking else None, inst.records_in))
    assert outcomes[0] == outcomes[1]


def test_copies_that_reach_an_instance_over_several_steps_of_its_senders_count_in_one_step():
    """Sources on the instance's own host forward an op one after another: the copies join one run."""
    from chiray.operators import generate

    flow = Dataflow("local_fan_in")
    (flow.source(generate(None, rate=0.01, batch_size=1, num_keys=4, key_type="int", num_splits=SOURCES),
                 parallelism=SOURCES, name="src")
         .key_by("key").count(parallelism=1, emit="updates", name="count").collect(name="out"))
    run = LocalRun(flow, JobConfig(num_hosts=1, control_fanout=4))
    sources = [run.instance(("src", i)) for i in range(SOURCES)]
    for _ in range(100_000):
        if not run.step_all() and all(s.records_in for s in sources):
            break
    count = run.instance(("count", 0))
    taken: list[int] = []
    original = count._take_run
    count._take_run = lambda r: (taken.append(len(r.channels)), original(r))[1]  # type: ignore[method-assign]
    op_run = run.run_control(NoOp(blocking=True))
    for _ in range(1000):
        if op_run.state.value != "RUNNING":
            break
        run.step_all()
    assert op_run.result == 1
    assert taken == [SOURCES]
