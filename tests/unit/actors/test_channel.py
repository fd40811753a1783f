"""Channel unit tests without Ray: ordering, duplicates, credit accounting."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from chiray.actors.runtime.channel import ChannelError, InputChannel, OutputChannel, WouldBlock
from chiray.actors.runtime.messages import Data, End, Envelope


def _batch(i: int, rows: int = 3) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"x": [i] * rows})


def _pump(out: OutputChannel, inp: InputChannel, rng: random.Random, messages: list) -> list:
    """Send every message through the pair with shuffled, duplicated delivery; return what comes out."""
    for m in messages:
        out.enqueue(m)
    in_flight: list = []
    received: list = []
    while out.pending or in_flight or inp.queue:
        in_flight.extend(out.drain())
        rng.shuffle(in_flight)
        for env in in_flight[: rng.randint(0, len(in_flight))]:
            inp.offer(env)
            if rng.random() < 0.3:
                inp.offer(env)  # a duplicated delivery (a retried Ray call)
            in_flight.remove(env)
        while inp.ready():
            env = inp.take()
            received.append(env.message)
            grant = inp.grant_for(env)
            if grant is not None:
                out.grant(grant.batches, grant.nbytes)
            assert out.credit_batches >= 0 and out.credit_bytes >= 0
    return received


@pytest.mark.parametrize("seed", range(20))
def test_shuffled_and_duplicated_deliveries_come_out_once_in_order(seed):
    rng = random.Random(seed)
    out = OutputChannel(7, capacity_batches=rng.randint(1, 6), capacity_bytes=1 << 20)
    inp = InputChannel(7, input_index=0)
    messages = [Data(_batch(i)) for i in range(rng.randint(0, 60))] + [End()]
    received = _pump(out, inp, rng, messages)
    assert received == messages  # the oracle: the sequence that was sent
    assert out.credit_batches == out.capacity_batches
    assert out.credit_bytes == out.capacity_bytes


def _send(out: OutputChannel, message) -> Envelope:
    """Send one message that has credit now (as the instance does: enqueue, then drain)."""
    out.enqueue(message)
    [env] = out.drain()
    return env


def test_credit_never_negative_and_sender_without_credit_blocks():
    out = OutputChannel(1, capacity_batches=2, capacity_bytes=1 << 20)
    e0 = _send(out, Data(_batch(0)))
    e1 = _send(out, Data(_batch(1)))
    assert (e0.seq, e1.seq) == (0, 1)
    assert out.credit_batches == 0
    out.enqueue(Data(_batch(2)))
    assert out.pending and out.drain() == []  # no credit: it waits, the sender is not runnable
    out.grant(1, e0.charge)
    [e2] = out.drain()
    assert e2.seq == 2 and not out.pending
    assert out.credit_batches == 0


def test_byte_bound_lets_one_oversized_batch_go_alone():
    big = _batch(0, rows=10_000)
    out = OutputChannel(1, capacity_batches=8, capacity_bytes=big.nbytes // 2)
    first = _send(out, Data(big))
    assert first.charge == big.nbytes // 2 and out.credit_bytes == 0
    out.enqueue(Data(_batch(1)))
    assert out.drain() == []  # no byte credit left
    out.grant(1, first.charge)
    assert len(out.drain()) == 1


def test_control_messages_need_no_credit_but_keep_their_place():
    out = OutputChannel(1, capacity_batches=1, capacity_bytes=1 << 20)
    _send(out, Data(_batch(0)))
    out.enqueue(Data(_batch(1)))
    out.enqueue(End())
    assert out.drain() == []  # End may not overtake the waiting data
    out.grant(1, 0)
    envs = out.drain()
    assert [type(e.message) for e in envs] == [Data, End]


def test_over_granting_is_a_bug_report():
    out = OutputChannel(1, capacity_batches=2, capacity_bytes=100)
    with pytest.raises(ChannelError, match="bug in credit accounting"):
        out.grant(1, 0)


def test_gap_that_never_closes_names_expected_and_received():
    inp = InputChannel(3, 0, max_out_of_order=2)
    out = OutputChannel(3, capacity_batches=10, capacity_bytes=1 << 20)
    envs = [_send(out, Data(_batch(i))) for i in range(4)]
    inp.offer(envs[1])
    inp.offer(envs[2])
    with pytest.raises(ChannelError, match="expected seq 0, received 3"):
        inp.offer(envs[3])


def test_blocked_input_holds_messages_back():
    inp = InputChannel(3, 0)
    out = OutputChannel(3, capacity_batches=4, capacity_bytes=1 << 20)
    inp.offer(_send(out, Data(_batch(0))))
    inp.blocked = True
    assert not inp.ready()
    inp.blocked = False
    assert inp.ready()
    assert inp.buffered() == (1, _batch(0).nbytes)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        OutputChannel(1, 0, 10)


def test_a_control_message_sent_unwrapped_takes_the_next_sequence_number_or_waits_behind_data():
    out = OutputChannel(3, capacity_batches=1, capacity_bytes=1 << 20)
    _send(out, Data(_batch(0)))
    assert out.sequence_nowait() == 1  # no credit needed, nothing waiting: at once
    out.enqueue(Data(_batch(1)))  # no credit: it waits
    assert out.drain() == []
    with pytest.raises(WouldBlock):
        out.sequence_nowait()  # it may not overtake the waiting batch
    out.grant(1, 0)
    assert [e.seq for e in out.drain()] == [2] and out.sequence_nowait() == 3


def test_take_in_place_only_for_the_next_message_with_nothing_queued_or_blocked():
    inp = InputChannel(3, input_index=0)
    assert not inp.take_in_place(1)  # a gap: seq 0 is still on its way
    inp.offer(Envelope(3, 2, "after"))  # waits for 0 and 1 in the reorder buffer
    inp.offer(Envelope(3, 0, "first"))
    assert not inp.take_in_place(1)  # "first" is queued before it
    assert inp.take().message == "first"
    inp.blocked = True
    assert not inp.take_in_place(1)
    inp.blocked = False
    assert inp.take_in_place(1)  # taken where it arrived; what waited behind it is now queued
    assert [e.message for e in inp.queue] == ["after"] and inp.next_seq == 3
    assert not inp.take_in_place(1)  # already taken: a duplicate is offered (and dropped) instead
    assert not inp.offer(Envelope(3, 1, "again")) and inp.duplicates == 1
