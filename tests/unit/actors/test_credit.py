"""Credit owed to a sender on another host: held back until half the bound, a parcel, or a deadline.

Hosts are ``HostCore``s driven by hand (``LocalRun`` builds them), so what a
host's outbox holds after each step is checked exactly. The oracle is plain
arithmetic over what was consumed: every consumed batch's credit comes back
exactly once, in as few grants as the rule allows.
"""

from __future__ import annotations

import random

import pytest

from chiray.actors import mailbox
from chiray.actors.config import JobConfig
from chiray.actors.harness import LocalRun
from chiray.actors.messages import Data, Parcel
from chiray.operators import Dataflow, from_items

ROWS = [{"x": i} for i in range(40)]


def _flow(with_map: bool) -> Dataflow:
    flow = Dataflow("credit")
    stream = flow.source(from_items(ROWS, batch_size=1), name="src")
    if with_map:
        stream = stream.map(lambda b: b, name="m")
    stream.collect(name="out")
    return flow


def _run(with_map: bool, capacity: int = 8) -> LocalRun:
    pins = {"src": [0], "out": [0 if with_map else 1]}
    if with_map:
        pins["m"] = [1]
    return LocalRun(_flow(with_map), JobConfig(num_hosts=2, placement=pins, channel_capacity=capacity))


def _send(run: LocalRun, src: int, dst: int, batches: int) -> None:
    """Step host ``src`` until it sent ``batches`` data envelopes, and hand them to host ``dst``."""
    sent = 0
    while sent < batches:
        assert run.hosts[src].run_step(), "the sender could not run"
        parcel = run.hosts[src].take_outbox().parcels().get(dst)
        if parcel is not None:
            sent += sum(isinstance(e.message, Data) for e in parcel.envelopes)
            run.hosts[dst].receive(parcel)
    assert sent == batches


def _consume(run: LocalRun, host: int, steps: int) -> None:
    for _ in range(steps):
        assert run.hosts[host].run_step(), "nothing to consume"


def _grants(run: LocalRun, host: int, now: float | None = None) -> list:
    return [g for p in run.hosts[host].take_outbox(now).parcels().values() for g in p.grants]


@pytest.fixture
def slow_deadline(monkeypatch):
    """A deadline no test step reaches, so only the other two rules can release credit."""
    monkeypatch.setattr(mailbox, "CREDIT_DELAY_S", 3600.0)


def test_credit_waits_until_half_the_bound_then_goes_as_one_grant(slow_deadline):
    run = _run(with_map=False, capacity=8)
    _send(run, 0, 1, 6)
    _consume(run, 1, 3)
    assert _grants(run, 1) == [], "3 of 8 owed: below half, nothing is sent"
    _consume(run, 1, 1)
    grants = _grants(run, 1)
    assert [(g.batches, g.nbytes > 0) for g in grants] == [(4, True)], grants
    channel = run.instance(("src", 0)).output_channels()[0]
    run.hosts[0].receive(Parcel(grants=grants))
    assert channel.credit_batches == 8 - 6 + 4


def test_credit_rides_with_a_parcel_that_goes_to_the_sender_anyway(slow_deadline):
    run = _run(with_map=True)  # src (host 0) -> m (host 1) -> out (host 0)
    _send(run, 0, 1, 1)
    _consume(run, 1, 1)  # m takes the batch: it owes host 0 one credit and sends host 0 its output
    parcel = run.hosts[1].take_outbox().parcels()[0]
    assert [g.batches for g in parcel.grants] == [1]
    assert sum(isinstance(e.message, Data) for e in parcel.envelopes) == 1


def test_owed_credit_goes_at_the_deadline_and_sets_the_wakeup(monkeypatch):
    monkeypatch.setattr(mailbox, "CREDIT_DELAY_S", 0.05)
    run = _run(with_map=False)
    _send(run, 0, 1, 2)
    _consume(run, 1, 2)
    core = run.hosts[1]
    since = core._owed_since
    assert since is not None
    assert core.next_wakeup() == pytest.approx(since + 0.05)
    assert _grants(run, 1, now=since + 0.01) == []
    grants = _grants(run, 1, now=since + 0.05)
    assert sum(g.batches for g in grants) == 2
    assert core.next_wakeup() is None


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("capacity", [1, 2, 3, 8])
def test_every_consumed_batch_returns_its_credit_exactly_once(seed, capacity):
    flow = Dataflow("credit-random")
    rows = [{"k": i % 5, "v": i} for i in range(300)]
    (flow.source(from_items(rows, batch_size=random.Random(seed).choice([1, 3, 7])), parallelism=2, name="src")
         .key_by("k").count(parallelism=2, name="count").collect(name="out"))
    run = LocalRun(flow, JobConfig(num_hosts=3, channel_capacity=capacity), seed=seed)
    result = run.run()["out"].to_pydict()
    assert dict(zip(result["k"], result["count"])) == {k: 60 for k in range(5)}
    for host in run.hosts:  # whatever is still owed goes at the deadline
        run._in_flight.extend(host.take_outbox(now=float("inf")).parcels().items())
    while run._deliver_some():
        pass
    for host in run.hosts:
        for inst in host.instances:
            for ch in inst.output_channels():
                assert (ch.credit_batches, ch.credit_bytes) == (ch.capacity_batches, ch.capacity_bytes), ch
