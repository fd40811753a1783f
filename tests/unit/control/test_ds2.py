"""The DS2 policy as pure code: Flink's autoscaler test vectors, synthetic rate tables, hysteresis."""

from __future__ import annotations

import math
import random

import pytest

from chiray.control.ds2 import Action, Ds2Config, Ds2Policy, needed_parallelism, target_rates, topological_order
from chiray.control.rates import Cut, OperatorRates, rates_between, skewed


def rates(op: str, *, p: int = 1, in_rate: float = 0.0, out_rate: float | None = None,
          true_rate: float | None = None, backlog: float = 0.0, growth: float = 0.0) -> OperatorRates:
    out_rate = in_rate if out_rate is None else out_rate
    return OperatorRates(op, p, in_rate, out_rate, true_rate, out_rate / in_rate if in_rate else 1.0,
                         0.5, 0.0, backlog, growth)


# -- the parallelism formula: Flink's autoscaler vectors (max parallelism 720, parallelism 10) ---------

def test_flink_vectors():
    per_instance = 100 / 10  # the vertex processes 100 rec/s at parallelism 10
    assert needed_parallelism(50, per_instance, 1.0, 1, 720) == 5
    assert needed_parallelism(50, per_instance, 0.8, 1, 720, align_to=720) == 8  # divisors of 720 only
    assert needed_parallelism(50, per_instance, 0.8, 1, 720) == 7
    assert needed_parallelism(80, per_instance, 0.8, 1, 720) == 10  # keeps 10


def test_bounds_and_alignment():
    assert needed_parallelism(1e9, 10, 1.0, 1, 12) == 12
    assert needed_parallelism(0, 10, 1.0, 2, 12) == 2
    assert needed_parallelism(50, 10, 1.0, 1, 64, align_to=1024) == 8  # powers of two for 1024 bins
    assert needed_parallelism(30, 10, 1.0, 1, 64, align_to=7) == 3  # no divisor of 7 in [3, 3]: keep 3
    with pytest.raises(ValueError):
        needed_parallelism(1, 0, 1.0, 1, 4)


def oracle(target: float, per_instance: float, util: float, lo: int, hi: int) -> int:
    """The formula written out plainly: the fewest instances whose utilisation stays <= util."""
    p = lo
    while p < hi and target / (p * per_instance) > util + 1e-12:
        p += 1
    return p


@pytest.mark.parametrize("seed", range(5))
def test_formula_against_a_plain_search(seed):
    rng = random.Random(seed)
    for _ in range(200):
        target, per, util = rng.uniform(0, 1e6), rng.uniform(1, 1e5), rng.choice([0.5, 0.7, 0.8, 1.0])
        assert needed_parallelism(target, per, util, 1, 64) == oracle(target, per, util, 1, 64)


# -- graphs: target rates propagate through ratios ------------------------------------------------------

def test_topological_order_and_errors():
    up = {"src": [], "a": ["src"], "b": ["a"], "c": ["a", "src"]}
    order = topological_order(up)
    assert order.index("src") < order.index("a") < order.index("b") and order.index("a") < order.index("c")
    with pytest.raises(ValueError, match="cycle"):
        topological_order({"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="unknown"):
        topological_order({"a": ["x"]})


def test_chain_propagates_ratios():
    up = {"src": [], "parse": ["src"], "count": ["parse"]}
    r = {"src": rates("src", in_rate=1000), "parse": rates("parse", in_rate=1000, out_rate=3000),
         "count": rates("count", in_rate=3000, out_rate=10)}
    assert target_rates(up, r, catch_up_s=None) == {"src": 1000, "parse": 1000, "count": 3000}


def test_backlog_is_caught_up_and_growth_counts_as_offered():
    up = {"src": [], "count": ["src"]}
    r = {"src": rates("src", in_rate=1000, backlog=30_000, growth=500), "count": rates("count", in_rate=1000)}
    targets = target_rates(up, r, catch_up_s=30)
    assert targets["count"] == pytest.approx(1000 + 500 + 1000)


def test_fan_in_and_join_sum_their_inputs():
    up = {"persons": [], "auctions": [], "join": ["persons", "auctions"], "agg": ["join"]}
    r = {"persons": rates("persons", in_rate=100), "auctions": rates("auctions", in_rate=300),
         "join": rates("join", in_rate=400, out_rate=200), "agg": rates("agg", in_rate=200, true_rate=50)}
    assert target_rates(up, r, None) == {"persons": 100, "auctions": 300, "join": 400, "agg": 200}
    policy = Ds2Policy(up, ["join", "agg"], Ds2Config(target_utilisation=1.0, max_parallelism=32, cooldown_s=0))
    r["join"] = rates("join", p=2, in_rate=400, out_rate=200, true_rate=100)
    decisions = {d.operator: d for d in policy.decide(0.0, r, {"join": 2, "agg": 1})}
    assert (decisions["join"].action, decisions["join"].target) == (Action.UP, 4)
    assert (decisions["agg"].action, decisions["agg"].target) == (Action.UP, 4)


# -- hysteresis ---------------------------------------------------------------------------------------------

def chain_policy(**cfg) -> Ds2Policy:
    return Ds2Policy({"src": [], "count": ["src"]}, ["count"],
                     Ds2Config(**{"target_utilisation": 1.0, "cooldown_s": 0, "scale_down_stable_s": 10, **cfg}))


def decide(policy: Ds2Policy, now: float, offered: float, per_instance: float, current: int):
    r = {"src": rates("src", in_rate=offered), "count": rates("count", p=current, in_rate=offered,
                                                              true_rate=per_instance)}
    (decision,) = policy.decide(now, r, {"count": current})
    return decision


def test_scale_up_at_once_scale_down_after_a_stable_interval():
    policy = chain_policy()
    assert decide(policy, 0, 300, 100, 1).target == 3
    assert decide(policy, 1, 300, 100, 3).action is Action.HOLD
    steps = [decide(policy, t, 100 if t < 8 else 150, 100, 3) for t in range(2, 13)]
    assert all(d.action is Action.HOLD for d in steps[:-1]), [d.reason for d in steps]
    assert (steps[-1].action, steps[-1].target) == (Action.DOWN, 2)  # the most it wanted over the interval


def test_an_upward_need_resets_the_scale_down_streak():
    policy = chain_policy()
    for t in range(0, 9):
        assert decide(policy, t, 100, 100, 3).action is Action.HOLD
    assert decide(policy, 9, 300, 100, 3).action is Action.HOLD  # needs 3 again: the streak ends
    assert all(decide(policy, t, 100, 100, 3).action is Action.HOLD for t in range(10, 20))
    assert decide(policy, 20, 100, 100, 3).action is Action.DOWN


def test_sparse_decisions_still_scale_down():
    policy = chain_policy()
    assert decide(policy, 0, 100, 100, 3).action is Action.HOLD
    d = decide(policy, 15, 100, 100, 3)
    assert (d.needed, d.target) == (1, 2)  # 1 instance would run at 100%: outside the 10% dead band
    assert decide(chain_policy(scale_down_margin=0.0), 15, 100, 100, 3).target == 3  # a new policy waits


@pytest.mark.parametrize("seed", range(5))
def test_no_oscillation_on_a_noisy_steady_load(seed):
    """A load right at a boundary, with 5% noise: at most one rescale, and never back and forth."""
    rng = random.Random(seed)
    policy = chain_policy(target_utilisation=0.8)
    current, changes = 2, []
    for t in range(0, 600, 2):
        offered = 160 * (1 + rng.uniform(-0.05, 0.05))  # 2 instances at 100 rec/s and 80% -> exactly 2
        d = decide(policy, t, offered, 100, current)
        if d.action is not Action.HOLD:
            changes.append((t, current, d.target))
            current = d.target
            policy.rescaled("count", t)
    assert len(changes) <= 1, changes
    assert current in (2, 3)


def test_cooldown_and_unknown_true_rate_hold():
    policy = chain_policy(cooldown_s=5)
    policy.rescaled("count", 0)
    assert "cooling down" in decide(policy, 3, 1000, 100, 1).reason
    assert decide(policy, 6, 1000, 100, 1).target == 10
    r = {"src": rates("src", in_rate=10), "count": rates("count", in_rate=0, true_rate=None)}
    (d,) = chain_policy().decide(0, r, {"count": 4})
    assert d.action is Action.HOLD and "unknown" in d.reason


def test_config_is_checked():
    with pytest.raises(ValueError):
        Ds2Config(target_utilisation=0)
    with pytest.raises(ValueError):
        Ds2Config(min_parallelism=3, max_parallelism=2)
    with pytest.raises(ValueError, match="not in the graph"):
        Ds2Policy({"a": []}, ["b"])


# -- rates from two Monitor cuts -----------------------------------------------------------------------------

def test_rates_between_two_cuts():
    before = Cut(10.0, {("count", 0): {"records_in": 1000, "records_out": 10, "busy_s": 1.0,
                                        "backpressured_s": 0.0},
                         ("count", 1): {"records_in": 500, "records_out": 5, "busy_s": 0.5,
                                        "backpressured_s": 0.0},
                         ("src", 0): {"records_in": 0, "records_out": 1500, "busy_s": 0.1, "backlog": 100}})
    after = Cut(12.0, {("count", 0): {"records_in": 3000, "records_out": 30, "busy_s": 1.5,
                                       "backpressured_s": 0.2},
                        ("count", 1): {"records_in": 1500, "records_out": 15, "busy_s": 1.0,
                                       "backpressured_s": 0.0},
                        ("count", 2): {"records_in": 100, "records_out": 1, "busy_s": 0.05},  # new instance
                        ("src", 0): {"records_in": 0, "records_out": 4700, "busy_s": 0.2, "backlog": 300}})
    r = rates_between(before, after)
    c = r["count"]
    assert c.parallelism == 3
    assert c.input_rate == pytest.approx((2000 + 1000 + 100) / 2)
    assert c.true_rate_per_instance == pytest.approx(3100 / (0.5 + 0.5 + 0.05))
    assert c.ratio == pytest.approx(31 / 3100)
    assert c.backpressured == pytest.approx(0.2 / 2 / 3)
    s = r["src"]
    assert s.output_rate == pytest.approx(1600) and s.backlog == 300 and s.backlog_growth == pytest.approx(100)
    with pytest.raises(ValueError):
        rates_between(after, before)


def test_rates_of_an_idle_operator_have_no_true_rate():
    cut = {("count", 0): {"records_in": 5, "busy_s": 0.0}}
    r = rates_between(Cut(0, cut), Cut(1, cut))["count"]
    assert r.true_rate_per_instance is None and r.input_rate == 0 and math.isclose(r.ratio, 1.0)


def test_skew_is_one_hot_instance_beside_idle_ones():
    assert skewed({0: 0.95, 1: 0.2, 2: 0.3})
    assert not skewed({0: 0.95, 1: 0.9})          # everyone is busy: more instances, not a rebalance
    assert not skewed({0: 0.5, 1: 0.2})           # nobody is hot
    assert not skewed({0: 1.0})
