"""The NEXMark generator against the reference's definitions, its determinism by event number, and its source."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.nexmark.generator import KINDS, NexmarkConfig, events
from benchmarks.nexmark.source import NexmarkSource, write_parquet
from chiray.operators.logic import SourceSplit

N = 1_000_000
CFG = NexmarkConfig()


@pytest.fixture(scope="module")
def million():
    return {k: b.to_pandas() for k, b in events(CFG, 0, N).items()}


def test_event_mix_is_1_3_46_and_ids_are_consecutive_from_1000(million):
    person, auction, bid = million["person"], million["auction"], million["bid"]
    assert (len(person), len(auction), len(bid)) == (N // 50, 3 * N // 50, 46 * N // 50)
    assert person["id"].tolist() == list(range(1000, 1000 + N // 50))
    assert auction["id"].tolist() == list(range(1000, 1000 + 3 * N // 50))
    assert set(auction["category"]) == {10, 11, 12, 13, 14}
    assert (auction["expires"] > auction["date_time"]).all()
    assert (auction["reserve"] > auction["initial_bid"]).all()
    # a bid names an auction at most 10 ahead of the last one created (the reference's id lead)
    assert bid["auction"].min() >= 1000 and bid["auction"].max() <= 1000 + 3 * N // 50 + 10
    assert bid["bidder"].min() >= 1000 and bid["bidder"].max() <= 1000 + N // 50 + 10


def test_hot_ratios_match_the_reference(million):
    auction, bid = million["auction"], million["bid"]
    # a hot id is a multiple of 100 (+1 for bidders); a cold one lands there 1 time in 100
    hot_auctions = ((bid["auction"] - 1000) % 100 == 0).mean()
    hot_bidders = ((bid["bidder"] - 1000) % 100 == 1).mean()
    hot_sellers = ((auction["seller"] - 1000) % 100 == 0).mean()
    assert hot_auctions == pytest.approx(0.5 + 0.5 / 100, abs=0.01)
    assert hot_bidders == pytest.approx(0.75 + 0.25 / 100, abs=0.01)
    assert hot_sellers == pytest.approx(0.75 + 0.25 / 100, abs=0.01)
    hot_channel = bid["channel"].isin(["Google", "Facebook", "Baidu", "Apple"]).mean()
    assert hot_channel == pytest.approx(0.99, abs=0.005)


def test_prices_are_log_uniform_over_six_decades(million):
    exponent = np.log10(million["bid"]["price"].to_numpy() / 100.0)
    assert exponent.min() >= 0 and exponent.max() <= 6.0001
    quartiles = np.quantile(exponent, [0.25, 0.5, 0.75])
    assert quartiles == pytest.approx([1.5, 3.0, 4.5], abs=0.03)


def test_record_sizes_average_the_reference_sizes(million):
    for kind, average in (("person", 200), ("auction", 500), ("bid", 100)):
        frame = million[kind]  # the reference's size: string lengths plus 8 bytes per number or time
        size = sum(frame[c].str.len().sum() if pd.api.types.is_string_dtype(frame[c]) else 8 * len(frame) for c in frame)
        assert size / len(frame) == pytest.approx(average, rel=0.1), kind


def test_timestamps_follow_the_event_rate():
    cfg = NexmarkConfig(event_rate=1000)
    bid = events(cfg, 0, 10_000)["bid"].to_pandas()
    seconds = (bid["date_time"].max() - bid["date_time"].min()).total_seconds()
    assert seconds == pytest.approx(10.0, abs=0.01)


def test_disjoint_ranges_equal_one_range():
    whole = events(CFG, 0, 30_000)
    parts = [events(CFG, a, b) for a, b in ((0, 7_777), (7_777, 20_001), (20_001, 30_000))]
    for kind in KINDS:
        assert pa.Table.from_batches([p[kind] for p in parts]).equals(pa.Table.from_batches([whole[kind]]))


def test_other_seeds_give_other_events():
    a = events(CFG, 0, 5_000)["bid"]
    b = events(NexmarkConfig(seed=1), 0, 5_000)["bid"]
    assert a.column("auction").to_pylist() != b.column("auction").to_pylist()


def _read_all(source: NexmarkSource, split: SourceSplit, offset=None) -> pa.Table:
    reader = source.open_split(split, offset)
    batches = []
    while (batch := reader.read()) is not None:
        batches.append(batch)
    return pa.Table.from_batches(batches, source.schema())


def test_source_splits_replay_from_an_offset_and_match_parquet(tmp_path):
    source = NexmarkSource("bid", 40_000, batch_events=3_000).for_parallelism(3)
    splits = source.splits()
    assert len(splits) == 3
    first = source.open_split(splits[1])
    first.read()
    resumed = _read_all(source, splits[1], first.offset())
    whole = pa.concat_tables([_read_all(source, s) for s in splits])
    paths = write_parquet(str(tmp_path), 40_000, batch_events=9_000)
    assert pq.read_table(paths["bid"]).equals(whole)
    start, _ = splits[1].payload
    expected = pa.Table.from_batches([events(CFG, first.offset(), splits[1].payload[1], ("bid",))["bid"]])
    assert resumed.equals(expected) and first.offset() == start + 3_000


def test_source_rejects_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        NexmarkSource("bids", 10)
    with pytest.raises(ValueError, match="num_events"):
        NexmarkSource("bid", -1)
    with pytest.raises(ValueError, match="outside split"):
        NexmarkSource("bid", 100).open_split(SourceSplit("s", (0, 100)), 101)
