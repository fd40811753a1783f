"""The migration strategy chooser against a table of (state size, load, budget) cases."""

from __future__ import annotations

import pytest

from chiray.control.strategychoice import MigrationModel, choose_strategy, moving_fraction

MiB = 2**20
MODEL = MigrationModel(transfer_bytes_per_s=100e6, step_overhead_ms=30, baseline_latency_ms=15,
                       max_inflation=5, skew_ratio=4)


def test_moving_fraction():
    assert moving_fraction(2, 3) == pytest.approx(1 / 3)
    assert moving_fraction(3, 2) == pytest.approx(1 / 3)
    assert moving_fraction(1, 4) == pytest.approx(3 / 4)
    assert moving_fraction(2, 2) == 0
    with pytest.raises(ValueError):
        moving_fraction(0, 2)


@pytest.mark.parametrize("state_mib,load,budget,strategy", [
    (1, 0.2, 200, "all_at_once"),        # 0.35 MiB moves in ~35 ms
    (20, 0.2, 200, "all_at_once"),       # 7 MiB: (30 + 70) * 1.25 = 125 ms + 15 baseline
    (20, 0.6, 200, "non_disruptive"),    # the same at 60% load: 2.5x inflation, 250 ms > 185 ms of room
    (166, 0.6, 100, "non_disruptive"),   # Megaphone's large state: steps
    (166, 0.6, 1000, "non_disruptive"),
    (2000, 0.2, 1000, "non_disruptive"),
])
def test_strategy_table(state_mib, load, budget, strategy):
    choice = choose_strategy(state_mib * MiB, 1024, 2, 3, load, budget, MODEL)
    assert choice.strategy == strategy, choice.reason
    if strategy == "all_at_once":
        assert choice.knobs == {}
    assert choice.predicted_max_latency_ms <= budget + 1e-6, choice


def test_chunks_fit_the_budget_and_grow_with_it():
    small = choose_strategy(166 * MiB, 4096, 2, 3, 0.6, 100, MODEL)
    large = choose_strategy(166 * MiB, 4096, 2, 3, 0.6, 400, MODEL)
    assert small.strategy == large.strategy == "non_disruptive"
    assert 1 <= small.knobs["chunk_bins"] < large.knobs["chunk_bins"]
    assert small.predicted_duration_s > large.predicted_duration_s
    # the prediction, written out: inflation 1/(1-0.6) = 2.5; per-bin bytes; one step's pause
    per_bin = 166 * MiB / 3 / round(4096 / 3)
    step_ms = (30 + 1000 * small.knobs["chunk_bins"] * per_bin / 100e6) * 2.5
    assert small.predicted_max_latency_ms == pytest.approx(15 + step_ms)
    assert small.knobs["gap_s"] == pytest.approx(step_ms / 1000 * 0.6 / 0.4, abs=1e-3)


def test_when_one_bin_does_not_fit_bins_are_replicated_ahead():
    choice = choose_strategy(4000 * MiB, 64, 1, 2, 0.5, 100, MODEL)
    assert (choice.strategy, choice.knobs["chunk_bins"], choice.knobs["replicate"]) == ("non_disruptive", 1, True)


def test_skew_picks_hot_first():
    flat = [10.0] * 1024
    skewed = [10.0] * 1020 + [500.0] * 4
    assert choose_strategy(166 * MiB, 1024, 2, 3, 0.6, 100, MODEL, flat).knobs["priority"] == "arrival"
    assert choose_strategy(166 * MiB, 1024, 2, 3, 0.6, 100, MODEL, skewed).knobs["priority"] == "hot_first"


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="latency_budget_ms"):
        choose_strategy(MiB, 1024, 2, 3, 0.5, 0)
