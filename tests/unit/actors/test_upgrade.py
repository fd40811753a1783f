"""Upgrades of a running operator's code, in-process: the cut's exactness, state migration, checks, canary."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chiray import collect
from chiray.actors.jobs.harness import LocalRun
from chiray.actors.jobs.jobvalues import UpgradeOutcome
from chiray.actors.jobs.upgrader import CanaryRolledBackError
from chiray.control.ops.checkpoint import code_entry
from chiray.operators import Dataflow, from_items
from chiray.operators.hashing import bins_of
from chiray.operators.upgrade import CodeChange, UpgradeError

N = 2000


def times(factor):
    def fn(batch):
        return pa.record_batch({"x": batch["x"], "y": pc.multiply(batch["x"], factor)})
    fn.__qualname__ = f"times{factor}"
    return fn


def map_run(n=N, start_at=300):
    flow = Dataflow("t")
    flow.source(from_items([{"x": i} for i in range(n)], batch_size=10)).map(times(2), name="m") \
        .sink(collect(), name="out")
    run = LocalRun(flow)
    run.run(until=lambda: run.instance(("m", 0)).records_in >= start_at)
    return run


def by_x(rows):
    return sorted(rows, key=lambda r: r["x"])


def test_map_upgrade_is_exact_at_the_reported_cut():
    run = map_run()
    record = run.upgrade("m", times(3))
    out = by_x(run.run()["out"].to_pylist())
    k = record.cut["m/0"]["records"]
    assert record.cut["m/0"]["inputs"] == {"source-1/0": k}
    assert 300 <= k < N
    assert out == [{"x": i, "y": i * (2 if i < k else 3)} for i in range(N)]  # old code before the cut, new after
    assert record.outcome is UpgradeOutcome.DONE and record.old_code == "submitted"
    assert record.new_code.startswith("times3@")


def counting(key, rows, state):
    out = []
    for x in rows["x"].to_pylist():
        state.value = (state.value or 0) + 1
        out.append({"k": key, "x": x, "v": state.value})
    return out


def summing(key, rows, state):
    out = []
    for x in rows["x"].to_pylist():
        s = state.value or {"n": 0, "sum": 0}
        state.value = s = {"n": s["n"] + 1, "sum": s["sum"] + x}
        out.append({"k": key, "x": x, "v": s["n"] * 1_000_000 + s["sum"]})
    return out


def keyed_oracle(rows, plan, cuts):
    """A plain loop: per instance the first ``cuts[i]`` records it was routed get the old code, then migrate, the
    new code."""
    table = plan.bin_tables["p"]
    owners = [table[b] for b in bins_of(pa.array([r["k"] for r in rows]), len(table)).tolist()]
    seen = {i: 0 for i in cuts}
    state: dict = {}
    out = []
    for row, owner in zip(rows, owners):
        key, x = row["k"], row["x"]
        if seen[owner] < cuts[owner]:
            state[key] = state.get(key, 0) + 1
            out.append({"k": key, "x": x, "v": state[key]})
        else:
            s = state.get(key)
            s = {"n": s, "sum": 0} if isinstance(s, int) else (s or {"n": 0, "sum": 0})
            state[key] = s = {"n": s["n"] + 1, "sum": s["sum"] + x}
            out.append({"k": key, "x": x, "v": s["n"] * 1_000_000 + s["sum"]})
        seen[owner] += 1
    return out


@pytest.mark.parametrize("canary", [0, 4])
def test_keyed_process_upgrade_migrates_state_at_the_cut(canary):
    rows = [{"k": i % 7, "x": i} for i in range(3000)]
    flow = Dataflow("t")
    flow.source(from_items(rows, batch_size=10)).key_by("k").process(counting, name="p", parallelism=2) \
        .sink(collect(), name="out")
    run = LocalRun(flow)
    run.run(until=lambda: run.instance(("p", 0)).records_in >= 300)
    record = run.upgrade("p", summing, migrate_state=lambda key, n: {"n": n, "sum": 0}, canary=canary)
    out = run.run()["out"].to_pylist()
    cuts = {i: record.cut[f"p/{i}"]["records"] for i in range(2)}
    assert all(0 < c < 3000 for c in cuts.values())
    assert by_x(out) == by_x(keyed_oracle(rows, run.plan, cuts))
    assert (record.canary_result == "passed") == bool(canary)


def test_canary_that_raises_rolls_back_and_loses_nothing():
    def bad(batch):
        if pc.max(batch["x"]).as_py() >= 800:
            raise ValueError("boom")
        return times(3)(batch)

    run = map_run(start_at=700)
    with pytest.raises(CanaryRolledBackError, match="boom") as caught:
        run.upgrade("m", bad, canary=20)
    out = by_x(run.run()["out"].to_pylist())
    assert out == [{"x": i, "y": 2 * i} for i in range(N)]  # the old code throughout, nothing twice
    assert caught.value.record.outcome is UpgradeOutcome.ROLLED_BACK
    assert "raised ValueError: boom" in caught.value.record.canary_result


def test_canary_that_changes_its_schema_rolls_back():
    def widening(batch):
        out = times(3)(batch)
        if pc.max(batch["x"]).as_py() >= 800:
            out = out.append_column("z", pc.multiply(batch["x"], 0))
        return out

    run = map_run(start_at=700)
    with pytest.raises(CanaryRolledBackError, match="changed (the|its) output (schema|columns)"):
        run.upgrade("m", widening, canary=20)
    assert by_x(run.run()["out"].to_pylist()) == [{"x": i, "y": 2 * i} for i in range(N)]


def test_canary_whose_output_rate_departs_rolls_back():
    def drops_most(batch):
        return times(3)(batch).slice(0, 1)  # 1 record out of 10

    run = map_run(start_at=700)
    with pytest.raises(CanaryRolledBackError, match="output rate departs"):
        run.upgrade("m", drops_most, canary=5)
    assert by_x(run.run()["out"].to_pylist()) == [{"x": i, "y": 2 * i} for i in range(N)]


def test_upgrades_refused_before_the_cut():
    run = map_run()
    lock = threading.Lock()
    with pytest.raises(UpgradeError, match="'m'.*does not pickle"):
        run.upgrade("m", lambda b, lock=lock: b)
    with pytest.raises(UpgradeError, match="'m'.*raised on a sample of .* recent input records: KeyError"):
        run.upgrade("m", lambda b: b["nope"])
    with pytest.raises(UpgradeError, match=r"'m'.*old code's output schema is \['x', 'y'\]"):
        run.upgrade("m", lambda b: pa.record_batch({"x": b["x"]}))
    with pytest.raises(UpgradeError, match="unknown operator 'q'"):
        run.upgrade("q", times(3))
    with pytest.raises(UpgradeError, match="source runs no user code"):
        run.upgrade("source-1", times(3))
    with pytest.raises(UpgradeError, match="migrate_state= needs a keyed operator"):
        run.upgrade("m", times(3), migrate_state=lambda k, v: v)
    assert by_x(run.run()["out"].to_pylist()) == [{"x": i, "y": 2 * i} for i in range(N)]  # nothing changed


def test_a_declared_schema_is_what_the_new_code_must_return():
    def floats(batch):
        return pa.record_batch({"x": batch["x"], "y": pc.multiply(batch["x"], 4.0)})

    run = map_run()
    with pytest.raises(UpgradeError, match=r"returns \['x', 'y'\] \(int64, double\)"):
        run.upgrade("m", floats)  # the old code's schema holds: y was int64
    schema = pa.schema([("x", pa.int64()), ("y", pa.int64())])
    with pytest.raises(UpgradeError, match=r"the declared schema= is \['x', 'y'\] \(int64, int64\)"):
        run.upgrade("m", floats, schema=schema)
    record = run.upgrade("m", times(4), schema=schema)
    k = record.cut["m/0"]["records"]
    assert by_x(run.run()["out"].to_pylist()) == [{"x": i, "y": i * (2 if i < k else 4)} for i in range(N)]


def test_checkpoint_entry_carries_the_code():
    change = CodeChange.of("m", times(3))
    entry = code_entry(change)
    assert entry is not None and entry["identity"] == change.identity and code_entry(None) is None
    from chiray.actors.runtime.restore import RestoreInfo

    info = RestoreInfo(None, {"job": {"operators": {"m": {"parallelism": 2}}},  # type: ignore[arg-type]
                              "code": {"m/0": entry, "m/1": entry}})
    restored = info.code_change("m", 1)
    assert restored.identity == change.identity
    assert restored.fn(pa.record_batch({"x": [2]}))["y"].to_pylist() == [6]
    assert info.code_change("m") is not None and RestoreInfo(None, {}).code_change("m", 0) is None  # type: ignore
