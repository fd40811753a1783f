"""hashing.py: rows/s of the stable key hash that routes records to bins (``bins_of``), one core.

String keys (``user-00000042``) and int64 keys, ``--distinct`` distinct values
among ``--rows`` rows, best of 5. Expected on a 2-core machine: about 12M
rows/s for strings and 120M rows/s for int64.

Run: ``python -m benchmarks.hashing [--quick] [--rows N] [--distinct N]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from benchmarks.common import emit
from chiray.operators.hashing import DEFAULT_NUM_BINS, bins_of


def measure(rows: int, distinct: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    vocab = np.array([f"user-{i:08d}" for i in range(distinct)], dtype=object)
    columns = {"string": pa.array(vocab[rng.integers(0, distinct, rows)].tolist()),
               "int64": pa.array(rng.integers(0, distinct, rows))}
    figures = {}
    for name, column in columns.items():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            bins_of(column, DEFAULT_NUM_BINS)
            best = min(best, time.perf_counter() - start)
        figures[f"{name}_rows_per_s"] = round(rows / best)
        print(f"  {name}: {rows / best / 1e6:.1f} M rows/s", flush=True)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--distinct", type=int, default=100_000)
    args = parser.parse_args(argv)
    rows = 100_000 if args.quick else args.rows
    print(f"hashing {rows:,} keys ({args.distinct:,} distinct) into {DEFAULT_NUM_BINS} bins ...", flush=True)
    emit({"benchmark": "hashing", "rows": rows, "distinct": args.distinct, **measure(rows, args.distinct)})


if __name__ == "__main__":
    main()
