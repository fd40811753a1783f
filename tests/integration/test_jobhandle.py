"""``JobHandle`` conformance: every verb, on a driver-owned job and on an attached (detached) one, gives the same
answers and raises the same errors."""

from __future__ import annotations

import json
import os
import time
import uuid

import pyarrow as pa
import pytest
import ray

import chiray
from chiray.actors.jobs.handle import VERBS, JobHandle
from chiray.actors.jobs.joblogs import JobLogs, LogLine
from chiray.actors.jobs.savepoints import SavepointError
from chiray.cli import main
from tests.waiting import wait_for

pytestmark = pytest.mark.ray

KINDS = ["driver", "attached"]
WORDS = [{"word": w} for w in "a b a c b a d a".split()]


def _submit(flow: chiray.Dataflow, kind: str, tmp_path) -> JobHandle:
    chk = str(tmp_path / f"chk-{flow.name}")
    if kind == "driver":
        return chiray.submit(flow, checkpoint_dir=chk)
    return chiray.submit(flow, name=flow.name, detached=True, checkpoint_dir=chk)


def _name(what: str) -> str:
    return f"jh-{what}-{uuid.uuid4().hex[:6]}"


def _counts(table: pa.Table) -> dict[str, int]:
    return {w: c for w, c in zip(table.column("word").to_pylist(), table.column("count").to_pylist())}


def _running_flow() -> chiray.Dataflow:
    """A keyed count (each key's new count as batches arrive) over a paced input that runs until the test stops
    it."""
    flow = chiray.Dataflow(_name("running"))
    (flow.source(chiray.generate(None, rate=2_000, batch_size=200, num_keys=50, seed=3), name="events")
         .key_by("key").count(name="count", emit="updates").sink(chiray.collect(), name="out"))
    return flow


def _forget(job: JobHandle) -> None:
    job.cancel()
    job.forget()


def _ended_verbs(job: JobHandle, state: str) -> None:
    """Every verb that needs a running job raises the same ``JobEndedError`` on an ended one."""
    calls = {"checkpoint": lambda: job.checkpoint(), "checkpoint_info": lambda: job.checkpoint_info(),
             "savepoint": lambda: job.savepoint("/nonexistent"), "stop": lambda: job.stop(),
             "rescale": lambda: job.rescale("count", 2), "migrate": lambda: job.migrate("count", [0]),
             "metrics": lambda: job.metrics(), "autoscale": lambda: job.autoscale(), "tail": lambda: job.tail("out"),
             "run_control": lambda: job.run_control(object())}
    for call in calls.values():
        with pytest.raises(chiray.JobEndedError, match=rf"job '{job.name}' has ended \({state}\); there is "
                                                       rf"nothing left to"):
            call()
    job.cancel()  # an ended job stays as it ended
    assert job.status().state.value == state.upper()


def _saved(root) -> set[str]:
    """Oracle: the complete checkpoints (a manifest in a chk-N directory) under ``root`` on disk."""
    return {os.path.dirname(str(m)) for m in root.glob("*/chk-*/_MANIFEST.json")}


def _savepoint_verbs(job: JobHandle, tmp_path, sp: str, final: str, checkpoint: str) -> None:
    """On a stopped job: ``savepoints()`` lists what is on disk; deleting one removes it, a checkpoint is refused."""
    on_disk = _saved(tmp_path / "sp") | _saved(tmp_path / "final")
    assert {s.path for s in job.savepoints()} == on_disk == {sp, final}
    assert [s.path for s in job.savepoints()] == [sp, final]  # oldest first
    with pytest.raises(SavepointError, match=f"is not a savepoint of job '{job.name}'"):
        job.delete_savepoint(checkpoint)
    assert job.delete_savepoint(sp).path == sp and not os.path.exists(sp)
    assert [s.path for s in job.savepoints()] == [final] and _saved(tmp_path / "sp") == set()


def test_the_protocol_lists_every_verb_and_both_handles_have_them():
    assert set(VERBS) >= {"status", "statistics", "metrics", "rescale", "rescales", "checkpoint", "savepoint", "stop",
                          "cancel", "wait", "result", "run_control", "autoscale", "forget", "info", "migrate",
                          "tail", "savepoints", "delete_savepoint", "logs"}
    for cls in (chiray.Job, chiray.AttachedJob):
        assert all(callable(getattr(cls, verb, None)) for verb in VERBS), cls


@pytest.mark.parametrize("kind", KINDS)
def test_a_finished_job(ray_session, tmp_path, kind):
    flow = chiray.Dataflow(_name("finished"))
    flow.source(chiray.from_items(WORDS), name="words").key_by("word").count(name="count").sink(
        chiray.collect(), name="out")
    job = _submit(flow, kind, tmp_path)
    assert isinstance(job, JobHandle)
    job.wait(timeout=60)
    job.wait(timeout=0)
    assert _counts(job.result()) == {"a": 4, "b": 2, "c": 1, "d": 1}  # the same result from both
    assert _counts(job.result("out")) == _counts(job.result())
    with pytest.raises(ValueError, match="has no sink 'nope'"):
        job.result("nope")
    info = job.info()
    assert isinstance(info, chiray.JobInfo)
    assert info.state.value == "FINISHED" and info.to_json()["state"] == "FINISHED"
    assert dict(info.operators)["count"] == 1 and info.name == job.name
    assert job.status().state.value == "FINISHED"
    assert job.statistics().records_in("count") == len(WORDS)
    assert job.rescales() == ()
    _ended_verbs(job, "finished")
    job.forget()
    with pytest.raises(chiray.JobNotFoundError):
        wait_for(lambda: job.status() and False, 30, "the forgotten job to be gone")


@pytest.mark.parametrize("kind", KINDS)
def test_a_running_job(ray_session, tmp_path, kind):
    job = _submit(_running_flow(), kind, tmp_path)
    try:
        with pytest.raises(ValueError, match="timeout must be None"):
            job.wait(timeout=-1)
        with pytest.raises(TimeoutError, match=f"job '{job.name}' still running after 0 s"):
            job.wait(timeout=0)
        with pytest.raises(chiray.ChirayError, match="stop or cancel it first"):
            job.forget()
        assert job.status().state.value == "RUNNING" and job.info().state.value == "RUNNING"
        wait_for(lambda: job.statistics().records_in("count") > 0, 30, "records to reach the count")
        tail = wait_for(lambda: (t := job.tail("out", 40)).num_rows == 40 and t, 30, "40 rows to reach the sink")
        assert tail.column_names == ["key", "count"] and job.tail(n=3).num_rows == 3
        with pytest.raises(ValueError, match="has no sink 'nope'"):
            job.tail("nope")
        newest: dict[str, int] = {}
        for key, count in zip(tail.column("key").to_pylist(), tail.column("count").to_pylist()):
            assert count > newest.get(key, 0), "a key's updates come in order"
            newest[key] = count
        assert job.metrics(timeout=30).instances
        assert job.checkpoint() >= 1
        taken = job.checkpoint_info()
        assert isinstance(taken, chiray.CheckpointInfo) and os.path.isdir(taken.path)
        assert job.info().last_checkpoint is not None

        done = job.rescale("count", 2).result(60)
        assert done.state.value.lower() == "done" and done.bins_moved == done.bins > 0
        (entry,) = job.rescales()
        assert (entry.operator, entry.from_, entry.to, entry.state.value) == ("count", 1, 2, "done")
        assert entry.to_json()["from"] == 1 and entry["state"] == "done"  # the dict form of before
        assert dict(job.info().operators)["count"] == 2

        blocked = tmp_path / "blocked"
        blocked.write_text("a file where the stop's savepoint directory would go")
        with pytest.raises(chiray.CheckpointError):
            job.stop(savepoint=str(blocked / "final"))
        read = job.statistics().records_in("count")  # the stop failed: its halted sources read on
        wait_for(lambda: job.statistics().records_in("count") >= read + 400, 30, "records after the failed stop")
        assert job.status().state.value == "RUNNING"

        sp = job.savepoint(str(tmp_path / "sp"))
        assert sp.startswith(str(tmp_path / "sp")) and os.path.isdir(sp)
        stopped = job.stop(savepoint=str(tmp_path / "final"))
        assert isinstance(stopped, chiray.CheckpointInfo) and stopped.path.startswith(str(tmp_path / "final"))
        job.wait(timeout=30)  # stopped: finished
        assert job.status().state.value == "FINISHED"
        assert dict(job.info().operators) == {"events": 1, "count": 2, "out": 1}  # every operator, as it ended
        committed = job.result()  # what the final checkpoint committed: every row the tail saw, and more
        assert set(committed.column_names) >= {"key", "count"}
        assert set(zip(tail.column("key").to_pylist(), tail.column("count").to_pylist())) <= set(
            zip(committed.column("key").to_pylist(), committed.column("count").to_pylist()))
        _ended_verbs(job, "finished")
        _savepoint_verbs(job, tmp_path, sp, stopped.path, taken.path)
    finally:
        _forget(job)


def _shout(token: str):
    """A map that prints ``token`` and its process id for each batch (what ``logs`` should show)."""

    def shout(batch: pa.RecordBatch) -> pa.RecordBatch:
        print(f"{token} pid={os.getpid()}", flush=True)
        return batch

    return shout


@pytest.mark.parametrize("kind", KINDS)
def test_logs_show_what_a_user_function_printed_under_its_host(ray_session, tmp_path, kind, capsys):
    token = f"shout-{uuid.uuid4().hex[:8]}"
    flow = chiray.Dataflow(_name("logs"))
    (flow.source(chiray.generate(None, rate=200, batch_size=100, num_keys=5), name="events")
         .map(_shout(token), name="shout").sink(chiray.collect(), name="out"))
    job = _submit(flow, kind, tmp_path)
    try:
        if kind == "driver":
            pids = {h: ray.get(a.pid.remote()) for h, a in job.topology.peers().items()}
            read = job.logs
        else:  # through the command line, in this process
            pids = ray.get(ray.get_actor(job.name, namespace="chiray").host_pids.remote())

            def read(lines):
                assert main(["logs", job.name, "--lines", str(lines), "--json"]) == 0
                # Ray forwards the hosts' prints to this process's stdout too (`log_to_driver`): they may
                # land among what the CLI printed, so the answer is its one line of JSON.
                out = [s for s in capsys.readouterr().out.splitlines() if s.startswith("{")]
                assert len(out) == 1, out
                return JobLogs(tuple(LogLine(**line) for line in json.loads(out[0])["lines"]))

        def shouted():
            return [line for line in read(20).lines if line.text.startswith(token)]

        lines = wait_for(shouted, 30, "the printed line in the job's logs")
        printed = {int(line.text.rsplit("=", 1)[1]) for line in lines}
        assert {(line.source, line.stream) for line in lines} == {(f"host-{h}", "out") for h, pid in pids.items()
                                                                   if pid in printed}
        assert len(printed) == 1 and printed <= set(pids.values())
        if kind == "attached":
            assert "manager" not in dict(job.logs(0).missing)  # its own log is read too
            assert main(["logs", "no-such-job"]) == 1
            err = [s for s in capsys.readouterr().err.strip().splitlines()
                   if not s.startswith(("\x1b[", "("))]  # not what Ray forwards from the job's actors
            assert len(err) == 1 and "no job named 'no-such-job'" in err[0]
    finally:
        _forget(job)


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancelled_job(ray_session, tmp_path, kind):
    job = _submit(_running_flow(), kind, tmp_path)
    try:
        job.cancel()
        with pytest.raises(chiray.JobCancelledError, match=f"job '{job.name}' was cancelled"):
            job.wait(timeout=30)
        with pytest.raises(chiray.JobCancelledError):
            job.result()
        assert job.status().state.value == "CANCELLED"
        _ended_verbs(job, "cancelled")
    finally:
        _forget(job)


def _explode(record: dict) -> dict:
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_job(ray_session, tmp_path, kind):
    flow = chiray.Dataflow(_name("failed"))
    flow.source(chiray.from_items(WORDS), name="words").map(_explode, name="explode").sink(chiray.collect())
    job = _submit(flow, kind, tmp_path)
    try:
        with pytest.raises(chiray.OperatorError, match="operator 'explode' instance 0 failed: ZeroDivisionError"):
            job.wait(timeout=60)
        assert job.status().state.value == "FAILED"
        assert "ZeroDivisionError" in job.info().error
        _ended_verbs(job, "failed")
    finally:
        _forget(job)


def _held(entered: str, gate: str):
    """A map whose first step signals ``entered`` and then runs until ``gate`` exists (a long step of user code)."""

    def hold(batch: pa.RecordBatch) -> pa.RecordBatch:
        open(entered, "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return batch

    return hold


@pytest.mark.parametrize("kind", KINDS)
def test_reading_verbs_answer_while_a_step_of_user_code_runs(ray_session, tmp_path, kind):
    """status, info and statistics (what ``chiray status``, ``list`` and ``metrics`` show) do not wait for a
    host that runs a long step: they answer with the statistics it last took."""
    entered, gate = str(tmp_path / "entered"), str(tmp_path / "gate")
    flow = chiray.Dataflow(_name("held"))
    (flow.source(chiray.from_items(WORDS), name="words").map(_held(entered, gate), name="held")
         .key_by("word").count(name="count").sink(chiray.collect(), name="out"))
    job = _submit(flow, kind, tmp_path)
    try:
        wait_for(lambda: os.path.exists(entered), 60, "the held step to start")
        for verb in (job.status, job.info, job.statistics):
            started = time.monotonic()
            answer = verb()
            assert time.monotonic() - started < 5, f"{verb.__name__} waited for the held step"
            assert answer is not None
        assert {s.operator for s in job.statistics().instances} >= {"words", "held", "count", "out"}
        assert job.status().state.value == "RUNNING"
        open(gate, "w").close()
        job.wait(timeout=60)
        assert _counts(job.result()) == {"a": 4, "b": 2, "c": 1, "d": 1}
        assert job.statistics().records_in("held") == len(WORDS)  # the last snapshot, once ended, is exact
    finally:
        _forget(job)
