"""State TTL end to end without Ray: an event-time TTL on a keyed count (and on a reduce, rescaled mid-stream),
its expired keys on the side output and in the instances' statistics, against a plain loop over the same
records.

Keys live in epochs: in epoch ``e`` key ``k{e % 3}`` has records at times ``100 e .. 100 e + 9``, so each life
of a key ends 30 ticks after its epoch's last record, long before its next epoch: whatever the batching and
the watermarks' timing, every epoch but the last expires, each with the count of its records.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.operators import Dataflow, bounded_out_of_orderness, collect, from_items

SCHEMA = pa.schema([("k", pa.string()), ("t", pa.int64())])
EPOCHS, TTL = 12, 30


@pytest.mark.parametrize("seed", [1, 2])
def test_event_time_ttl_sends_each_expired_life_of_a_key_to_the_side_output(seed: int) -> None:
    rng = random.Random(seed)
    data, lives = [], []
    for e in range(EPOCHS):
        times = sorted(100 * e + rng.randrange(10) for _ in range(rng.randint(1, 6)))
        data += [{"k": f"k{e % 3}", "t": t} for t in times]
        lives.append((f"k{e % 3}", len(times)))
    flow = Dataflow("ttl", num_bins=16)
    src = flow.source(from_items(data, schema=SCHEMA, batch_size=rng.choice([1, 3, 7])),
                      watermarks=bounded_out_of_orderness("t", 5))
    counts = src.key_by("k").count(name="count", parallelism=2, emit="updates", ttl=TTL, ttl_time="event",
                                   ttl_on="t", expired_side_output=True)
    counts.sink(collect(), name="out")
    counts.side_output("expired").collect(name="expired")
    local = LocalRun(flow, JobConfig(channel_capacity=rng.choice([1, 4])), seed=seed)
    expired = local.run()["expired"].to_pylist()
    assert sorted((r["k"], r["count"]) for r in expired) == sorted(lives[:-1])
    stats = [inst.statistics() for h in local.hosts for inst in h.instances if inst.info.operator == "count"]
    assert sum(s.expired_keys for s in stats) == EPOCHS - 1


def _adding(acc: dict, row: dict) -> dict:
    return {"k": acc["k"], "t": max(acc["t"], row["t"]), "n": acc["n"] + row["n"]}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_reduce_s_event_time_ttl_expires_each_life_of_a_key_once_across_a_rescale(seed: int) -> None:
    """The same lives through a ``reduce`` whose keys' bins move (2 -> 3 instances) mid-stream: the touches
    move with the accumulators, so each life but the last expires once, with its count."""
    rng = random.Random(seed)
    data, lives = [], []
    for e in range(EPOCHS):
        times = sorted(100 * e + rng.randrange(10) for _ in range(rng.randint(1, 6)))
        data += [{"k": f"k{e % 3}", "t": t, "n": 1} for t in times]
        lives.append((f"k{e % 3}", len(times)))
    flow = Dataflow("ttl-reduce", num_bins=16)
    schema = SCHEMA.append(pa.field("n", pa.int64()))
    src = flow.source(from_items(data, schema=schema, batch_size=1),
                      watermarks=bounded_out_of_orderness("t", 5))
    sums = src.key_by("k").reduce(_adding, name="r", parallelism=2, emit="updates", ttl=TTL, ttl_time="event",
                                  ttl_on="t", expired_side_output=True)
    sums.sink(collect(), name="out")
    sums.side_output("expired").collect(name="expired")
    local = LocalRun(flow, JobConfig(channel_capacity=1), seed=seed)  # the source reads little ahead
    local.run(until=lambda: sum(i.records_in for h in local.hosts for i in h.instances
                                if i.info.operator == "r") >= len(data) // 6)
    local.rescale("r", 3, planner="round_robin")
    expired = local.run()["expired"].to_pylist()
    assert sorted((r["k"], r["n"]) for r in expired) == sorted(lives[:-1])
