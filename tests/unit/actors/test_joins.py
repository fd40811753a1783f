"""Keyed two-input operators end to end without Ray, against pandas merges of the same input."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.operators import Dataflow, bounded_out_of_orderness, from_items, tumbling

LEFT = pa.schema([("user", pa.string()), ("t", pa.int64()), ("amount", pa.int64())])
RIGHT = pa.schema([("id", pa.string()), ("t", pa.int64()), ("score", pa.int64())])
JITTER = 30


def side(seed: int, n: int, value: str, key: str) -> list[dict]:
    rng = random.Random(seed)
    return [{key: f"u{rng.randrange(8)}", "t": i * 4 + rng.randrange(JITTER), value: rng.randint(0, 99)}
            for i in range(n)]


def sources(flow: Dataflow, seed: int, left: list[dict], right: list[dict]):
    rng = random.Random(seed)
    streams = []
    for name, rows, schema in (("orders", left, LEFT), ("scores", right, RIGHT)):
        p = rng.randint(1, 2)
        streams.append(flow.source(from_items(rows, schema=schema, batch_size=rng.randint(3, 9), num_splits=p),
                                   parallelism=p, name=name, watermarks=bounded_out_of_orderness("t", JITTER)))
    return streams


def run(flow: Dataflow, seed: int) -> pd.DataFrame:
    config = JobConfig(channel_capacity=random.Random(seed).choice([1, 2, 8]))
    return LocalRun(flow, config, seed=seed).run()["out"].to_pandas()


def sort(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(list(df.columns)).reset_index(drop=True)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_incremental_join_equals_the_batch_merge(p):
    left, right = side(p, 120, "amount", "user"), side(p + 50, 90, "score", "id")
    flow = Dataflow("join", num_bins=16)
    orders, scores = sources(flow, p, left, right)
    orders.connect(scores).key_by("user", "id").join(name="j", parallelism=p).collect(name="out")
    got = run(flow, p)
    expected = pd.merge(pd.DataFrame(left), pd.DataFrame(right), left_on="user", right_on="id",
                        suffixes=("", "_right")).drop(columns="id")
    assert list(got.columns) == ["user", "t", "amount", "t_right", "score"]
    pd.testing.assert_frame_equal(sort(got), sort(expected[list(got.columns)]))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_window_join_equals_the_batch_merge_per_window(p):
    left, right = side(p, 150, "amount", "user"), side(p + 70, 150, "score", "id")
    flow = Dataflow("wjoin", num_bins=16)
    orders, scores = sources(flow, p, left, right)
    (orders.connect(scores).key_by("user", "id").window_join(tumbling(40), on="t", name="wj", parallelism=p)
           .collect(name="out"))
    got = run(flow, p)
    ldf, rdf = pd.DataFrame(left), pd.DataFrame(right)
    ldf["window_start"], rdf["window_start"] = ldf["t"] // 40 * 40, rdf["t"] // 40 * 40
    expected = pd.merge(ldf, rdf, left_on=["user", "window_start"], right_on=["id", "window_start"],
                        suffixes=("", "_right")).drop(columns="id")
    expected["window_end"] = expected["window_start"] + 40
    assert list(got.columns) == ["user", "window_start", "window_end", "t", "amount", "t_right", "score"]
    pd.testing.assert_frame_equal(sort(got), sort(expected[list(got.columns)]))


def test_co_process_sees_both_inputs_of_a_key_and_its_timers():
    left, right = side(1, 80, "amount", "user"), side(2, 60, "score", "id")

    def count(key, rows, ctx, input):
        seen = list(ctx.value or [0, 0])
        seen[input] += rows.num_rows
        ctx.value = seen
        ctx.register(1 << 40)  # once per key, at end of input

    def report(key, time, ctx):
        return [{"key": key, "left": ctx.value[0], "right": ctx.value[1]}]

    flow = Dataflow("co", num_bins=8)
    orders, scores = sources(flow, 3, left, right)
    orders.connect(scores).key_by("user", "id").process(count, on_timer=report, parallelism=2).collect(name="out")
    got = run(flow, 3).set_index("key").sort_index()
    expected = pd.DataFrame({"left": pd.DataFrame(left).groupby("user").size(),
                             "right": pd.DataFrame(right).groupby("id").size()}).fillna(0).astype("int64")
    pd.testing.assert_frame_equal(got, expected, check_names=False)


def test_join_key_errors_at_build_time():
    flow = Dataflow("bad")
    orders = flow.source(from_items(side(0, 3, "amount", "user"), schema=LEFT))
    scores = flow.source(from_items(side(1, 3, "score", "id"), schema=RIGHT))
    with pytest.raises(ValueError, match=r"unknown key column 'user' of stream 'source-2'"):
        orders.connect(scores).key_by("user")
    with pytest.raises(TypeError, match=r"operator 'wj'.*event-time column 'id'"):
        orders.connect(scores).key_by("user", "id").window_join(tumbling(5), on=("t", "id"), name="wj")
