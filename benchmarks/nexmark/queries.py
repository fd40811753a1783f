"""queries.py: the NEXMark queries written with chiray's public API, as a user would write them.

Each ``qN(events, parallelism)`` builds its query on a new ``Dataflow`` and returns it with
one collecting sink named ``"out"``; the matching SQL (the nexmark-flink query text in
DuckDB's dialect) is in ``oracle.py``.

Example:
    >>> flow = q2(Events(100_000), parallelism=2)
    >>> [s for s in flow.graph.nodes][-1]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from chiray import Dataflow, Stream

from .generator import SCHEMAS, NexmarkConfig
from .source import NexmarkSource, watermarks

__all__ = ["Events", "QUERIES", "all_queries", "q0", "q1", "q2", "q3"]


@dataclasses.dataclass(frozen=True)
class Events:
    """Which events a query reads: ``0 <= n < num_events`` of the generator ``config``.

    ``rate`` paces the sources (events per wall-clock second, ``None``: as fast as pulled).
    """

    num_events: int
    config: NexmarkConfig = NexmarkConfig()
    batch_events: int = 50_000
    rate: float | None = None

    def bid_schema(self) -> pa.Schema:
        """The columns of the bid stream."""
        return SCHEMAS["bid"]

    def stream(self, flow: Dataflow, kind: str, parallelism: int) -> Stream:
        """The ``kind`` stream (person, auction, bid) as a source with the reference's watermarks."""
        source = NexmarkSource(kind, self.num_events, self.config, self.batch_events, rate=self.rate)
        return flow.source(source, parallelism=parallelism, name=kind, watermarks=watermarks())


def q0(events: Events, parallelism: int = 2) -> Dataflow:
    """Pass-through: every bid, unchanged (measures the runtime's overhead)."""
    flow = Dataflow("nexmark-q0")
    events.stream(flow, "bid", parallelism).map(lambda bids: bids, name="pass").collect(name="out")
    return flow


def _to_euro(bids: pa.RecordBatch) -> pa.RecordBatch:
    price = pc.multiply(pc.cast(bids.column("price"), pa.float64()), 0.908)
    return pa.record_batch([bids.column("auction"), bids.column("bidder"), price, bids.column("date_time")],
                           names=["auction", "bidder", "price", "date_time"])


def q1(events: Events, parallelism: int = 2) -> Dataflow:
    """Currency conversion: each bid's price in euros (0.908 per dollar)."""
    flow = Dataflow("nexmark-q1")
    events.stream(flow, "bid", parallelism).map(_to_euro, name="to_euro").collect(name="out")
    return flow


def _every_123rd(bids: pa.RecordBatch) -> pa.Array:
    auction = bids.column("auction").to_numpy()
    return pa.array(auction % 123 == 0)


def q2(events: Events, parallelism: int = 2) -> Dataflow:
    """Selection: the bids on auctions whose id is a multiple of 123 (auction, price)."""
    flow = Dataflow("nexmark-q2")
    (events.stream(flow, "bid", parallelism)
     .filter(_every_123rd, name="every_123rd")
     .map(lambda b: b.select(["auction", "price"]), name="project")
     .collect(name="out"))
    return flow


def _local_sellers(persons: pa.RecordBatch) -> pa.RecordBatch:
    mask = pc.is_in(persons.column("state"), pa.array(["OR", "ID", "CA"]))
    return persons.filter(mask).select(["id", "name", "city", "state"])


def _category_10(auctions: pa.RecordBatch) -> pa.RecordBatch:
    chosen = auctions.filter(pc.equal(auctions.column("category"), 10))
    return pa.record_batch([chosen.column("seller"), chosen.column("id")], names=["seller", "auction"])


def q3(events: Events, parallelism: int = 2) -> Dataflow:
    """Local item suggestion: sellers in OR, ID or CA with their auctions of category 10 (incremental join)."""
    flow = Dataflow("nexmark-q3")
    auctions = events.stream(flow, "auction", parallelism).map(_category_10, name="category_10")
    persons = events.stream(flow, "person", parallelism).map(_local_sellers, name="local_sellers")
    (auctions.connect(persons).key_by("seller", "id").join(name="join", parallelism=parallelism)
     .map(lambda b: b.select(["name", "city", "state", "auction"]), name="project")
     .collect(name="out"))
    return flow


QUERIES: dict[str, Callable[[Events, int], Dataflow]] = {"q0": q0, "q1": q1, "q2": q2, "q3": q3}


def all_queries() -> dict[str, Callable[[Events, int], Dataflow]]:
    """Every query built so far, by name (``q4``... live in ``stateful.py``)."""
    from . import more, stateful

    return {**QUERIES, "q4": stateful.q4, "q5": stateful.q5, "q7": stateful.q7, "q8": stateful.q8, **more.MORE}
