"""Branches added to a job running on Ray: the new sink receives exactly the records the running operator
emitted after the cut its op reports (a plain Python slice of the main sink's output is the oracle), also
when a host dies after the branch was added and checkpointed (the recovery runs the changed graph) and when
it dies before the next checkpoint (the recovery starts the branch at the checkpoint's cut)."""

from __future__ import annotations

import cloudpickle
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

import chiray
from chiray.operators import generate
from chiray.operators.branch import BranchError
from tests.gate import Gate, Gated
from tests.waiting import job_picture, wait_for

pytestmark = pytest.mark.ray

N = 24_000


def _tripled(batch):
    return pa.record_batch({"seq": batch["seq"], "value": batch["value"], "y": pc.multiply(batch["value"], 3)})


def _flow(name: str, gate: Gate) -> chiray.Dataflow:
    """4,000 records at once, then 2,000 a second up to 16,000 while the gate is shut (the hold stays at the
    same place in the data across a recovery), then the rest once it opens."""
    source = Gated(generate(N, batch_size=200, num_keys=50, seed=5), gate.path, hold_after=4_000, trickle=2_000,
                   hold_at=16_000, position=lambda offset: 200 * int(offset))
    flow = chiray.Dataflow(name)
    flow.source(source, name="src").map(_tripled, name="m").sink(chiray.collect(), name="out")
    return flow


def _large(batch):
    return pc.greater_equal(batch["value"], 500)


def _branch(stream):
    return stream.filter(_large, name="large").sink(chiray.collect(), name="big")


def _expected_after(out: pa.Table, cut: int) -> list[tuple[int, int, int]]:
    """The main sink's records after the cut (one source split, one map instance: the map's k-th record is the
    k-th of the split, ``seq`` k), filtered as the branch filters."""
    return [r for r in sorted(_rows(out)) if r[0] >= cut and r[1] >= 500]


def _rows(table: pa.Table) -> list[tuple[int, int, int]]:
    return list(zip(*(table.column(c).to_pylist() for c in ("seq", "value", "y"))))


def test_a_branch_added_mid_run_receives_exactly_the_records_after_its_cut(ray_session, tmp_path):
    gate = Gate(tmp_path)
    job = chiray.submit(_flow("branch-add", gate), checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 30, "records through the map",
                 detail=lambda: job_picture(job))
        with pytest.raises(BranchError, match="adds no sink"):
            job.add_branch("m", lambda s: s.map(_tripled, name="x"))
        cut = job.add_branch("m", _branch)
        assert cut.added == ("large", "big") and set(cut.cut) == {"m/0"}
        assert "big" in job.plan.graph.nodes and any("add_branch from m" in e for e in job.status().events)
        gate.open()
        job.wait(90)
        out, big = job.result("out"), job.result("big")
    finally:
        job.cancel()
    k = cut.cut["m/0"]
    assert 4_000 <= k < N and out.num_rows == N
    assert big.num_rows > 0 and sorted(_rows(big)) == _expected_after(out, k)


@pytest.mark.parametrize("checkpointed", [True, False], ids=["after-a-checkpoint", "before-a-checkpoint"])
def test_a_host_killed_after_a_branch_was_added_recovers_with_the_branch_exactly(ray_session, tmp_path,
                                                                                 checkpointed):
    gate = Gate(tmp_path)
    job = chiray.submit(_flow("branch-recover", gate), checkpoint_dir=str(tmp_path / "chk"), max_restarts=2)
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 30, "records through the map",
                 detail=lambda: job_picture(job))
        first = job.checkpoint(60)
        cut = job.add_branch("m", _branch)
        taken = job.checkpoint(60) if checkpointed else first
        ray.kill(job.topology.hosts()[0], no_restart=True)  # the source's and the map's host
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery",
                 detail=lambda: job.status().events)
        gate.open()
        job.wait(120)
        out, big = job.result("out"), job.result("big")
    finally:
        job.cancel()
    assert _recovered_from(job) == [taken], job.status().events
    assert ("big" in _manifest_operators(tmp_path / "chk", taken)) is checkpointed  # the graph at its cut
    assert sorted(r[0] for r in _rows(out)) == list(range(N))  # exact: every record once
    # the branch starts at its own cut if the checkpoint recovered from holds it, else at that checkpoint's cut
    start = cut.cut["m/0"] if checkpointed else _records_read(tmp_path / "chk", first)
    assert start <= cut.cut["m/0"] and sorted(_rows(big)) == _expected_after(out, start)


def _recovered_from(job) -> list[int]:
    return [int(e.split()[3]) for e in job.status().events if e.startswith("recovered from checkpoint")]


def _manifest_operators(root, checkpoint_id: int) -> set[str]:
    from chiray.actors.runtime.storage import CheckpointStorage

    return set(CheckpointStorage(str(root)).load(checkpoint_id)["job"]["operators"])


def _records_read(root, checkpoint_id: int) -> int:
    """The records the source had read at the checkpoint (its offsets: batches of 200 per split)."""
    from chiray.actors.runtime.restore import RestoreInfo
    from chiray.actors.runtime.storage import CheckpointStorage

    storage = CheckpointStorage(str(root))
    offsets = RestoreInfo(storage, storage.load(checkpoint_id)).source_offsets("src")
    return 200 * sum(int(v) for v in offsets.values())


def test_a_removed_branch_got_exactly_the_records_between_its_cuts_and_the_job_recovers_without_it(
        ray_session, tmp_path):
    gate = Gate(tmp_path)
    job = chiray.submit(_flow("branch-remove", gate), checkpoint_dir=str(tmp_path / "chk"), max_restarts=2)
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 30, "records through the map",
                 detail=lambda: job_picture(job))
        added = job.add_branch("m", _branch)
        start = added.cut["m/0"]
        wait_for(lambda: job.statistics().records_in("m") >= start + 1_000, 30, "records through the branch",
                 detail=lambda: job_picture(job))
        removed = job.remove_branch("big")
        assert removed.added == ("big", "large") and "big" not in job.plan.graph.nodes
        big = job.result("big")  # at once: the branch has ended
        assert any("remove_branch big" in e for e in job.status().events)
        assert not any(s.operator in ("big", "large") for s in job.statistics().instances)
        taken = job.checkpoint(60)  # without the branch
        ray.kill(job.topology.hosts()[0], no_restart=True)
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery",
                 detail=lambda: job.status().events)
        gate.open()
        job.wait(120)
        out = job.result("out")
    finally:
        job.cancel()
    end = removed.cut["m/0"]
    assert start < end and _recovered_from(job) == [taken], job.status().events
    assert sorted(r[0] for r in _rows(out)) == list(range(N))
    assert sorted(_rows(big)) == [r for r in _expected_after(out, start) if r[0] < end]


def test_a_detached_job_s_branch_outlives_its_manager_and_is_removed_through_the_handle(ray_session, tmp_path):
    """The branch goes into the job's record: a manager restarted after it runs the job with the branch (from
    the checkpoint that holds it), and ``remove_branch`` through the attached handle takes it out again."""
    from chiray.actors.jobs import jobstore

    gate = Gate(tmp_path)
    name = "branch-detached"
    job = chiray.submit(_flow(name, gate), name=name, detached=True, checkpoint_dir=str(tmp_path / "chk"))
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 60, "records through the map",
                 detail=lambda: job_picture(job))
        added = job.add_branch("m", _branch)
        assert "big" in cloudpickle.loads(jobstore.load(name).flow).graph.nodes
        taken = job.checkpoint(60)
        ray.kill(ray.get_actor(name, namespace="chiray"), no_restart=False)  # the manager dies
        wait_for(lambda: job.info()["restarts"] >= 1 and job.info()["state"] == "RUNNING", 90,
                 "the manager to run the job again", interval=0.2, detail=job.info)
        wait_for(lambda: job.statistics().records_in("big") >= 1, 60, "records through the branch again",
                 detail=lambda: job_picture(job))
        removed = job.remove_branch("big")
        assert "big" not in cloudpickle.loads(jobstore.load(name).flow).graph.nodes
        texts = [e.split(" ", 1)[1] for e in job.status().events]  # after each event's time
        assert [t for t in texts if t.startswith(("add_branch", "remove_branch"))] == [
            "add_branch large, big at m", "remove_branch big, large at m"]
        gate.open()
        job.wait(120)
        out, big = job.result("out"), job.result("big")
    finally:
        job.cancel()
        job.forget()
    assert sorted(r[0] for r in _rows(out)) == list(range(N))
    # a cut counts the records an instance emitted since it last started: the restarted job's map started at
    # the checkpoint (where its source had read this many)
    start, end = added.cut["m/0"], _records_read(tmp_path / "chk", taken) + removed.cut["m/0"]
    assert start < end and sorted(_rows(big)) == [r for r in _expected_after(out, start) if r[0] < end]


def test_a_host_killed_while_a_branch_is_added_leaves_the_job_exact_with_or_without_the_branch(ray_session,
                                                                                                tmp_path):
    """The kill lands before, during or after the branch's op: either the branch was added (and the recovery
    keeps it, from the checkpoint's cut) or the add failed with an error that says so (and the job runs on
    without it); the main output is exact either way."""
    import threading

    gate = Gate(tmp_path)
    job = chiray.submit(_flow("branch-during", gate), checkpoint_dir=str(tmp_path / "chk"), max_restarts=2)
    outcome: list[object] = []
    try:
        wait_for(lambda: job.statistics().records_in("m") >= 4_000, 30, "records through the map",
                 detail=lambda: job_picture(job))
        taken = job.checkpoint(60)

        def add() -> None:
            try:
                outcome.append(job.add_branch("m", _branch))
            except Exception as exc:  # what the caller sees when the job rolled back under the op
                outcome.append(exc)

        adding = threading.Thread(target=add)
        adding.start()
        ray.kill(job.topology.hosts()[0], no_restart=True)  # the source's, the map's and the controller's
        adding.join(120)
        assert outcome and not adding.is_alive()
        wait_for(lambda: any("recovered" in e for e in job.status().events), 60, "the recovery",
                 detail=lambda: job.status().events)
        gate.open()
        job.wait(120)
        out = job.result("out")
        big = job.result("big") if "big" in job.plan.graph.nodes else None
    finally:
        job.cancel()
    assert sorted(r[0] for r in _rows(out)) == list(range(N))
    if isinstance(outcome[0], Exception):
        assert big is None and isinstance(outcome[0], chiray.ChirayError), repr(outcome[0])
    else:  # added, then rolled back to the checkpoint before it: the branch starts at that checkpoint's cut
        assert big is not None and sorted(_rows(big)) == _expected_after(out, _records_read(tmp_path / "chk", taken))
