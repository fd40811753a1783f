"""generator.py: the deterministic, seedable, rate-controlled synthetic source (``generate``).

A split's offset counts the batches it has already emitted. Batch ``b`` of
split ``s`` depends only on ``(seed, s, b)`` (apart from its ``ts`` column), so
a reader reopened at an offset replays exactly what it would have emitted.

Example:
    >>> r = generate(25, batch_size=10).open_split(SourceSplit("generate-0", 0))
    >>> [r.read().num_rows for _ in range(3)]
    [10, 10, 5]
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chiray.operators.logic import Source, SourceSplit, SplitReader
from chiray.operators.validation import _require

__all__ = ["generate", "GenerateSource"]


class _ZipfSampler:
    """Maps uniform draws in ``[0, 1)`` to ranks ``0..num_keys-1`` with weight ``(rank+1)**-s``.

    Inverse-CDF sampling, exact; a guide table over ``2**16`` equal buckets of
    ``[0, 1)`` answers draws whose bucket lies within one rank without a
    binary search (most draws: the mass is on the few top ranks).
    """

    _BUCKETS = 1 << 16  # a power of two, so ``u * _BUCKETS`` is exact

    def __init__(self, num_keys: int, s: float) -> None:
        cdf = np.cumsum(np.arange(1, num_keys + 1, dtype=np.float64) ** -s)
        self._cdf = cdf / cdf[-1]
        self._last = num_keys - 1
        edges = self._rank(np.arange(self._BUCKETS + 1, dtype=np.float64) / self._BUCKETS)
        self._guide = edges[:-1]
        self._exact = edges[:-1] == edges[1:]

    def _rank(self, u: np.ndarray) -> np.ndarray:
        ranks = np.searchsorted(self._cdf, u, side="right")
        return np.minimum(ranks, self._last, out=ranks)

    def sample(self, u: np.ndarray) -> np.ndarray:
        """The rank of each draw in ``u`` (int64)."""
        bucket = np.minimum((u * self._BUCKETS).astype(np.int64), self._BUCKETS - 1)
        ranks = self._guide[bucket]
        slow = ~self._exact[bucket]
        ranks[slow] = self._rank(u[slow])
        return ranks.astype(np.int64, copy=False)


class RateSchedule:
    """A piecewise-constant rate: ``steps`` of ``(seconds since the split opened, records/s)``.

    ``offered(t)`` is how many records were due by ``t`` seconds; ``due(rows)`` the first time at which
    ``rows`` records were due (its inverse).
    """

    def __init__(self, steps: Sequence[tuple[float, float]]) -> None:
        self.starts = [float(t) for t, _ in steps]
        self.rates = [float(r) for _, r in steps]
        self.before = [0.0]  # records due at the start of each step
        for i in range(1, len(steps)):
            self.before.append(self.before[-1] + self.rates[i - 1] * (self.starts[i] - self.starts[i - 1]))

    def scaled(self, factor: float) -> "RateSchedule":
        return RateSchedule([(t, r * factor) for t, r in zip(self.starts, self.rates)])

    def offered(self, elapsed: float) -> float:
        i = max(0, bisect.bisect_right(self.starts, elapsed) - 1)
        return self.before[i] + self.rates[i] * max(0.0, elapsed - self.starts[i])

    def due(self, rows: float) -> float:
        for i, (start, rate) in enumerate(zip(self.starts, self.rates)):  # a few steps: a plain walk
            if self.before[i] >= rows:
                return start
            end = self.before[i + 1] if i + 1 < len(self.before) else math.inf
            if rate > 0 and end >= rows:
                return start + (rows - self.before[i]) / rate
        return math.inf


DICTIONARY_KEYS = 1 << 20
"""A reader of string keys takes each batch's keys from a dictionary of every key while there are at most this
many (0.1 ms per 5,000 keys from a dictionary of 100,000 here, 0.65 ms to format them); above, it formats
them per batch, which costs what a take from a dictionary of millions does (0.65-0.78 ms per 5,000), without
building it at every open: 1.3 s and 100 MB per reader at 8M keys, which a job restored at that size waited
for before its first record."""


def _string_keys(ids: pa.Array) -> pa.Array:
    """``"k<id>"`` for each id."""
    return pc.binary_join_element_wise("k", pc.cast(ids, pa.string()), "")


class _GenerateReader(SplitReader):
    """Emits the deterministic batches of one generator split; offset = batches emitted."""

    def __init__(self, source: GenerateSource, split: int, offset: int) -> None:
        self._src = source
        self._schema = source.schema()
        self._split = split
        self._batch_index = offset
        n, rem = divmod(source.num_records or 0, source.num_splits)
        self._total = None if source.num_records is None else n + (1 if split < rem else 0)
        self._rate = None if source.rate is None else source.rate / source.num_splits
        self._schedule = None if source.rate_steps is None else RateSchedule(source.rate_steps).scaled(
            1.0 / source.num_splits)
        self._t0 = source.clock()
        self._rows_since_open = 0
        self._keys = (source.key_dictionary() if source.key_type == "string" and source.num_keys <= DICTIONARY_KEYS
                      else None)
        self._zipf = _ZipfSampler(source.num_keys, source.zipf_s) if source.dist == "zipf" else None

    def ready_at(self) -> float | None:
        if self._schedule is not None:
            return self._t0 + self._schedule.due(self._rows_since_open)
        if self._rate is None:
            return None
        return self._t0 + self._rows_since_open / self._rate

    def backlog(self) -> int | None:
        """Records due by now (by the pacing) but not read yet; ``None`` when not paced."""
        elapsed = self._src.clock() - self._t0
        if self._schedule is not None:
            due = self._schedule.offered(elapsed)
        elif self._rate is not None:
            due = self._rate * elapsed
        else:
            return None
        if self._total is not None:
            emitted = min(self._batch_index * self._src.batch_size, self._total)
            due = min(due, self._total - emitted + self._rows_since_open)
        return max(0, int(due) - self._rows_since_open)

    def _key_column(self, rng: np.random.Generator, n: int) -> pa.Array:
        if self._zipf is None:
            ids = rng.integers(0, self._src.num_keys, n, dtype=np.int64)
        else:
            ids = self._zipf.sample(rng.random(n))
        if self._keys is not None:
            return self._keys.take(pa.array(ids))
        if self._src.key_type == "string":
            return _string_keys(pa.array(ids))
        return pa.array(ids.astype(np.int64, copy=False))

    def read(self) -> pa.RecordBatch | None:
        src, b = self._src, self._batch_index
        first = b * src.batch_size
        n = src.batch_size if self._total is None else min(src.batch_size, self._total - first)
        if n <= 0:
            return None
        rng = np.random.default_rng([src.seed, self._split, b])
        key = self._key_column(rng, n)
        value = rng.integers(0, 1_000_000, n, dtype=np.int64)
        seq = np.arange(first, first + n, dtype=np.int64)
        ts = np.full(n, time.time_ns(), dtype=np.int64).view("datetime64[ns]")
        self._batch_index += 1
        self._rows_since_open += n
        return pa.RecordBatch.from_arrays([key, pa.array(value), pa.array(seq), pa.array(ts)], schema=self._schema)

    def offset(self) -> int:
        return self._batch_index


@dataclasses.dataclass(frozen=True)
class GenerateSource(Source):
    """A deterministic, seedable, rate-controlled synthetic source (for benchmarks).

    Columns: ``key`` (``"k<id>"`` strings or int64 ids), ``value`` (int64),
    ``seq`` (per-split record sequence from 0) and ``ts`` (ingestion time,
    ``time.time_ns()`` when the batch is emitted). ``key``, ``value`` and
    ``seq`` of batch ``b`` of split ``s`` depend only on ``(seed, s, b)``.

    Pacing is open loop: batch ``j`` after ``open_split`` is due at
    ``t_open + rows_before_j / (rate / num_splits)`` (or when a rate schedule
    had offered that many rows); a reader that fell behind catches up at full
    speed, and ``backlog()`` says how far behind it is. Fields are as in
    :func:`generate`.
    """

    num_records: int | None
    rate: float | None
    batch_size: int
    num_keys: int
    dist: str
    zipf_s: float
    seed: int
    num_splits: int
    key_type: str
    clock: Callable[[], float] = time.monotonic
    rate_steps: tuple[tuple[float, float], ...] | None = None

    def schema(self) -> pa.Schema:
        key_type = pa.string() if self.key_type == "string" else pa.int64()
        return pa.schema(
            [("key", key_type), ("value", pa.int64()), ("seq", pa.int64()), ("ts", pa.timestamp("ns"))]
        )

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit(f"generate-{i}", i) for i in range(self.num_splits)]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        offset = 0 if offset is None else int(offset)
        if offset < 0 or not 0 <= split.payload < self.num_splits:
            raise ValueError(
                f"generate: expected a split index in [0, {self.num_splits}) and an offset >= 0, "
                f"got split {split.payload!r} and offset {offset}"
            )
        return _GenerateReader(self, int(split.payload), offset)

    def key_dictionary(self) -> pa.Array:
        """The string keys ``["k0", "k1", ...]``, built vectorised."""
        return _string_keys(pa.array(np.arange(self.num_keys, dtype=np.int64)))

    def bounded(self) -> bool:
        """``generate(None)`` never ends."""
        return self.num_records is not None

    def describe(self) -> str:
        return f"generate({self.dist})"


def generate(
    num_records: int | None,
    *,
    rate: float | Sequence[tuple[float, float]] | None = None,
    batch_size: int = 10_000,
    num_keys: int = 100_000,
    dist: str = "uniform",
    zipf_s: float = 1.1,
    seed: int = 0,
    num_splits: int = 1,
    key_type: str = "string",
    clock: Callable[[], float] = time.monotonic,
) -> Source:
    """A synthetic source for benchmarks: deterministic, seedable, optionally rate-limited.

    Args:
        num_records: total records over all splits; ``None``: unbounded.
        rate: records per second for the whole source (split evenly across
            splits); or a schedule, ``[(0, 1000), (30, 3000), (60, 1000)]``: from
            each time (seconds since a split opened) on, that rate; ``None``: as
            fast as it is pulled.
        batch_size: records per batch.
        num_keys: keys are drawn from ``num_keys`` distinct values.
        dist: ``"uniform"`` or ``"zipf"`` (rank ``r`` has weight ``(r+1)**-zipf_s``).
        zipf_s: the Zipf exponent.
        seed: the random seed.
        num_splits: number of splits.
        key_type: ``"string"`` (``"k123"``) or ``"int"`` (int64).
        clock: the monotonic clock used for pacing (injectable for tests).

    Returns:
        A source whose split offsets count batches already emitted.

    Raises:
        ValueError: an argument is out of range (naming it and its value).

    Example:
        >>> r = generate(25, batch_size=10).open_split(SourceSplit("generate-0", 0))
        >>> [r.read().num_rows for _ in range(3)]
        [10, 10, 5]
    """
    _require("generate: num_records", num_records, minimum=0, allow_none=True)
    steps = None
    if rate is not None and not isinstance(rate, (int, float)):
        steps = _check_schedule(rate)
        rate = steps[0][1]
    _require("generate: rate", rate, integer=False, allow_none=True)
    _require("generate: batch_size", batch_size)
    _require("generate: num_keys", num_keys)
    _require("generate: num_splits", num_splits)
    _require("generate: zipf_s", zipf_s, integer=False)
    if dist not in ("uniform", "zipf"):
        raise ValueError(f"generate: dist must be 'uniform' or 'zipf', got {dist!r}")
    if key_type not in ("string", "int"):
        raise ValueError(f"generate: key_type must be 'string' or 'int', got {key_type!r}")
    return GenerateSource(
        None if num_records is None else int(num_records),
        None if rate is None else float(rate),
        int(batch_size), int(num_keys), dist, float(zipf_s), int(seed), int(num_splits), key_type, clock, steps,
    )


def _check_schedule(rate: Any) -> tuple[tuple[float, float], ...]:
    try:
        steps = tuple((float(t), float(r)) for t, r in rate)
    except (TypeError, ValueError):
        raise TypeError(f"generate: rate must be a number or a list of (seconds, records/s) steps, "
                        f"got {rate!r}") from None
    if not steps or steps[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(steps, steps[1:])) \
            or any(r < 0 for _, r in steps):
        raise ValueError(f"generate: a rate schedule starts at 0 s, its times increase and its rates are "
                         f">= 0, got {list(rate)}")
    return steps
