"""A checkpoint encodes the rows of many bins at once (``CopiedRows.encode``): the columns are converted once
and each bin is a slice of them. Every bin must decode to what the one-bin encoder (``encode_columnar_bin``)
gives for the same rows: keys copied in chunks, bins without rows, bins with deleted keys (TTL expiry, moves)
beside bins without, touches. And the encoding keeps to its share of its thread's time (``Pacer``).
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

from chiray.operators import rowcapture
from chiray.operators.accumulators import Accumulator
from chiray.operators.rowcapture import Foreground, Pacer
from chiray.operators.statecodec import TOUCHED, CopiedRows, decode_columnar_bin, encode_columnar_bin

BINS = 8
ACCS = (Accumulator("n", "sum", "int64"), Accumulator("hi", "max", "float64"))
LAYOUT = (pa.string(), ACCS, b"meta")


def _decoded(payload: bytes, b: int) -> tuple:
    got = decode_columnar_bin(payload, b, BINS)
    deleted = None if got.deleted is None else got.deleted.to_pylist()
    touched = None if got.touched is None else got.touched.tolist()
    return got.version, got.rows.to_pylist(), touched, deleted


@pytest.mark.parametrize("touches", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_each_bin_decodes_as_the_one_bin_encoder_writes_it(touches: bool, chunked: bool) -> None:
    rng = np.random.default_rng(7)
    row_bins = np.sort(rng.choice([0, 1, 3, 4, 6], 200))  # bins 2, 5 and 7 have no rows
    keys = pa.array([f"k{i}" for i in range(len(row_bins))])
    cols = {"n": rng.integers(0, 100, len(row_bins)), "hi": rng.random(len(row_bins))}
    if touches:
        cols[TOUCHED] = rng.integers(0, 10**9, len(row_bins))
    deleted = pa.array(["gone-a", "gone-b", "gone-c"])
    deleted_bins = np.array([4, 5, 4])  # bin 4 has rows and deletions, bin 5 only deletions
    versions = {b: 10 + b for b in range(BINS)}
    copied_keys = pa.chunked_array([keys.slice(0, 77), keys.slice(77)]) if chunked else keys
    out = CopiedRows(BINS, LAYOUT, versions, row_bins, copied_keys, cols, deleted, deleted_bins).encode()
    assert sorted(out) == list(range(BINS))
    for b in range(BINS):
        mine = row_bins == b
        gone = deleted.filter(pa.array(deleted_bins == b))
        expected = encode_columnar_bin(BINS, b, versions[b], LAYOUT, keys.filter(pa.array(mine)),
                                       {n: c[mine] for n, c in cols.items()}, gone if len(gone) else None)
        assert _decoded(out[b], b) == _decoded(expected, b), f"bin {b}"
    # the oracle, plainly: bin 4's rows are its keys, after the two keys deleted from it
    version, rows, _, dead = _decoded(out[4], 4)
    assert version == 14 and dead == ["gone-a", "gone-c"]
    assert [r["key"] for r in rows] == [k for k, b in zip(keys.to_pylist(), row_bins) if b == 4]
    assert [r["acc0"] for r in rows] == [int(n) for n, b in zip(cols["n"], row_bins) if b == 4]


class FakeTime:
    """``time`` for ``rowcapture``: work advances it by hand, sleeps by what they sleep."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def test_the_pacer_rests_so_that_work_takes_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(rowcapture, "time", clock)
    pacer = Pacer(0.25, min_s=0.002)
    worked, rests = 0.0, 0
    for step in range(40):
        clock.now += 0.0005 * (1 + step % 4)  # pieces of work of 0.5 to 2 ms
        worked += 0.0005 * (1 + step % 4)
        before = clock.slept
        pacer.rest()
        rests += clock.slept > before
    # three times the work in rests (a quarter of the time is work), but for the work since the last rest,
    # which is under min_s; and no rest after each small piece
    assert 3 * (worked - 0.002) - 1e-9 <= clock.slept <= 3 * worked + 1e-9
    assert 10 <= rests < 40
    assert pacer.rested_s == pytest.approx(clock.slept)


def test_a_pacer_at_a_full_share_never_rests(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(rowcapture, "time", clock)
    pacer = Pacer(1.0)
    clock.now += 1.0
    pacer.rest()
    assert clock.slept == 0.0
    with pytest.raises(ValueError, match="share"):
        Pacer(0.0)


class BusyForeground:
    """A processing thread busy for ``busy_s`` more seconds of ``clock`` (then idle)."""

    def __init__(self, clock: FakeTime, busy_s: float) -> None:
        self.clock, self.until = clock, clock.now + busy_s

    def wait_idle(self, timeout: float) -> float:
        waited = min(timeout, max(0.0, self.until - self.clock.now))
        self.clock.now += waited
        return waited


@pytest.mark.parametrize("busy_s", [0.0, 0.05, 10.0], ids=["idle", "busy a while", "always busy"])
def test_while_the_processing_thread_is_busy_the_pacer_waits_for_it_down_to_its_floor(
        monkeypatch: pytest.MonkeyPatch, busy_s: float) -> None:
    clock = FakeTime()
    monkeypatch.setattr(rowcapture, "time", clock)
    start = clock.now
    foreground = BusyForeground(clock, busy_s)
    pacer = Pacer(0.5, min_s=0.0, floor=0.1, foreground=foreground)
    worked = 0.0
    for _ in range(100):
        clock.now += 0.002  # a chunk of work
        worked += 0.002
        pacer.rest()
    elapsed = clock.now - start
    if busy_s == 0.0:  # idle: the share alone (half the time is work)
        assert elapsed == pytest.approx(2 * worked)
    elif busy_s > elapsed:  # never idle: the floor (a tenth of the time is work)
        assert elapsed == pytest.approx(10 * worked)
    else:  # it waited until the processing thread went idle, then went on at its share
        assert busy_s <= elapsed < busy_s + 2 * worked
        assert 2 * worked < elapsed < 10 * worked
    assert pacer.rested_s == pytest.approx(elapsed - worked)


def test_a_floor_above_the_share_is_refused() -> None:
    with pytest.raises(ValueError, match="floor"):
        Pacer(0.25, floor=0.5)


def test_a_wait_for_the_foreground_ends_when_it_goes_idle() -> None:
    foreground = Foreground()
    assert foreground.wait_idle(60.0) == 0.0  # a process without a host: never waits
    foreground.busy()
    assert foreground.wait_idle(0.0) < 5.0  # busy, but no time to wait: it does not block
    waited: list[float] = []
    waiter = threading.Thread(target=lambda: waited.append(foreground.wait_idle(60.0)))
    waiter.start()
    foreground.idle()
    waiter.join(timeout=30.0)
    assert not waiter.is_alive() and waited and waited[0] < 30.0
