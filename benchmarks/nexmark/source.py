"""source.py: a replayable chiray ``Source`` over the NEXMark generator, and the same events as Parquet.

A split is a contiguous range of event numbers; its offset is the next event number to generate,
so a reader reopened at an offset (a restore) produces exactly what it would have produced.
Each of the three streams (person, auction, bid) is its own source over the same event numbers:
a reader generates only its kind's rows.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chiray import bounded_out_of_orderness
from chiray.operators.logic import Source, SourceSplit, SplitReader

from .generator import KINDS, SCHEMAS, NexmarkConfig, events

__all__ = ["NexmarkSource", "nexmark", "write_parquet", "WATERMARK_DELAY", "watermarks"]

WATERMARK_DELAY = datetime.timedelta(seconds=4)  # the reference's: event time minus 4 s


def watermarks() -> Any:
    """The reference's watermark strategy: ``date_time`` minus 4 s."""
    return bounded_out_of_orderness("date_time", WATERMARK_DELAY)


class _NexmarkReader(SplitReader):
    """Generates events ``[position, end)`` of one split, ``batch_events`` at a time."""

    def __init__(self, source: "NexmarkSource", span: tuple[int, int], position: int) -> None:
        self._src, (self._first, self._end), self._position = source, span, position
        self._t0 = time.monotonic()
        self._rate = None if source.rate is None else source.rate * (span[1] - span[0]) / max(source.num_events, 1)
        self._emitted = 0

    def ready_at(self) -> float | None:
        return None if self._rate is None else self._t0 + self._emitted / self._rate

    def read(self) -> pa.RecordBatch | None:
        if self._position >= self._end:
            return None
        stop = min(self._position + self._src.batch_events, self._end)
        batch = events(self._src.config, self._position, stop, (self._src.kind,))[self._src.kind]
        self._emitted += stop - self._position
        self._position = stop
        return batch

    def offset(self) -> int:
        return self._position


@dataclasses.dataclass(frozen=True)
class NexmarkSource(Source):
    """One NEXMark stream (``kind``: person, auction or bid) over events ``0 <= n < num_events``.

    Attributes:
        kind: which stream.
        num_events: events of all kinds (a bid source emits about 46/50 of them).
        config: the generator's configuration.
        batch_events: event numbers per generated batch.
        num_splits: event ranges (``None``: one per source instance).
        rate: events per second of wall-clock time over the whole source (``None``: unpaced).
    """

    kind: str
    num_events: int
    config: NexmarkConfig = NexmarkConfig()
    batch_events: int = 50_000
    num_splits: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"nexmark source: expected kind in {KINDS}, got {self.kind!r}")
        for name in ("num_events", "batch_events"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "num_events" else 1):
                raise ValueError(f"nexmark source: {name} must be a non-negative int (batch_events >= 1), "
                                 f"got {value!r}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"nexmark source: rate must be > 0 or None, got {self.rate!r}")

    def for_parallelism(self, parallelism: int) -> "NexmarkSource":
        return self if self.num_splits is not None else dataclasses.replace(self, num_splits=parallelism)

    def schema(self) -> pa.Schema:
        return SCHEMAS[self.kind]

    def splits(self) -> list[SourceSplit]:
        cuts = np.linspace(0, self.num_events, (self.num_splits or 1) + 1).astype(np.int64)
        return [SourceSplit(f"nexmark-{self.kind}-{i}", (int(a), int(b))) for i, (a, b) in
                enumerate(zip(cuts[:-1], cuts[1:]))]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        first, end = split.payload
        position = first if offset is None else int(offset)
        if not first <= position <= end:
            raise ValueError(f"nexmark source: offset {position} outside split {split.split_id} [{first}, {end})")
        return _NexmarkReader(self, (first, end), position)

    def bounded(self) -> bool:
        return True  # events [0, num_events)

    def describe(self) -> str:
        return f"nexmark({self.kind})"


def nexmark(kind: str, num_events: int, **options: Any) -> NexmarkSource:
    """The NEXMark ``kind`` stream over ``num_events`` events (options as :class:`NexmarkSource`)."""
    return NexmarkSource(kind, num_events, **options)


def write_parquet(directory: str, num_events: int, config: NexmarkConfig = NexmarkConfig(),
                  batch_events: int = 200_000) -> dict[str, str]:
    """Write events ``0 <= n < num_events`` as ``person.parquet``, ``auction.parquet`` and ``bid.parquet``.

    Returns:
        Each kind's file path.
    """
    os.makedirs(directory, exist_ok=True)
    paths = {kind: os.path.join(directory, f"{kind}.parquet") for kind in KINDS}
    writers = {kind: pq.ParquetWriter(paths[kind], SCHEMAS[kind]) for kind in KINDS}
    try:
        for first in range(0, num_events, batch_events):
            for kind, batch in events(config, first, min(first + batch_events, num_events)).items():
                writers[kind].write_batch(batch)
    finally:
        for writer in writers.values():
            writer.close()
    return paths
