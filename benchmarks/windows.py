"""windows.py: a keyed tumbling-window count by event time, its throughput and its window-result latency.

Pipeline: ``from_arrow`` source (parallelism 1, watermarks with bounded
out-of-orderness) -> ``key_by("key")`` -> ``window(tumbling(10 s), on="t")
.count()`` (parallelism 2) -> sink. Records are generated before timing:
100,000 string keys, event time ``t`` (milliseconds) advancing at
``--event-rate`` records per event-time second with a random delay of up to
``--disorder-ms`` (so the stream is out of order, but never beyond the
watermark's bound: no record is late).

Two runs:

* throughput: the source as fast as it is pulled; ``records_per_s`` and
  ``ratio`` to a single-threaded ``pyarrow`` group-by on (key, window) over
  the same batches, timed in this process; the result is checked against
  pandas.
* latency, at an offered rate (open loop, ``--rate`` records/s): for each
  window, from the moment the source's watermark passes its end to the
  moment its first result row reaches the sink (wall clocks of one machine);
  ``window_latency_p50_ms`` / ``window_latency_p99_ms``.

Expected on a 2-core machine: about a million records/s, ratio >= 0.1,
latency of tens of milliseconds.

Run: ``python -m benchmarks.windows [--quick] [--records N] [--rate R]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import emit, start_ray
from chiray.operators import Sink, SinkWriter, Source, SourceSplit, SplitReader

WINDOW_MS = 10_000


def make_batches(records: int, keys: int, event_rate: int, disorder_ms: int, batch_size: int,
                 seed: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(seed)
    names = pa.array([f"k{i}" for i in range(keys)])
    out = []
    for first in range(0, records, batch_size):
        n = min(batch_size, records - first)
        t = (np.arange(first, first + n) * 1000) // event_rate + rng.integers(0, disorder_ms + 1, n)
        out.append(pa.RecordBatch.from_arrays([names.take(pa.array(rng.integers(0, keys, n))), pa.array(t)],
                                              names=["key", "t"]))
    return out


def reference(batches: list[pa.RecordBatch], repeats: int = 3) -> float:
    """Best of ``repeats`` single-threaded pyarrow group-bys on (key, window) (seconds)."""
    table = pa.Table.from_batches(batches)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        t = table.column("t")
        start = pc.subtract(t, pc.subtract(t, pc.multiply(pc.divide(t, WINDOW_MS), WINDOW_MS)))
        (table.append_column("window_start", start)
         .group_by(["key", "window_start"], use_threads=False).aggregate([("t", "count")]))
        best = min(best, time.perf_counter() - t0)
    return best


class _PacedReader(SplitReader):
    def __init__(self, batches: list[pa.RecordBatch], rate: float, offset: int) -> None:
        self.batches, self.rate, self.i = batches, rate, offset or 0
        self.t0, self.rows = time.monotonic(), 0

    def read(self) -> pa.RecordBatch | None:
        if self.i >= len(self.batches):
            return None
        batch = self.batches[self.i]
        self.i += 1
        self.rows += batch.num_rows
        return batch

    def offset(self) -> int:
        return self.i

    def ready_at(self) -> float | None:
        return self.t0 + self.rows / self.rate if self.rate else None


class PacedSource(Source):
    """The batches in one split, at ``rate`` records/s (0: as fast as pulled)."""

    def __init__(self, batches: list[pa.RecordBatch], rate: float = 0) -> None:
        self.batches, self.rate = batches, rate

    def schema(self) -> pa.Schema:
        return self.batches[0].schema

    def splits(self) -> list[SourceSplit]:
        return [SourceSplit("paced-0", None)]

    def open_split(self, split: SourceSplit, offset: Any = None) -> SplitReader:
        return _PacedReader(self.batches, self.rate, offset)


class _ArrivalWriter(SinkWriter):
    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.rows: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        now = time.time()
        for end in pc.unique(batch.column("window_end")).to_pylist():
            self.first.setdefault(end, now)
        self.rows.append(batch)

    def finish(self) -> Any:
        return self.first, self.rows


class ArrivalSink(Sink):
    """Keeps the rows and, per window end, when its first row arrived (wall clock)."""

    def create_writer(self, info: Any) -> SinkWriter:
        return _ArrivalWriter()

    def combine(self, results: Any) -> Any:
        first: dict[int, float] = {}
        rows: list[pa.RecordBatch] = []
        for f, r in results:
            for end, at in f.items():
                first[end] = min(at, first.get(end, at))
            rows += r
        return first, pa.Table.from_batches(rows) if rows else None


def watermark_clock(delay_ms: int, log_path: str) -> Any:
    """A watermark function that also logs when the watermark passes each window end (wall clock)."""
    state = {"high": None, "passed": None}

    def fn(batch: pa.RecordBatch) -> int | None:
        high = pc.max(batch.column("t")).as_py()
        state["high"] = high if state["high"] is None else max(state["high"], high)
        mark = state["high"] - delay_ms - 1
        passed = (mark + 1) // WINDOW_MS * WINDOW_MS  # the largest window end with end - 1 <= mark
        if state["passed"] is None or passed > state["passed"]:
            with open(log_path, "a") as f:
                f.write(f"{passed} {time.time()}\n")
            state["passed"] = passed
        return mark

    return fn


def run_job(batches: list[pa.RecordBatch], parallelism: int, disorder_ms: int, rate: float,
            log_path: str, num_hosts: int | None = None) -> tuple[Any, float, int]:
    from chiray.operators import Dataflow, tumbling, watermarks_from

    flow = Dataflow("windows")
    (flow.source(PacedSource(batches, rate), name="source",
                 watermarks=watermarks_from(watermark_clock(disorder_ms, log_path)))
         .key_by("key").window(tumbling(WINDOW_MS), on="t").count(parallelism=parallelism, name="win")
         .sink(ArrivalSink(), name="out", parallelism=1))
    job = flow.submit(num_hosts=num_hosts)
    try:
        t0 = time.perf_counter()
        job.wait()
        elapsed = time.perf_counter() - t0
        late = sum(s.late_records for s in job.statistics().instances)
        return job.result("out"), elapsed, late
    finally:
        job.cancel()


def check(table: pa.Table, batches: list[pa.RecordBatch]) -> None:
    df = pa.Table.from_batches(batches).to_pandas()
    expected = df.groupby(["key", df["t"] // WINDOW_MS * WINDOW_MS]).size().sort_index()
    got = table.to_pandas().set_index(["key", "window_start"])["count"].sort_index()
    if not (got.index.equals(expected.index) and (got.values == expected.values).all()):
        raise SystemExit("windows: result differs from pandas")


def latencies(first: dict[int, float], log_path: str) -> list[float]:
    passed: dict[int, float] = {}
    with open(log_path) as f:
        for line in f:
            end, at = line.split()
            passed.setdefault(int(end), float(at))
    out = []
    for end, arrived in first.items():
        crossed = [at for e, at in passed.items() if e >= end]  # the first watermark at or past this end
        if crossed:
            out.append((arrived - min(crossed)) * 1000)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--event-rate", type=int, default=5_000, help="records per event-time second")
    parser.add_argument("--disorder-ms", type=int, default=2_000)
    parser.add_argument("--batch-size", type=int, default=100_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200_000, help="offered records/s of the latency run")
    parser.add_argument("--latency-records", type=int, default=600_000)
    parser.add_argument("--quick", action="store_true", help="1,000,000 records, a 300,000-record latency run")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N",
                        help="host processes of each job (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    records = 1_000_000 if args.quick else args.records
    lat_records = 300_000 if args.quick else args.latency_records
    print(f"generating {records:,} records, {args.keys:,} keys, disorder {args.disorder_ms} ms ...", flush=True)
    batches = make_batches(records, args.keys, args.event_rate, args.disorder_ms, args.batch_size, seed=1)
    ref_elapsed = reference(batches)
    print(f"  reference pyarrow group_by on (key, window) (1 thread, best of 3): "
          f"{records / ref_elapsed / 1e6:.2f} M records/s", flush=True)
    start_ray()
    with tempfile.TemporaryDirectory() as tmp:
        print("throughput run ...", flush=True)
        (_, table), elapsed, late = run_job(batches, args.parallelism, args.disorder_ms, 0,
                                            os.path.join(tmp, "throughput.log"), args.num_hosts)
        print(f"  {records / elapsed / 1e6:.2f} M records/s ({elapsed:.2f} s), {late} late records", flush=True)
        check(table, batches)
        print("  result matches pandas", flush=True)
        print(f"latency run at {args.rate:,.0f} records/s ...", flush=True)
        # Event time runs 5x faster than in the throughput run, so the short run spans many windows.
        small = make_batches(lat_records, args.keys, max(1, args.event_rate // 5), args.disorder_ms, 5_000, seed=2)
        log = os.path.join(tmp, "latency.log")
        (first, _), _, _ = run_job(small, args.parallelism, args.disorder_ms, args.rate, log, args.num_hosts)
        lat = latencies(first, log)
    p50, p99 = (float(np.percentile(lat, q)) for q in (50, 99)) if lat else (float("nan"),) * 2
    print(f"  window-result latency over {len(lat)} windows: p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)
    emit({
        "benchmark": "windows", "records": records, "keys": args.keys, "window_ms": WINDOW_MS, "num_hosts": args.num_hosts,
        "disorder_ms": args.disorder_ms, "parallelism": args.parallelism,
        "records_per_s": round(records / elapsed), "reference_records_per_s": round(records / ref_elapsed),
        "ratio": round(ref_elapsed / elapsed, 3), "late_records": late,
        "latency_rate": args.rate, "latency_windows": len(lat),
        "window_latency_p50_ms": round(p50, 1), "window_latency_p99_ms": round(p99, 1),
    })


if __name__ == "__main__":
    main()
