"""Upgrades on Ray: a ``map`` and a keyed ``process`` (with a state migration, after a canary that rolled back)
upgraded mid-stream are exact at the cut their op reports; a host killed after an upgrade and a checkpoint
recovers with the new code, one killed during a canary with the old; a restored or recovered job scales out with
the code its checkpoint recorded."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

import chiray
from chiray.actors.jobs.jobvalues import UpgradeOutcome
from chiray.actors.jobs.upgrader import CanaryRolledBackError
from chiray.operators import generate
from chiray.operators.hashing import bins_of
from tests.waiting import job_picture, wait_for

pytestmark = pytest.mark.ray

N = 30_000


def times(factor):
    def fn(batch):
        return pa.record_batch({"key": batch["key"], "value": batch["value"],
                                "y": pc.multiply(batch["value"], factor)})
    fn.__qualname__ = f"times{factor}"
    return fn


def _flow(name):
    flow = chiray.Dataflow(name)
    flow.source(generate(N, rate=4_000, batch_size=500, num_keys=50, seed=3)).map(times(2), name="m") \
        .sink(chiray.collect(), name="out")
    return flow




def test_map_upgrade_on_ray_is_exact(ray_session, tmp_path):
    job = chiray.submit(_flow("upgrade-map"), checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 30, "records through the map",
                 detail=lambda: job_picture(job))
        record = job.upgrade("m", times(3))
        job.wait(60)
        out = job.result("out")
    finally:
        job.cancel()
    k = record.cut["m/0"]["records"]
    assert 4_000 <= k < N and record.outcome.value == "done" and job.upgrades() == (record,)
    values = out.column("value").to_pylist()
    ys = out.column("y").to_pylist()
    # one source instance, one channel: the map's k-th record is the source's k-th (in order)
    assert len(values) == N
    assert ys == [v * (2 if i < k else 3) for i, v in enumerate(values)]


def test_recovery_after_an_upgrade_runs_the_new_code(ray_session, tmp_path):
    flow = chiray.Dataflow("upgrade-recover")
    flow.source(generate(None, rate=20_000, batch_size=500, num_keys=50, seed=3)).map(times(2), name="m") \
        .sink(chiray.collect(), name="out")
    job = chiray.submit(flow, checkpoint_dir=str(tmp_path / "chk"), max_restarts=2)
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 2_000, 30, "records through the map",
                 detail=lambda: job_picture(job))
        job.upgrade("m", times(5))
        job.checkpoint(60)
        ray.kill(job.topology.hosts()[0], no_restart=True)
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery")
        wait_for(lambda: job.tail("out", 50).num_rows == 50, 30, "output after the recovery")
        tail = job.tail("out", 50)
        assert tail.column("y").to_pylist() == [v * 5 for v in tail.column("value").to_pylist()]
    finally:
        job.cancel()


def _tail_is(job, factor, rows=1_000):
    tail = job.tail("out", rows)
    return tail.num_rows == rows and tail.column("y").to_pylist() == [v * factor for v in
                                                                      tail.column("value").to_pylist()]


def _each_took(job, parallelism, records):
    counts = [s.records_in for s in job.statistics().of("m")]
    return len(counts) == parallelism and min(counts) >= records


def test_scale_out_after_a_restore_or_a_recovery_builds_the_checkpointed_code(ray_session, tmp_path):
    """The operator's recorded code comes from the checkpoint a job starts from: a restore into a new job (its
    flow still says times2) scales out with it, and a recovery to a checkpoint cut before a later upgrade
    records it again (what the next scale-out builds)."""
    def flow():
        f = chiray.Dataflow("upgrade-rescale")
        f.source(generate(None, rate=20_000, batch_size=100, num_keys=50, seed=3)).map(times(2), name="m") \
            .sink(chiray.collect(), name="out")
        return f

    first = chiray.submit(flow(), checkpoint_dir=str(tmp_path / "a"))
    try:
        wait_for(lambda: first.statistics().records_in("m") >= 2_000, 30, "records through the map",
                 detail=lambda: job_picture(first))
        first.upgrade("m", times(5))
        path = first.checkpoint_info(60).path
    finally:
        first.cancel()
    job = chiray.submit(flow(), checkpoint_dir=str(tmp_path / "b"), restore_from=path, max_restarts=2)
    try:
        job.rescale("m", 2).result(60)
        wait_for(lambda: _each_took(job, 2, 1_000), 30, "both instances")
        assert _tail_is(job, 5)  # 10 batches: both instances' output (round robin)
        job.checkpoint(60)  # records times5 for both instances
        job.upgrade("m", times(7))
        ray.kill(job.topology.hosts()[0], no_restart=True)
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery")
        assert job.plan.graph.nodes["m"].code.qualname == "times5"  # what the next scale-out builds
    finally:
        job.cancel()


def counting(key, rows, state):
    out = []
    for seq in rows["seq"].to_pylist():
        state.value = (state.value or 0) + 1
        out.append({"key": key, "seq": seq, "v": state.value})
    return out


def summing(key, rows, state):
    out = []
    for seq in rows["seq"].to_pylist():
        s = state.value or {"n": 0, "sum": 0}
        state.value = s = {"n": s["n"] + 1, "sum": s["sum"] + seq}
        out.append({"key": key, "seq": seq, "v": s["n"] * 10**9 + s["sum"]})
    return out


def raising_from(seq_limit):
    def fn(key, rows, state):
        if max(rows["seq"].to_pylist()) >= seq_limit:
            raise ValueError("canary boom")
        return summing(key, rows, state)
    return fn


def _keyed_flow(name, records, rate):
    flow = chiray.Dataflow(name)
    flow.source(generate(records, rate=rate, batch_size=100, num_keys=20, seed=7, key_type="int")) \
        .key_by("key").process(counting, name="p", parallelism=2).sink(chiray.collect(), name="out")
    return flow


def _source_rows(records):
    src = generate(records, batch_size=100, num_keys=20, seed=7, key_type="int")
    reader = src.open_split(src.splits()[0])
    rows = []
    while (batch := reader.read()) is not None:
        rows.extend(zip(batch["key"].to_pylist(), batch["seq"].to_pylist()))
    return rows


def keyed_oracle(rows, table, cuts):
    """A plain loop over the source's records in order (one source instance: each instance of ``p`` takes its
    records in that order): per instance the first ``cuts[i]`` it was routed get the old code (a count), then
    the state migrates to ``{"n", "sum"}`` and the new code runs."""
    owners = [table[b] for b in bins_of(pa.array([k for k, _ in rows]), len(table)).tolist()]
    seen = dict.fromkeys(range(max(table) + 1), 0)
    state: dict = {}
    out = []
    for (key, seq), owner in zip(rows, owners):
        if seen[owner] < cuts.get(owner, len(rows)):
            state[key] = state.get(key, 0) + 1
            out.append((key, seq, state[key]))
        else:
            s = state.get(key, 0)
            s = {"n": s, "sum": 0} if isinstance(s, int) else s
            state[key] = s = {"n": s["n"] + 1, "sum": s["sum"] + seq}
            out.append((key, seq, s["n"] * 10**9 + s["sum"]))
        seen[owner] += 1
    return sorted(out)


def test_keyed_upgrade_after_a_rolled_back_canary_is_exact(ray_session, tmp_path):
    """One job: a canary that raises mid-trial rolls back (the old code runs on, nothing lost or emitted
    twice), then an upgrade with a state migration; the output is the old code's up to the reported cut."""
    records = 24_000
    job = chiray.submit(_keyed_flow("upgrade-keyed", records, 6_000), checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(lambda: job.statistics().records_in("p") >= 3_000, 30, "records through p")
        limit = job.statistics().records_in("p") + 1_500  # past the checks' sample, within the trial
        with pytest.raises(CanaryRolledBackError, match="canary boom"):
            job.upgrade("p", raising_from(limit), migrate_state=lambda key, n: {"n": n, "sum": 0}, canary=30)
        record = job.upgrade("p", summing, migrate_state=lambda key, n: {"n": n, "sum": 0})
        job.wait(60)
        out = job.result("out")
        table = list(job.plan.bin_tables["p"])
    finally:
        job.cancel()
    assert [u.outcome for u in job.upgrades()] == [UpgradeOutcome.ROLLED_BACK, UpgradeOutcome.DONE]
    cuts = {i: record.cut[f"p/{i}"]["records"] for i in range(2)}
    assert all(0 < c for c in cuts.values()) and sum(cuts.values()) < records
    got = sorted(zip(*(out.column(c).to_pylist() for c in ("key", "seq", "v"))))
    assert got == keyed_oracle(_source_rows(records), table, cuts)


def _output_held(job):
    """A condition: instance 0 of ``p`` took 300 records since its output last grew (a canary holds it)."""
    mark: dict = {}

    def held():
        stats = next(s for s in job.statistics().of("p") if s.index == 0)
        if mark.get("out") != stats.records_out:
            mark.update(out=stats.records_out, taken=stats.records_in)
            return False
        return stats.records_in - mark["taken"] >= 300
    return held


def test_a_host_killed_during_a_canary_recovers_with_the_old_code(ray_session, tmp_path):
    """A host dies while a canary trial runs: the upgrade fails, the job recovers from the checkpoint taken
    before it with the code that checkpoint recorded (the submitted one), and the output is exact."""
    records = 20_000
    job = chiray.submit(_keyed_flow("upgrade-kill", records, 6_000), checkpoint_dir=str(tmp_path / "chk"),
                        max_restarts=2)
    try:
        wait_for(lambda: job.statistics().records_in("p") >= 2_000, 30, "records through p")
        job.checkpoint(60)
        failure: list = []

        def upgrade():
            try:
                job.upgrade("p", summing, migrate_state=lambda key, n: {"n": n, "sum": 0}, canary=10_000,
                            timeout=30)
            except Exception as exc:  # the op fails with the hosts
                failure.append(exc)

        thread = threading.Thread(target=upgrade)
        thread.start()
        wait_for(_output_held(job), 30, "the canary's trial (its output held)")
        ray.kill(job.topology.hosts()[0], no_restart=True)
        thread.join(60)
        assert not thread.is_alive() and failure, "the upgrade should fail with the killed host"
        job.wait(90)
        out = job.result("out")
        table = list(job.plan.bin_tables["p"])
    finally:
        job.cancel()
    assert job.plan.graph.nodes["p"].code is None
    got = sorted(zip(*(out.column(c).to_pylist() for c in ("key", "seq", "v"))))
    assert got == keyed_oracle(_source_rows(records), table, {0: records, 1: records})
