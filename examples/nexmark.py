"""NEXMark q5, q8 and q18, annotated: three queries of the streaming benchmark over a small auction site.

Run it with ``python examples/nexmark.py``.

NEXMark models an online auction: people register (``person``), open
auctions (``auction``) and bid on them (``bid``). Its queries are written in
SQL; each one below says what it asks, gives its SQL (Flink's text, in short)
and builds it with the dataflow API. The three queries run as one job over
the same three sources. The events come from a small generator in this file
with the benchmark's proportions; ``python -m benchmarks.nexmark`` in the
checkout runs every query on the full-size generator.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import chiray

BASE = datetime(2026, 6, 1, 12, 0)
EVENT_GAP = timedelta(milliseconds=10)        # 100 events a second of event time
CHANNELS = ["Google", "Facebook", "Baidu", "Apple"]
TEN_S, TWO_S = timedelta(seconds=10), timedelta(seconds=2)


# -- the events ---------------------------------------------------------------------------------------------

def nexmark_events(num_events: int = 3_000, seed: int = 5) -> dict[str, pa.Table]:
    """The three streams over ``num_events`` events, by kind: of every 50 events 1 is a new person, 3 are new
    auctions and 46 are bids (the benchmark's proportions). Sellers and bidders are recent people, and most
    bids go to the newest auctions, so that each window has favourites."""
    rng = np.random.default_rng(seed)
    persons: list[dict[str, object]] = []
    auctions: list[dict[str, object]] = []
    bids: list[dict[str, object]] = []
    for n in range(num_events):
        at = BASE + n * EVENT_GAP
        if n % 50 == 0:
            persons.append({"id": 1000 + len(persons), "name": f"person {len(persons)}", "date_time": at})
        elif n % 50 < 4:
            seller = persons[-1 - int(rng.integers(0, min(len(persons), 30)))]["id"]
            auctions.append({"id": 1000 + len(auctions), "seller": seller,
                             "category": int(rng.integers(10, 15)), "date_time": at})
        else:
            auction = auctions[-1 - min(int(rng.geometric(0.4)) - 1, len(auctions) - 1)]["id"]
            channel = CHANNELS[int(rng.integers(0, len(CHANNELS)))]
            bids.append({"auction": auction, "bidder": persons[int(rng.integers(0, len(persons)))]["id"],
                         "price": int(rng.integers(100, 100_000)), "channel": channel,
                         "url": f"https://www.nexmark.com/{channel.lower()}/item.htm?query=1",
                         "date_time": at, "extra": ""})
    ts = pa.timestamp("ms")
    schemas = {
        "person": pa.schema([("id", pa.int64()), ("name", pa.string()), ("date_time", ts)]),
        "auction": pa.schema([("id", pa.int64()), ("seller", pa.int64()), ("category", pa.int64()),
                              ("date_time", ts)]),
        "bid": pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                          ("channel", pa.string()), ("url", pa.string()), ("date_time", ts),
                          ("extra", pa.string())]),
    }
    rows = {"person": persons, "auction": auctions, "bid": bids}
    return {kind: pa.Table.from_pylist(rows[kind], schema=schemas[kind]) for kind in schemas}


# -- q5: hot items ------------------------------------------------------------------------------------------
# Which auctions got the most bids in each 10 s window, sliding by 2 s (ties: all of them)?
#
#   WITH counts AS (SELECT auction, count(*) AS num, window_start FROM HOP(bid, date_time, 2 s, 10 s)
#                   GROUP BY auction, window_start)
#   SELECT C.auction, C.num, C.window_start FROM counts C
#   JOIN (SELECT window_start, max(num) AS maxn FROM counts GROUP BY window_start) M
#     ON C.window_start = M.window_start AND C.num >= M.maxn
#
# Step 1 counts the bids per auction and sliding window: a keyed window aggregation. Step 2 picks each
# window's winners. The sliding windows end on the 2 s marks, so a tumbling 2 s window over their end
# holds the counts of exactly one sliding window; it is a window over the whole stream (no key_by).

def most_bids(start: datetime, end: datetime, counts: pa.Table) -> pa.Table:
    """The auctions of one sliding window (``counts``: auction, window_start, window_end, num) with the most
    bids."""
    top = counts.filter(pc.equal(counts["num"], pc.max(counts["num"])))
    return pa.table({"auction": top["auction"], "num": top["num"], "hop_start": top["window_start"]})


def q5(bids: chiray.Stream) -> chiray.Stream:
    counts = (bids.key_by("auction")
                  .window(chiray.sliding(TEN_S, TWO_S), on="date_time")
                  .agg(num=(None, "count"), parallelism=2, name="q5_bids_per_window"))
    winners = counts.window(chiray.tumbling(TWO_S), on="window_end").apply(most_bids, name="q5_most_bids")
    return winners.map(lambda b: b.select(["auction", "num", "hop_start"]).rename_columns(
        ["auction", "num", "window_start"]), name="q5_project")


# -- q8: new users ------------------------------------------------------------------------------------------
# Who opened an auction in the same 10 s window in which they registered?
#
#   SELECT P.id, P.name, P.starttime FROM
#       (SELECT id, name, window_start AS starttime FROM TUMBLE(person, date_time, 10 s)
#        GROUP BY id, name, window_start) P
#   JOIN (SELECT seller, window_start FROM TUMBLE(auction, date_time, 10 s) GROUP BY seller, window_start) A
#   ON P.id = A.seller AND P.starttime = A.window_start
#
# A window join pairs each person with each of their auctions in the same tumbling window; a person who opened
# several auctions there is one row of the answer, so the pairs are reduced to one per person and window.

def person_window(pairs: pa.RecordBatch) -> pa.RecordBatch:
    """The joined pairs with a key for their person and window: ``"<id>@<window_start>"``."""
    key = pc.binary_join_element_wise(pc.cast(pairs["id"], pa.string()),
                                      pc.cast(pc.cast(pairs["window_start"], pa.int64()), pa.string()), "@")
    return pa.record_batch({"person_window": key, "id": pairs["id"], "name": pairs["name"],
                            "starttime": pairs["window_start"]})


def q8(persons: chiray.Stream, auctions: chiray.Stream) -> chiray.Stream:
    people = persons.map(lambda b: b.select(["id", "name", "date_time"]), name="q8_people")
    sellers = auctions.map(lambda b: b.select(["seller", "date_time"]), name="q8_sellers")
    pairs = (people.connect(sellers)
                   .key_by("id", "seller")
                   .window_join(chiray.tumbling(TEN_S), on="date_time", parallelism=2, name="q8_same_window"))
    once = (pairs.map(person_window, name="q8_person_window")
                 .key_by("person_window")
                 .reduce(lambda first, later: first, emit="final", parallelism=2, name="q8_once"))
    return once.map(lambda b: b.select(["id", "name", "starttime"]), name="q8_project")


# -- q18: find the last bid ---------------------------------------------------------------------------------
# Each bidder's last bid on each auction they bid on.
#
#   SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank
#                  FROM bid) WHERE rank <= 1
#
# A keyed aggregation over a key made of both columns; "arg_max" without a third element keeps the whole row
# with the greatest date_time, as a struct, which the last step unpacks.

BID_COLUMNS = ["auction", "bidder", "price", "channel", "url", "date_time", "extra"]


def with_bidder_auction(bids: pa.RecordBatch) -> pa.RecordBatch:
    key = pc.add(pc.multiply(bids["bidder"], 1 << 32), bids["auction"])
    return bids.append_column("bidder_auction", key)


def unpack(rows: pa.RecordBatch) -> pa.RecordBatch:
    last = rows["last_bid"]
    return pa.record_batch([pc.struct_field(last, [name]) for name in BID_COLUMNS], names=BID_COLUMNS)


def q18(bids: chiray.Stream) -> chiray.Stream:
    return (bids.map(with_bidder_auction, name="q18_key")
                .key_by("bidder_auction")
                .agg(last_bid=("date_time", "arg_max"), emit="final", parallelism=2, name="q18_last_bid")
                .map(unpack, name="q18_unpack"))


# -- the job ------------------------------------------------------------------------------------------------

def main(num_events: int = 3_000) -> dict[str, pa.Table]:
    events = nexmark_events(num_events)
    flow = chiray.Dataflow("nexmark")
    watermarks = chiray.bounded_out_of_orderness("date_time", timedelta(seconds=4))  # NEXMark's: newest - 4 s
    streams = {kind: flow.source(chiray.from_arrow(table, batch_size=200), name=kind, watermarks=watermarks)
               for kind, table in events.items()}
    q5(streams["bid"]).sink(chiray.collect(), name="q5")
    q8(streams["person"], streams["auction"]).sink(chiray.collect(), name="q8")
    q18(streams["bid"]).sink(chiray.collect(), name="q18")
    job = chiray.submit(flow)
    job.wait(timeout=120)
    results = {query: job.result(query) for query in ("q5", "q8", "q18")}
    print(f"{num_events:,} events:", ", ".join(f"{kind} {table.num_rows}" for kind, table in events.items()))
    print("q5 hot items, the first windows:")
    print(results["q5"].sort_by([("window_start", "ascending"), ("auction", "ascending")])
                       .slice(0, 5).to_pandas().to_string(index=False))
    print("q8 new users who opened an auction at once:")
    print(results["q8"].sort_by([("starttime", "ascending"), ("id", "ascending")])
                       .slice(0, 5).to_pandas().to_string(index=False))
    print(f"q18: the last bid of {results['q18'].num_rows} (bidder, auction) pairs, e.g.")
    print(results["q18"].sort_by([("bidder", "ascending"), ("auction", "ascending")])
                        .select(["bidder", "auction", "price", "date_time"]).slice(0, 5).to_pandas()
                        .to_string(index=False))
    return results


if __name__ == "__main__":
    main()
