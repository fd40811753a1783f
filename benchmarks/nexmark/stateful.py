"""stateful.py: the NEXMark queries that keep state (q4, q5, q7, q8), with the public API.

They use keyed windows, window joins, the lifetime join (q4: each auction with its highest
bid while it was open) and keyed process functions with event-time timers, whose state lives
in key bins, so each of these queries checkpoints and rescales like any keyed operator. Where
a query wants a keyless window (q7's maximum per window, q5's top auctions per window) it keys
by the window instead.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chiray import Dataflow, sliding, tumbling

from .queries import Events

__all__ = ["q4", "q5", "q7", "q8", "HEAVIEST"]

# Each stateful query's heaviest keyed operator: the one a rescale moves (Megaphone's experiment).
HEAVIEST = {"q3": "join", "q4": "winning_bids", "q5": "bids_per_window", "q7": "highest", "q8": "same_window"}

TEN_S_MS = 10_000
TEN_S, TWO_S = datetime.timedelta(seconds=10), datetime.timedelta(seconds=2)  # date_time is timestamp[ms]


def _ms(rows: pa.RecordBatch, column: str) -> np.ndarray:
    return rows.column(column).cast(pa.int64()).to_numpy()


def _with_window(bids: pa.RecordBatch) -> pa.RecordBatch:
    """Bids with their 10 s tumbling window's number (``date_time // 10 s``)."""
    window = pa.array(_ms(bids, "date_time") // TEN_S_MS)
    return bids.select(["auction", "price", "bidder", "date_time", "extra"]).append_column("window", window)


# -- q7: the highest bid of each 10 s window, joined back to its bid ----------------------------------

def _keep_highest(window: Any, rows: pa.RecordBatch, ctx: Any) -> None:
    top = pc.max(rows.column("price")).as_py()
    best = rows.filter(pc.equal(rows.column("price"), top)).drop_columns(["window"])
    held = ctx.value
    if held is None or top > held[0]:
        ctx.value = (top, best)
        ctx.register((window + 1) * TEN_S_MS)  # the window's end: every bid in it has arrived
    elif top == held[0]:
        ctx.value = (top, pa.concat_batches([held[1], best]))


def _emit_highest(window: Any, time: int, ctx: Any) -> pa.RecordBatch:
    rows = ctx.value[1]
    ctx.clear()
    return rows


def q7(events: Events, parallelism: int = 2) -> Dataflow:
    """Highest bid: per 10 s tumbling window, the bids with the window's highest price."""
    flow = Dataflow("nexmark-q7")
    schema = pa.schema([("auction", pa.int64()), ("price", pa.int64()), ("bidder", pa.int64()),
                        ("date_time", pa.timestamp("ms")), ("extra", pa.string())])
    (events.stream(flow, "bid", parallelism).map(_with_window, name="window_of")
     .key_by("window").process(_keep_highest, on_timer=_emit_highest, schema=schema, name="highest",
                               parallelism=parallelism)
     .collect(name="out"))
    return flow


# -- q5: hot items: per 10 s window sliding by 2 s, the auctions with the most bids -------------------

def _keep_most(start: Any, rows: pa.RecordBatch, ctx: Any) -> None:
    top = pc.max(rows.column("num")).as_py()
    best = rows.filter(pc.equal(rows.column("num"), top)).select(["auction", "num", "window_start"])
    held = ctx.value
    if held is None:
        ctx.register(_ms(rows, "window_end")[0])  # every count of the window has come by its end
    if held is None or top > held[0]:
        ctx.value = (top, best)
    elif top == held[0]:
        ctx.value = (top, pa.concat_batches([held[1], best]))


def _emit_most(start: Any, time: int, ctx: Any) -> pa.RecordBatch:
    rows = ctx.value[1]
    ctx.clear()
    return rows


def q5(events: Events, parallelism: int = 2) -> Dataflow:
    """Hot items: the auctions with the most bids in each 10 s window sliding by 2 s."""
    flow = Dataflow("nexmark-q5")
    counts = (events.stream(flow, "bid", parallelism)
              .map(lambda b: b.select(["auction", "date_time"]), name="project")
              .key_by("auction").window(sliding(TEN_S, TWO_S), on="date_time")
              .agg(num=(None, "count"), name="bids_per_window", parallelism=parallelism))
    schema = pa.schema([("auction", pa.int64()), ("num", pa.int64()), ("window_start", pa.timestamp("ms"))])
    (counts.map(lambda c: c.append_column("start", pa.array(_ms(c, "window_start"))), name="start_of")
     .key_by("start").process(_keep_most, on_timer=_emit_most, schema=schema, name="hottest",
                              parallelism=parallelism)
     .collect(name="out"))
    return flow


# -- q8: new users: people who opened an auction in the 10 s window they registered in ----------------

def _person_window_key(pairs: pa.RecordBatch) -> pa.RecordBatch:
    key = pc.add(pc.multiply(pairs.column("id"), 1 << 32), pa.array(_ms(pairs, "window_start") // TEN_S_MS))
    return pa.record_batch([key, pairs.column("id"), pairs.column("name"), pairs.column("window_start")],
                           names=["person_window", "id", "name", "starttime"])


def q8(events: Events, parallelism: int = 2) -> Dataflow:
    """New users: each person who created an auction in the same 10 s tumbling window (once per window)."""
    flow = Dataflow("nexmark-q8")
    persons = events.stream(flow, "person", parallelism).map(
        lambda p: p.select(["id", "name", "date_time"]), name="persons")
    sellers = events.stream(flow, "auction", parallelism).map(
        lambda a: a.select(["seller", "date_time"]), name="sellers")
    (persons.connect(sellers).key_by("id", "seller")
     .window_join(tumbling(TEN_S), on="date_time", name="same_window", parallelism=parallelism)
     .map(_person_window_key, name="person_window")
     .key_by("person_window").reduce(lambda first, row: first, name="once", parallelism=parallelism)
     .map(lambda b: b.select(["id", "name", "starttime"]), name="project")
     .collect(name="out"))
    return flow


# -- q4: average closing price per category ---------------------------------------------------------

def q4(events: Events, parallelism: int = 2) -> Dataflow:
    """Average closing price per category: each auction's highest bid within its lifetime, averaged."""
    flow = Dataflow("nexmark-q4")
    auctions = events.stream(flow, "auction", parallelism).map(
        lambda a: a.select(["id", "category", "date_time", "expires"]), name="auctions")
    bids = events.stream(flow, "bid", parallelism).map(
        lambda b: b.select(["auction", "price", "date_time"]), name="bids")
    (auctions.connect(bids).key_by("id", "auction")
     .lifetime_join(start="date_time", end="expires", on="date_time", by="price", name="winning_bids",
                    parallelism=parallelism)
     .key_by("category").mean("price", name="average", parallelism=parallelism)
     .collect(name="out"))
    return flow
