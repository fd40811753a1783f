"""``Reconfigure`` (Chi Fig. 4b): two operators change a parameter at one consistent point of the stream.

A source with ``(split, seq, value)`` rows fans out to two maps ``a`` and
``b`` (``params={"threshold": T0, "branch": ...}``) that keep rows with
``value > threshold`` and tag each output row with the threshold used; a
union collects both. ``Reconfigure`` sets the threshold of both to ``T1``
mid-stream. Oracle, per split: let S be the smallest seq tagged ``T1`` in
either branch; then each branch's output is exactly what a plain loop gives
using ``T0`` for seq < S and ``T1`` from S on. ``T1 < T0``, so every row
processed under ``T1`` that ``T0`` would have kept shows up tagged ``T1``,
and S is pinned down by the output itself.
"""

from __future__ import annotations

import collections
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.runtime.instance import OperatorFailure
from chiray.control.oprun import OpState
from chiray.control.ops import Reconfigure
from chiray.operators import Dataflow, collect

from .support import SEQ_SCHEMA, SeqSource, run_until, track

T0, T1 = 60, 25
OUT_SCHEMA = pa.schema([("split", pa.int64()), ("seq", pa.int64()), ("threshold", pa.int64()),
                        ("branch", pa.string())])


def keep_above(batch: pa.RecordBatch, params: dict) -> pa.RecordBatch:
    """Rows with value > threshold, tagged with the threshold and the branch."""
    kept = batch.filter(pc.greater(batch.column("value"), params["threshold"]))
    n = kept.num_rows
    return pa.RecordBatch.from_arrays(
        [kept.column("split"), kept.column("seq"), pa.array([params["threshold"]] * n, pa.int64()),
         pa.array([params["branch"]] * n, pa.string())], schema=OUT_SCHEMA)


def _passthrough(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
    return rows


def _flow(rng: random.Random) -> tuple[Dataflow, SeqSource]:
    p_src = rng.randint(1, 3)
    src = SeqSource([rng.randint(40, 80) for _ in range(p_src)], batch_size=rng.randint(1, 3),
                    seed=rng.randrange(1000), name="src")
    flow = Dataflow("fig4b", num_bins=8)
    stream = flow.source(src, parallelism=p_src, name="src")
    before = rng.choice(["none", "rebalance", "keyed"])
    if before == "rebalance":
        stream = stream.map(track, params={}, name="pre", parallelism=rng.randint(1, 3), schema=SEQ_SCHEMA)
    elif before == "keyed":
        stream = stream.key_by("value").process(_passthrough, name="pre", parallelism=rng.randint(1, 3),
                                                schema=SEQ_SCHEMA)
    a = stream.map(keep_above, name="a", parallelism=rng.randint(1, 3), schema=OUT_SCHEMA,
                   params={"threshold": T0, "branch": "a"})
    b = stream.map(keep_above, name="b", parallelism=rng.randint(1, 3), schema=OUT_SCHEMA,
                   params={"threshold": T0, "branch": "b"})
    if rng.random() < 0.5:  # a longer path on one side
        b = b.map(lambda batch: batch, name="b-later", parallelism=rng.randint(1, 3), schema=OUT_SCHEMA)
    union = a.union(b, name="u", parallelism=rng.randint(1, 2))
    union.sink(collect(), name="out", parallelism=rng.randint(1, 2))
    return flow, src


def _run(seed: int, op_factory: Any = Reconfigure) -> tuple[Any, SeqSource, Any, LocalRun]:
    rng = random.Random(seed)
    flow, src = _flow(rng)
    config = JobConfig(channel_capacity=rng.choice([1, 2, 4]), num_hosts=rng.choice([None, 1, 2, 3]),
                       control_fanout=rng.choice([None, 2]))
    run = LocalRun(flow, config, seed=seed)
    sources = [run.instance(("src", i)) for i in range(len(src.rows_per_split))]
    total = sum(src.rows_per_split)
    fraction = rng.uniform(0.2, 0.6)
    run_until(run, lambda: sum(s.records_in for s in sources) >= fraction * total)
    op_run = run.run_control(op_factory({"a": {"threshold": T1}, "b": {"threshold": T1}}))
    results = run.run(max_rounds=300_000)
    return results["out"], src, op_run, run


def check_one_switch_point(table: pa.Table, src: SeqSource) -> list[int]:
    """Per split, the outputs match the oracle for one switch point; returns the switch points."""
    by_split: dict[int, dict[str, list[tuple[int, int]]]] = collections.defaultdict(
        lambda: {"a": [], "b": []})
    for row in table.to_pylist():
        by_split[row["split"]][row["branch"]].append((row["seq"], row["threshold"]))
    switches = []
    for split in src.split_numbers:
        got = by_split[split]
        tags: dict[int, set[int]] = collections.defaultdict(set)
        for branch in ("a", "b"):
            for seq, threshold in got[branch]:
                tags[seq].add(threshold)
        mixed = {seq: t for seq, t in tags.items() if len(t) > 1}
        assert not mixed, f"split {split}: records processed under both thresholds: {sorted(mixed)[:5]}"
        switch = min((seq for seq, t in tags.items() if T1 in t), default=src.total(split))
        expected = [(r["seq"], T0 if r["seq"] < switch else T1) for r in src.rows(split)
                    if r["value"] > (T0 if r["seq"] < switch else T1)]
        for branch in ("a", "b"):
            assert sorted(got[branch]) == expected, (
                f"split {split}, branch {branch}: output differs from one switch at seq {switch}")
        switches.append(switch)
    return switches


@pytest.mark.parametrize("seed", range(20))
def test_reconfigure_switches_both_branches_at_one_point(seed):
    table, src, op_run, run = _run(seed)
    assert op_run.state is OpState.COMPLETE
    assert op_run.result == {"a": {"threshold": T1}, "b": {"threshold": T1}}
    switches = check_one_switch_point(table, src)
    assert any(0 < s < src.total(split) for s, split in zip(switches, src.split_numbers)), (
        f"the switch {switches} is not mid-stream: the test did not exercise a reconfiguration")
    for name in ("a", "b"):
        for i in range(run.plan.graph.nodes[name].parallelism):
            params = run.instance((name, i)).control.ctx.parameters()
            assert params == {"threshold": T1, "branch": name}


class NonBlockingReconfigure(Reconfigure):
    """The same op without alignment: each instance switches as soon as the op has reached it everywhere."""

    blocking = False


def test_the_oracle_catches_a_non_blocking_reconfigure():
    """Without blocking, some run processes a record under T0 in one branch and T1 in the other."""
    caught = 0
    for seed in range(20):
        table, src, op_run, _ = _run(seed, NonBlockingReconfigure)
        assert op_run.state is OpState.COMPLETE
        try:
            check_one_switch_point(table, src)
        except AssertionError:
            caught += 1
    assert caught > 0


def test_unknown_operator_is_rejected_at_run_control():
    flow, _ = _flow(random.Random(0))
    run = LocalRun(flow)
    with pytest.raises(ValueError, match=r"Reconfigure: unknown operators \['nope'\]"):
        run.run_control(Reconfigure({"nope": {"threshold": 1}}))


def test_operator_without_params_fails_with_a_clear_error():
    flow = Dataflow("no-params")
    src = flow.source(SeqSource([10]), name="src")
    src.map(lambda b: b, name="plain", schema=SEQ_SCHEMA).collect(name="out")
    run = LocalRun(flow)
    run.run_control(Reconfigure({"plain": {"threshold": 1}}))
    with pytest.raises(OperatorFailure, match=r"plain\[0\]: TypeError: .*takes no parameters") as info:
        run.run()
    assert isinstance(info.value.cause, TypeError)
