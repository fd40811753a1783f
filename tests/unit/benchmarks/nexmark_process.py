"""nexmark_process.py: NEXMark q4, q6, q9 and q19 written with keyed ``process`` functions and timers.

The benchmark writes these queries with the vectorised keyed verbs (``lifetime_join``, ``top`` per key,
``rolling``); these earlier versions keep a Python ``process`` function per key instead, with event-time
timers, and stay as tests of ``process``: ``test_nexmark_queries.py`` runs them against the same DuckDB
SQL (``benchmarks/nexmark/oracle.py``) as the queries themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.nexmark.more import LAST_CLOSED, TOP_BIDS, WINNER
from benchmarks.nexmark.queries import Events
from benchmarks.nexmark.stateful import _ms
from chiray import Dataflow

__all__ = ["PROCESS_QUERIES"]

END_OF_TIME = 1 << 62  # a timer there fires when the input ends: the final top ten


# -- q4: average closing price per category ---------------------------------------------------------

def _auction_or_bids(auction: Any, rows: pa.RecordBatch, ctx: Any, side: int) -> None:
    held = ctx.value or {"open": None, "max": None, "pending": []}
    if side == 0:  # the auction: its category and lifetime, then the bids that came before it
        row = rows.slice(0, 1)
        held["open"] = (row.column("category")[0].as_py(), _ms(row, "date_time")[0], _ms(row, "expires")[0])
        ctx.register(int(held["open"][2]))  # it closes at its expiry
        pending, held["pending"] = held["pending"], []
        for times, prices in pending:
            _take_bids(held, times, prices)
    elif held["open"] is None:  # bids on an auction not seen yet: keep them until it comes
        held["pending"].append((_ms(rows, "date_time"), rows.column("price").to_numpy()))
    else:
        _take_bids(held, _ms(rows, "date_time"), rows.column("price").to_numpy())
    ctx.value = held


def _take_bids(held: dict, times: np.ndarray, prices: np.ndarray) -> None:
    _, start, expires = held["open"]
    valid = prices[(times >= start) & (times <= expires)]
    if len(valid):
        top = int(valid.max())
        held["max"] = top if held["max"] is None else max(held["max"], top)


def _close(auction: Any, time: int, ctx: Any) -> list[dict]:
    held = ctx.value
    ctx.clear()
    if held["max"] is None:
        return []
    return [{"id": auction, "category": held["open"][0], "final": held["max"]}]


def q4(events: Events, parallelism: int = 2) -> Dataflow:
    """Average closing price per category: each auction's highest bid within its lifetime, averaged."""
    flow = Dataflow("nexmark-q4-process")
    auctions = events.stream(flow, "auction", parallelism).map(
        lambda a: a.select(["id", "category", "date_time", "expires"]), name="auctions")
    bids = events.stream(flow, "bid", parallelism).map(
        lambda b: b.select(["auction", "price", "date_time"]), name="bids")
    schema = pa.schema([("id", pa.int64()), ("category", pa.int64()), ("final", pa.int64())])
    (auctions.connect(bids).key_by("id", "auction")
     .process(_auction_or_bids, on_timer=_close, schema=schema, name="winning_bids", parallelism=parallelism)
     .key_by("category").mean("final", name="average", parallelism=parallelism)
     .collect(name="out"))
    return flow


# -- q9: winning bids; q6 builds on them --------------------------------------------------------------

def _auction_and_best_bid(auction: Any, rows: pa.RecordBatch, ctx: Any, side: int) -> None:
    """Per auction: its row, and its best bid within its lifetime so far (bids before it wait for it)."""
    held = ctx.value or {"auction": None, "best": None, "pending": []}
    if side == 0:
        row = rows.slice(0, 1)
        held["auction"] = (row.to_pylist()[0], int(_ms(row, "date_time")[0]), int(_ms(row, "expires")[0]))
        ctx.register(held["auction"][2])  # it closes at its expiry
        pending, held["pending"] = held["pending"], []
        for bids in pending:
            _take_best(held, bids)
    elif held["auction"] is None:  # a copy: a slice would keep the whole batch it came in alive
        held["pending"].append(rows.take(pa.array(np.arange(rows.num_rows))))
    else:
        _take_best(held, rows)
    ctx.value = held


def _take_best(held: dict, bids: pa.RecordBatch) -> None:
    """Keep the highest bid in the auction's lifetime, the earliest of equal ones."""
    _, start, expires = held["auction"]
    times, prices = _ms(bids, "date_time"), bids.column("price").to_numpy()
    inside = np.flatnonzero((times >= start) & (times <= expires))
    if len(inside) == 0:
        return
    i = inside[np.lexsort((times[inside], -prices[inside]))[0]]  # highest price, then earliest
    best = held["best"]
    if best is None or (prices[i], -times[i]) > (best[0], -best[1]):
        held["best"] = (int(prices[i]), int(times[i]), bids.slice(int(i), 1).to_pylist()[0])


def _close_with_winner(auction: Any, time: int, ctx: Any) -> list[dict]:
    held = ctx.value
    ctx.clear()
    if held["best"] is None:
        return []
    row, bid = dict(held["auction"][0]), held["best"][2]
    row.update(auction=bid["auction"], bidder=bid["bidder"], price=bid["price"], bid_date_time=bid["date_time"],
               bid_extra=bid["extra"])
    return [row]


def _winning_bids(events: Events, flow: Dataflow, parallelism: int) -> Any:
    auctions = events.stream(flow, "auction", parallelism)
    bids = events.stream(flow, "bid", parallelism).map(
        lambda b: b.select(["auction", "bidder", "price", "date_time", "extra"]), name="bids")
    return (auctions.connect(bids).key_by("id", "auction")
            .process(_auction_and_best_bid, on_timer=_close_with_winner, schema=WINNER, name="winning_bids",
                     parallelism=parallelism))


def q9(events: Events, parallelism: int = 2) -> Dataflow:
    """Winning bids: each auction with its highest bid within its lifetime (the earliest on ties)."""
    flow = Dataflow("nexmark-q9-process")
    _winning_bids(events, flow, parallelism).collect(name="out")
    return flow


def _seller_closes(seller: Any, rows: pa.RecordBatch, ctx: Any) -> None:
    """Closed auctions wait until event time passes their close, so they are taken in closing order."""
    held = ctx.value or {"prices": [], "pending": []}
    closes = _ms(rows, "expires")
    for close, auction, price in zip(closes.tolist(), rows.column("id").to_pylist(), rows.column("price").to_pylist()):
        held["pending"].append((close, auction, price))
        ctx.register(close)
    ctx.value = held


def _seller_average(seller: Any, time: int, ctx: Any) -> list[dict]:
    held = ctx.value
    due = sorted(p for p in held["pending"] if p[0] <= time)
    held["pending"] = [p for p in held["pending"] if p[0] > time]
    out = []
    for _, _, price in due:
        held["prices"] = (held["prices"] + [price])[-LAST_CLOSED:]
        out.append({"seller": seller, "avg_price": sum(held["prices"]) / len(held["prices"])})
    ctx.value = held
    return out


def q6(events: Events, parallelism: int = 2) -> Dataflow:
    """Average selling price per seller: over each seller's last 11 closed auctions, at each close."""
    flow = Dataflow("nexmark-q6-process")
    schema = pa.schema([("seller", pa.int64()), ("avg_price", pa.float64())])
    (_winning_bids(events, flow, parallelism)
     .map(lambda w: w.select(["id", "seller", "price", "expires"]), name="closed")
     .key_by("seller").process(_seller_closes, on_timer=_seller_average, schema=schema, name="per_seller",
                               parallelism=parallelism)
     .collect(name="out"))
    return flow


# -- q19: the ten highest bids per auction -----------------------------------------------------------------

def _keep_top_bids(auction: Any, rows: pa.RecordBatch, ctx: Any) -> None:
    held = ctx.value
    table = pa.Table.from_batches([rows]) if held is None else pa.concat_tables([held, pa.Table.from_batches([rows])])
    order = pc.sort_indices(table, sort_keys=[("price", "descending"), ("date_time", "ascending")])
    ctx.value = table.take(order[:TOP_BIDS]).combine_chunks()
    if held is None:
        ctx.register(END_OF_TIME)


def _ranked_bids(auction: Any, time: int, ctx: Any) -> pa.Table:
    top = ctx.value
    ctx.clear()
    return top.append_column("rank_number", pa.array(np.arange(1, top.num_rows + 1, dtype=np.int64)))


def q19(events: Events, parallelism: int = 2) -> Dataflow:
    """Auction top-10 price: per auction, its ten highest bids (ranked; the earliest first on equal prices)."""
    flow = Dataflow("nexmark-q19-process")
    schema = pa.schema([*(f for f in events.bid_schema()), pa.field("rank_number", pa.int64())])
    (events.stream(flow, "bid", parallelism)
     .key_by("auction").process(_keep_top_bids, on_timer=_ranked_bids, schema=schema, name="top_bids",
                                parallelism=parallelism)
     .collect(name="out"))
    return flow


PROCESS_QUERIES = {"q4": q4, "q6": q6, "q9": q9, "q19": q19}
