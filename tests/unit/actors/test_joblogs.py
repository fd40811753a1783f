"""Reading a worker's log files without Ray: the last lines, the lines after a cursor, Ray's marker lines left
out, and the newest file of a process id; checked against the lines as written (a plain list)."""

from __future__ import annotations

import os

import pytest

from chiray.actors.jobs import joblogs
from chiray.actors.jobs.joblogs import JobLogs, LogLine, read_lines, worker_log


def write(path, lines: list[str], end: str = "\n") -> None:
    with open(path, "a") as f:
        f.write("".join(f"{line}\n" for line in lines[:-1]) + (f"{lines[-1]}{end}" if lines else ""))


def test_the_markers_ray_writes_are_the_ones_left_out():
    from ray._private import ray_constants

    assert set(joblogs.RAY_MARKERS) == {ray_constants.LOG_PREFIX_JOB_ID, ray_constants.LOG_PREFIX_ACTOR_NAME,
                                        ray_constants.LOG_PREFIX_TASK_NAME}


@pytest.mark.parametrize("count", [0, 3, 5000])
def test_the_last_lines_without_rays_markers(tmp_path, count, monkeypatch):
    path = tmp_path / "worker-ab-01-7.out"
    written = []
    for i in range(count):
        written.append(f"line {i} " + "x" * (i % 50))
        write(path, [":job_id:01000000", ":actor_name:OperatorHost", written[-1]])
    if count == 0:
        path.write_text("")
    for n in (0, 1, 2, 10, 4000):
        lines, offset = read_lines(str(path), n)
        assert lines == (written[-n:] if n else []) and offset == os.path.getsize(path)


def test_the_lines_after_a_cursor_wait_for_their_end_and_survive_a_truncation(tmp_path, monkeypatch):
    path = tmp_path / "worker-ab-01-7.err"
    write(path, ["one", "two"])
    lines, cursor = read_lines(str(path), 10)
    assert lines == ["one", "two"]
    write(path, [":task_name:step", "three", "four, still being written"], end="")
    lines, cursor = read_lines(str(path), 10, cursor)
    assert lines == ["three"]  # the unfinished line comes once it ends
    write(path, [" and ended", "five"])
    lines, cursor = read_lines(str(path), 10, cursor)
    assert lines == ["four, still being written and ended", "five"]
    assert read_lines(str(path), 10, cursor) == ([], cursor)
    monkeypatch.setattr(joblogs, "FOLLOW_BYTES", 64)  # a busy file: only its newest bytes, from a whole line
    burst = [f"burst {i:03d}" for i in range(40)]
    write(path, burst)
    lines, cursor = read_lines(str(path), 10, cursor)
    assert lines == burst[-len(lines):] and 0 < len(lines) < len(burst)
    path.write_text("after rotation\n")  # shorter than the cursor: read from its end again
    assert read_lines(str(path), 10, cursor) == (["after rotation"], len("after rotation\n"))


def test_the_newest_file_of_a_process_id(tmp_path):
    assert worker_log(str(tmp_path), 42, "out") is None
    old = tmp_path / "worker-aa-01000000-42.out"
    new = tmp_path / "worker-bb-02000000-42.out"
    for path, when in ((old, 1_000), (new, 2_000), (tmp_path / "worker-cc-01000000-420.out", 3_000),
                       (tmp_path / "worker-dd-01000000-42.err", 3_000)):
        path.write_text("x\n")
        os.utime(path, (when, when))
    assert worker_log(str(tmp_path), 42, "out") == str(new)
    assert worker_log(str(tmp_path), 42, "err") == str(tmp_path / "worker-dd-01000000-42.err")


def test_lines_say_their_actor_and_the_answer_is_json():
    logs = JobLogs((LogLine("host-1", "err", "WARNING slow step"),), (("/logs/w.err", 12),), (("host-2", "gone"),))
    assert str(logs.lines[0]) == "host-1 err | WARNING slow step"
    assert logs.to_json() == {"lines": [{"source": "host-1", "stream": "err", "text": "WARNING slow step"}],
                              "missing": {"host-2": "gone"}}
    with pytest.raises(ValueError, match="lines must be an int from 0 to 100,000, got -1"):
        joblogs.job_logs({}, -1)
