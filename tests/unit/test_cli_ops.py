"""The CLI's operations verbs without a cluster: ``--version``, ``savepoints`` (listing and ``--delete``, against the
directories on disk) and ``logs`` (its lines, ``--json`` and ``--follow``)."""

from __future__ import annotations

import json
import os
import platform

import pyarrow
import pytest
import ray

import chiray
import chiray.cli_jobs as cli_jobs
from chiray.actors.jobs.joblogs import JobLogs, LogLine
from chiray.actors.jobs.savepoints import delete_savepoint, find_savepoints
from chiray.cli import main
from chiray.control.coordination import JobState
from tests.unit.actors.test_savepoints import checkpoint, on_disk


def test_version_names_chiray_ray_pyarrow_and_python(capsys):
    expected = {"chiray": chiray.__version__, "ray": ray.__version__, "pyarrow": pyarrow.__version__,
                "python": platform.python_version()}
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{k} {v}" for k, v in expected.items()]
    assert main(["--version", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "a command is required (or --version)" in capsys.readouterr().err


class DiskJob:
    """A job whose savepoints are the directories under ``sp`` (the real listing and deletion)."""

    name = "wc"

    def __init__(self, sp: str):
        self.sp = sp

    def savepoints(self):
        return find_savepoints(self.name, [self.sp])

    def delete_savepoint(self, path):
        return delete_savepoint(self.name, path, self.savepoints(), {})


def test_savepoints_lists_and_deletes_what_is_on_disk(monkeypatch, capsys, tmp_path):
    sp = str(tmp_path / "sp")
    first = checkpoint(f"{sp}/wc-r00000001", 1, "wc")
    second = checkpoint(f"{sp}/wc-r00000002", 4, "wc", b"y" * 3000)
    monkeypatch.setattr(cli_jobs, "_attach", lambda args: DiskJob(sp))
    assert main(["savepoints", "wc", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {s["path"]: s["size_bytes"] for s in listed} == {p: size for p, (_, size) in on_disk(sp).items()}
    assert [(s["checkpoint_id"], s["run"]) for s in listed] == [(1, "r00000001"), (4, "r00000002")]
    assert main(["savepoints", "wc"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["CHECKPOINT", "TAKEN", "SIZE", "RUN", "PATH"]
    assert [(r.split()[0], r.split()[-2], r.split()[-1]) for r in rows] == [("1", "r00000001", first),
                                                                            ("4", "r00000002", second)]
    monkeypatch.chdir(sp)  # a relative path means one from where the command runs
    assert main(["savepoints", "wc", "--delete", os.path.relpath(first)]) == 0
    assert capsys.readouterr().out.strip() == f"deleted savepoint {first}"
    assert list(on_disk(sp)) == [second]
    assert main(["savepoints", "wc", "--delete", first]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"chiray savepoints: error: '{first}' is not a savepoint of job 'wc' (its savepoints: {second})"]
    assert list(on_disk(sp)) == [second]


class LogJob:
    """A job whose logs grow by one line per read, and which ends after its third."""

    name = "wc"

    def __init__(self):
        self.reads: list[object] = []

    def logs(self, lines, since=None):
        self.reads.append(since)
        n = len(self.reads)
        return JobLogs((LogLine("host-0", "out", f"line {n}"), LogLine("manager", "err", f"note {n}")),
                       (("/logs/worker-0.out", n),), (("host-1", "gone"),) if n == 1 else ())

    def info(self):
        state = JobState.FINISHED if len(self.reads) >= 3 else JobState.RUNNING
        return chiray.JobInfo("wc", state)


def test_logs_prints_each_line_with_its_actor_and_follows_until_the_job_ends(monkeypatch, capsys):
    job = LogJob()
    monkeypatch.setattr(cli_jobs, "_attach", lambda args: job)
    monkeypatch.setattr(cli_jobs.time, "sleep", lambda s: None)
    assert main(["logs", "wc", "--lines", "5"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["host-0 out | line 1", "manager err | note 1"]
    assert out.err.splitlines() == ["chiray logs: no log of host-1: gone"]
    assert main(["logs", "wc", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"lines": [{"source": "host-0", "stream": "out", "text": "line 2"},
                                                             {"source": "manager", "stream": "err", "text": "note 2"}],
                                                   "missing": {}}
    job.reads.clear()
    assert main(["logs", "wc", "--follow"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{s} | {t} {n}" for n in (1, 2, 3, 4)
                                                    for s, t in (("host-0 out", "line"), ("manager err", "note"))]
    assert job.reads == [None, (("/logs/worker-0.out", 1),), (("/logs/worker-0.out", 2),),
                         (("/logs/worker-0.out", 3),)]  # each read goes on from the last; one more after the end
    with pytest.raises(SystemExit) as exit_:
        main(["logs", "wc", "--lines", "many"])
    assert exit_.value.code == 2
