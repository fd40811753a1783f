"""generator.py: the NEXMark event generator, vectorised and deterministic by event number.

The definitions follow the reference generator (nexmark-flink's ``NexmarkGenerator`` and
``GeneratorConfig``, the same as Beam's): event ``n`` is a person when ``n % 50 < 1``, an
auction when ``< 4``, else a bid (1:3:46); person and auction ids start at 1000; 3 of 4
auctions go to a hot seller, 1 of 2 bids to a hot auction, 3 of 4 bids come from a hot
bidder; prices are ``round(10 ** (6 u) * 100)`` cents; an auction expires within twice the
time 100 auctions take to be created; categories are 10-14; each record is padded with
``extra`` to about the reference's average size (person 200, auction 500, bid 100 bytes).

Bidder ids follow Beam's convention: a hot bidder is ``(last_person // 100) * 100 + 1``,
plus ``FIRST_PERSON_ID`` once (nexmark-flink adds the first id on a different line; the
two differ by one ``FIRST_PERSON_ID`` in the hot bidder's offset).

Randomness is counter-based (a SplitMix64 hash of seed, event number and field), not a
sequential generator, so any range of events is generated on its own and equals the same
range cut out of a larger one: splits and replays need no state but an event number.

Example:
    >>> gen = NexmarkConfig()
    >>> events(gen, 0, 50)["bid"].num_rows
    46
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["NexmarkConfig", "events", "event_kind", "SCHEMAS", "KINDS"]

PERSON_PROPORTION, AUCTION_PROPORTION, TOTAL_PROPORTION = 1, 3, 50
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO, HOT_SELLER_RATIO, HOT_BIDDER_RATIO = 100, 100, 100
PERSON_ID_LEAD, AUCTION_ID_LEAD = 10, 10
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
HOT_URLS = tuple(f"https://www.nexmark.com/{c.lower()}/item.htm?query=1" for c in HOT_CHANNELS)
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle",
             "Kent", "Cheyenne")
KINDS = ("person", "auction", "bid")
TS = pa.timestamp("ms")
SCHEMAS = {
    "person": pa.schema([("id", pa.int64()), ("name", pa.string()), ("email_address", pa.string()),
                         ("credit_card", pa.string()), ("city", pa.string()), ("state", pa.string()),
                         ("date_time", TS), ("extra", pa.string())]),
    "auction": pa.schema([("id", pa.int64()), ("item_name", pa.string()), ("description", pa.string()),
                          ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("date_time", TS),
                          ("expires", TS), ("seller", pa.int64()), ("category", pa.int64()),
                          ("extra", pa.string())]),
    "bid": pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                      ("channel", pa.string()), ("url", pa.string()), ("date_time", TS), ("extra", pa.string())]),
}
_POOL = np.random.default_rng(20240601).integers(ord("a"), ord("z") + 1, 1 << 20, dtype=np.uint8)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclasses.dataclass(frozen=True)
class NexmarkConfig:
    """What the generated events depend on.

    Attributes:
        event_rate: events per second of event time (the reference's ``firstEventRate``):
            event ``n`` happens at ``base_time_ms + n * 1000 / event_rate`` ms.
        base_time_ms: the first event's time (ms since the epoch).
        num_in_flight_auctions: auctions open at once (the expiry horizon).
        num_active_people: people a new bid or auction picks among.
        hot_auction_ratio, hot_seller_ratio, hot_bidder_ratio: 1 in ``ratio`` is not hot.
        seed: the random seed (0 for every test and benchmark unless said).
    """

    event_rate: int = 10_000
    base_time_ms: int = 1_700_000_000_000
    num_in_flight_auctions: int = 100
    num_active_people: int = 1000
    hot_auction_ratio: int = 2
    hot_seller_ratio: int = 4
    hot_bidder_ratio: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or (value <= 0 and field.name not in ("seed", "base_time_ms")):
                raise ValueError(f"NexmarkConfig.{field.name}: expected a positive int, got {value!r}")

    def timestamp_ms(self, n: np.ndarray) -> np.ndarray:
        """Each event's time in ms (int64), from its number."""
        return self.base_time_ms + (n * 1000) // self.event_rate


def event_kind(n: np.ndarray) -> np.ndarray:
    """0 (person), 1 (auction) or 2 (bid) for each event number."""
    rem = n % TOTAL_PROPORTION
    return np.where(rem < PERSON_PROPORTION, 0, np.where(rem < PERSON_PROPORTION + AUCTION_PROPORTION, 1, 2))


def _hash(seed: int, n: np.ndarray, field: int) -> np.ndarray:
    """SplitMix64 of (seed, event, field): 64 random bits per event, uint64."""
    with np.errstate(over="ignore"):
        z = n.astype(np.uint64) * np.uint64(64) + np.uint64(field) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z + np.uint64(0x9E3779B97F4A7C15)) & _M64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _M64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _M64
        return z ^ (z >> np.uint64(31))


def _uniform(seed: int, n: np.ndarray, field: int) -> np.ndarray:
    return (_hash(seed, n, field) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _below(seed: int, n: np.ndarray, field: int, bound: np.ndarray | int) -> np.ndarray:
    """A uniform int64 in ``[0, bound)`` per event."""
    return np.minimum((_uniform(seed, n, field) * bound).astype(np.int64), np.asarray(bound) - 1)


def _strings(seed: int, n: np.ndarray, field: int, lengths: np.ndarray) -> pa.Array:
    """Random lowercase strings of the given lengths, cut from a fixed pool at a random place."""
    lengths = lengths.astype(np.int64)
    offsets = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = _below(seed, n, field, len(_POOL) - 512)
    index = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
    data = _POOL[index]
    return pa.LargeStringArray.from_buffers(len(n), pa.py_buffer(offsets), pa.py_buffer(data)).cast(pa.string())


def _pick(seed: int, n: np.ndarray, field: int, words: tuple[str, ...]) -> pa.Array:
    return pa.array(words).take(pa.array(_below(seed, n, field, len(words))))


def _extra(seed: int, n: np.ndarray, field: int, size: np.ndarray, average: int) -> pa.Array:
    """Padding so a record is about ``average`` bytes: 80%-120% of what is missing."""
    missing = np.maximum(average - size, 0)
    jitter = _uniform(seed, n, field)
    return _strings(seed, n, field + 1, np.round(missing * (0.8 + 0.4 * jitter)).astype(np.int64))


def _last_person(n: np.ndarray) -> np.ndarray:
    """The base-0 id of the last person created at or before event ``n``."""
    epoch, offset = np.divmod(n, TOTAL_PROPORTION)
    return epoch * PERSON_PROPORTION + np.minimum(offset, PERSON_PROPORTION - 1)


def _last_auction(n: np.ndarray) -> np.ndarray:
    """The base-0 id of the last auction created at or before event ``n`` (-1 before the first)."""
    epoch, offset = np.divmod(n, TOTAL_PROPORTION)
    before = offset < PERSON_PROPORTION
    epoch = np.where(before, epoch - 1, epoch)
    offset = np.where(before | (offset >= PERSON_PROPORTION + AUCTION_PROPORTION), AUCTION_PROPORTION - 1,
                      offset - PERSON_PROPORTION)
    return epoch * AUCTION_PROPORTION + offset


def _next_person(cfg: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    """A base-0 person id among the recently active ones (a few not created yet, as the reference)."""
    num_people = _last_person(n) + 1
    active = np.minimum(num_people, cfg.num_active_people)
    return num_people - active + _below(cfg.seed, n, field, active + PERSON_ID_LEAD)


def _next_auction(cfg: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    """A base-0 auction id among those in flight (a few not created yet, as the reference)."""
    last = _last_auction(n)
    low = np.maximum(last - cfg.num_in_flight_auctions, 0)
    return low + _below(cfg.seed, n, field, last - low + 1 + AUCTION_ID_LEAD)


def _price(cfg: NexmarkConfig, n: np.ndarray, field: int) -> np.ndarray:
    return np.round(10.0 ** (_uniform(cfg.seed, n, field) * 6.0) * 100.0).astype(np.int64)


def _lengths(array: pa.Array) -> np.ndarray:
    return pc.utf8_length(array).to_numpy(zero_copy_only=False).astype(np.int64)


def persons(cfg: NexmarkConfig, n: np.ndarray) -> pa.RecordBatch:
    """The person events numbered ``n`` (every one a person event)."""
    s = cfg.seed
    name = pc.binary_join_element_wise(_pick(s, n, 1, FIRST_NAMES), _pick(s, n, 2, LAST_NAMES), " ")
    email = pc.binary_join_element_wise(_strings(s, n, 3, np.full(len(n), 7)), _strings(s, n, 4, np.full(len(n), 5)),
                                        pa.scalar("@"))
    email = pc.binary_join_element_wise(email, ".com", "")
    groups = [pc.cast(pa.array(1000 + _below(s, n, 20 + g, 9000)), pa.string()) for g in range(4)]
    card = pc.binary_join_element_wise(*groups, " ")
    city, state = _pick(s, n, 6, US_CITIES), _pick(s, n, 7, US_STATES)
    size = 8 + 8 + _lengths(name) + _lengths(email) + _lengths(card) + _lengths(city) + _lengths(state)
    columns = [pa.array(_last_person(n) + FIRST_PERSON_ID), name, email, card, city, state,
               pa.array(cfg.timestamp_ms(n), TS), _extra(s, n, 8, size, 200)]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMAS["person"])


def auctions(cfg: NexmarkConfig, n: np.ndarray) -> pa.RecordBatch:
    """The auction events numbered ``n``."""
    s = cfg.seed
    hot = _below(s, n, 1, cfg.hot_seller_ratio) > 0
    seller = np.where(hot, (_last_person(n) // HOT_SELLER_RATIO) * HOT_SELLER_RATIO, _next_person(cfg, n, 2))
    initial = _price(cfg, n, 3)
    ts = cfg.timestamp_ms(n)
    events_per_horizon = cfg.num_in_flight_auctions * TOTAL_PROPORTION // AUCTION_PROPORTION
    horizon = cfg.timestamp_ms(n + events_per_horizon) - ts
    expires = ts + 1 + _below(s, n, 4, np.maximum(horizon * 2, 1))
    item, description = _strings(s, n, 5, np.full(len(n), 20)), _strings(s, n, 6, np.full(len(n), 100))
    columns = [pa.array(_last_auction(n) + FIRST_AUCTION_ID), item, description, pa.array(initial),
               pa.array(initial + _price(cfg, n, 7)), pa.array(ts, TS), pa.array(expires, TS),
               pa.array(seller + FIRST_PERSON_ID), pa.array(FIRST_CATEGORY_ID + _below(s, n, 8, NUM_CATEGORIES)),
               _extra(s, n, 9, 8 * 7 + 20 + 100, 500)]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMAS["auction"])


def bids(cfg: NexmarkConfig, n: np.ndarray) -> pa.RecordBatch:
    """The bid events numbered ``n``."""
    s = cfg.seed
    hot_auction = _below(s, n, 1, cfg.hot_auction_ratio) > 0
    auction = np.where(hot_auction, (_last_auction(n) // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
                       _next_auction(cfg, n, 2))
    hot_bidder = _below(s, n, 3, cfg.hot_bidder_ratio) > 0
    bidder = np.where(hot_bidder, (_last_person(n) // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1,
                      _next_person(cfg, n, 4))
    hot_channel = _below(s, n, 5, 100) > 0
    which = pa.array(_below(s, n, 6, len(HOT_CHANNELS)))
    cold = pc.binary_join_element_wise("channel-", pc.cast(pa.array(_below(s, n, 7, 10_000)), pa.string()), "")
    channel = pc.if_else(pa.array(hot_channel), pa.array(HOT_CHANNELS).take(which), cold)
    cold_url = pc.binary_join_element_wise("https://www.nexmark.com/", _strings(s, n, 8, np.full(len(n), 5)),
                                           "/item.htm?query=1", "")
    url = pc.if_else(pa.array(hot_channel), pa.array(HOT_URLS).take(which), cold_url)
    columns = [pa.array(auction + FIRST_AUCTION_ID), pa.array(bidder + FIRST_PERSON_ID),
               pa.array(_price(cfg, n, 9)), channel, url, pa.array(cfg.timestamp_ms(n), TS),
               _extra(s, n, 10, 8 * 4 + _lengths(channel) + _lengths(url), 100)]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMAS["bid"])


_MAKERS = {"person": persons, "auction": auctions, "bid": bids}


def events(cfg: NexmarkConfig, first: int, end: int, kinds: tuple[str, ...] = KINDS) -> dict[str, pa.RecordBatch]:
    """Events ``first <= n < end``, one batch per kind asked for (in event order)."""
    if not 0 <= first <= end:
        raise ValueError(f"nexmark events: expected 0 <= first <= end, got first={first}, end={end}")
    n = np.arange(first, end, dtype=np.int64)
    kind = event_kind(n)
    out = {}
    for k in kinds:
        if k not in _MAKERS:
            raise ValueError(f"nexmark events: expected a kind in {KINDS}, got {k!r}")
        out[k] = _MAKERS[k](cfg, n[kind == KINDS.index(k)])
    return out
