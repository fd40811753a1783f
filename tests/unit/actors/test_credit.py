"""Credit owed to a sender on another host: held back until half the bound, a parcel, or a deadline.

The ledger (``channel.CreditLedger``) is driven alone under a fake clock; then hosts are
``HostCore``s driven by hand (``LocalRun`` builds them, with the same fake
clock), so what a host's outbox holds after each step is checked exactly.
The oracle is plain arithmetic over what was consumed: every consumed
batch's credit comes back exactly once, in as few grants as the rule allows.
"""

from __future__ import annotations

import random

import pytest

from chiray.actors.config import JobConfig
from chiray.actors.runtime.channel import CreditLedger
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.messages import Data, Grant, Parcel
from chiray.operators import Dataflow, from_items
from tests.clock import FakeClock

ROWS = [{"x": i} for i in range(40)]


# -- the ledger alone --------------------------------------------------------------------


def test_the_ledger_holds_credit_until_half_the_bound_in_batches_or_bytes():
    ledger = CreditLedger(capacity_batches=8, capacity_bytes=1000, delay_s=0.05)
    assert ledger.owe(Grant(7, 1, 10), host=2, now=0.0) is None
    assert ledger.owe(Grant(7, 2, 10), host=2, now=0.01) is None
    assert ledger.owe(Grant(7, 1, 10), host=2, now=0.02) == Grant(7, 4, 30), "4 of 8 batches: half"
    assert not ledger and ledger.deadline is None
    assert ledger.owe(Grant(9, 1, 499), host=3, now=0.03) is None
    assert ledger.owe(Grant(9, 1, 1), host=3, now=0.04) == Grant(9, 2, 500), "500 of 1000 bytes: half"


def test_the_ledger_lets_credit_ride_with_a_parcel_to_its_host_only():
    ledger = CreditLedger(8, 1 << 20, delay_s=0.05)
    ledger.owe(Grant(1, 1, 5), host=2, now=0.0)
    ledger.owe(Grant(2, 1, 6), host=3, now=0.0)
    ledger.owe(Grant(1, 2, 7), host=2, now=0.01)
    assert ledger.settle(0.02, going={2}) == [(2, Grant(1, 3, 12))]
    assert ledger.settle(0.02, going={4}) == []
    assert ledger.deadline == pytest.approx(0.05), "the oldest credit still owed sets the deadline"


def test_the_ledger_releases_everything_at_the_deadline_and_not_before():
    ledger = CreditLedger(8, 1 << 20, delay_s=0.05)
    ledger.owe(Grant(1, 1, 5), host=2, now=10.0)
    ledger.owe(Grant(2, 1, 6), host=3, now=10.03)
    assert ledger.deadline == pytest.approx(10.05)
    assert ledger.settle(10.049, going=()) == []
    assert sorted(ledger.settle(10.05, going=())) == [(2, Grant(1, 1, 5)), (3, Grant(2, 1, 6))]
    assert not ledger and ledger.deadline is None
    ledger.owe(Grant(1, 1, 5), host=2, now=20.0)
    assert ledger.deadline == pytest.approx(20.05), "a new debt starts a new deadline"


@pytest.mark.parametrize("seed", range(5))
def test_the_ledger_returns_each_consumed_batch_exactly_once(seed):
    rng = random.Random(seed)
    ledger = CreditLedger(capacity_batches=rng.choice([1, 2, 4, 8]), capacity_bytes=rng.choice([64, 4096]),
                          delay_s=0.05)
    consumed: dict[int, list[int]] = {}
    returned: dict[int, list[int]] = {}
    now = 0.0
    for _ in range(500):
        now += rng.random() * 0.02
        channel = rng.randrange(6)
        grant = Grant(channel, 1, rng.randrange(1, 40))
        totals = consumed.setdefault(channel, [0, 0])
        totals[0] += 1
        totals[1] += grant.nbytes
        out = [(channel % 3, g) for g in [ledger.owe(grant, channel % 3, now)] if g is not None]
        if rng.random() < 0.3:
            out += ledger.settle(now, going={rng.randrange(3)})
        for host, g in out:
            assert host == g.channel % 3
            back = returned.setdefault(g.channel, [0, 0])
            back[0] += g.batches
            back[1] += g.nbytes
    for _, g in ledger.settle(now + 1.0, going=()):
        back = returned.setdefault(g.channel, [0, 0])
        back[0] += g.batches
        back[1] += g.nbytes
    assert returned == consumed


# -- on hosts ------------------------------------------------------------------------------


def _flow(with_map: bool) -> Dataflow:
    flow = Dataflow("credit")
    stream = flow.source(from_items(ROWS, batch_size=1), name="src")
    if with_map:
        stream = stream.map(lambda b: b, name="m")
    stream.collect(name="out")
    return flow


def _run(with_map: bool, capacity: int = 8, clock: FakeClock | None = None) -> LocalRun:
    pins = {"src": [0], "out": [0 if with_map else 1]}
    if with_map:
        pins["m"] = [1]
    return LocalRun(_flow(with_map), JobConfig(num_hosts=2, placement=pins, channel_capacity=capacity),
                    clock=clock or FakeClock())


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


def test_credit_waits_until_half_the_bound_then_goes_as_one_grant():  # the fake clock never reaches the deadline
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


def test_credit_rides_with_a_parcel_that_goes_to_the_sender_anyway():
    run = _run(with_map=True)  # src (host 0) -> m (host 1) -> out (host 0)
    _send(run, 0, 1, 1)
    _consume(run, 1, 1)  # m takes the batch: it owes host 0 one credit and sends host 0 its output
    parcel = run.hosts[1].take_outbox().parcels()[0]
    assert [g.batches for g in parcel.grants] == [1]
    assert sum(isinstance(e.message, Data) for e in parcel.envelopes) == 1


def test_owed_credit_goes_at_the_deadline_and_sets_the_wakeup():
    clock = FakeClock(50.0)
    run = _run(with_map=False, clock=clock)
    _send(run, 0, 1, 2)
    _consume(run, 1, 2)
    core = run.hosts[1]
    assert core.next_wakeup() == pytest.approx(50.0 + core.credit.delay_s)
    clock.now = 50.01
    assert _grants(run, 1) == []
    clock.now = 50.0 + core.credit.delay_s
    grants = _grants(run, 1)
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
