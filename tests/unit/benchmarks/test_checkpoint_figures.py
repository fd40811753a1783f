"""The checkpoint benchmark's split of its window's latency by the kind of checkpoint that ran."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.checkpoint import full_copy_spans, split_by_full_copies


def nearest_rank_p99(latencies_ms: list[float]) -> float | None:
    if not latencies_ms:
        return None
    ordered = sorted(latencies_ms)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


def test_records_ingested_while_a_full_copy_ran_are_told_apart_from_the_others():
    rng = np.random.default_rng(7)
    ms = 1_000_000
    window = (0, 10_000 * ms)
    spans = [(i * 1_000 * ms, (i * 1_000 + 250) * ms) for i in range(10)]
    spans[3] = (3_000 * ms, 5_900 * ms)  # two checkpoints that copied bins whole, each longer
    spans[7] = (7_000 * ms, 9_400 * ms)
    sizes = [8_000_000 + int(rng.integers(0, 400_000)) for _ in spans]
    sizes[3], sizes[7] = 160_000_000, 158_000_000
    w = {"span": window, "spans": spans, "bytes": sizes}

    ingested = rng.integers(-200 * ms, 10_200 * ms, 3_000)
    latency = rng.integers(5 * ms, 300 * ms, 3_000)
    rows = rng.integers(1, 5, 3_000)
    samples = np.stack([ingested + latency, latency, rows], axis=1).astype(np.int64)

    during, other = [], []
    for t, lat, n in zip(ingested, latency, rows):
        if not window[0] <= t + lat < window[1]:
            continue  # arrived outside the window
        full = any(lo <= t < hi for lo, hi in (spans[3], spans[7]))
        (during if full else other).extend([lat / ms] * int(n))

    assert full_copy_spans(w) == [spans[3], spans[7]]
    figures = split_by_full_copies(w, samples)
    assert figures["checkpoints_full"] == 2
    assert figures["full_copy_s"] == 5.3
    assert figures["latency_p99_ms_checkpoint_1s_full_copies"] == round(nearest_rank_p99(during), 2)
    assert figures["latency_p99_ms_checkpoint_1s_changes"] == round(nearest_rank_p99(other), 2)


def test_a_window_of_checkpoints_of_changes_alone_has_no_full_copy_figure():
    ms = 1_000_000
    w = {"span": (0, 100 * ms), "spans": [(0, 10 * ms), (50 * ms, 60 * ms)], "bytes": [100, 120]}
    samples = np.array([[20 * ms, 5 * ms, 3], [70 * ms, 9 * ms, 1]], dtype=np.int64)
    figures = split_by_full_copies(w, samples)
    assert figures == {"checkpoints_full": 0, "full_copy_s": 0.0, "latency_p99_ms_checkpoint_1s_full_copies": None,
                       "latency_p99_ms_checkpoint_1s_changes": 9.0}
