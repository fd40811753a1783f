"""The job verbs of the ``chiray`` CLI, without a cluster: usage errors, option parsing, JSON output."""

from __future__ import annotations

import enum
import json
import socket

import pytest

from chiray.cli import main
from chiray.actors.jobs.jobvalues import plain_json
from chiray.cli_jobs import CliError, _options


@pytest.mark.parametrize("argv", [["rescale", "wc"], ["status"], ["rescale", "wc", "count", "three"],
                                  ["rescale", "wc", "count", "2", "--strategy", "nope"], ["list", "--bogus"]])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2


def test_unreachable_cluster_is_one_line_and_exit_1(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    for argv in (["list"], ["status", "wc"], ["stop", "wc", "--savepoint", "/tmp/sp"]):
        assert main([*argv, "--address", f"127.0.0.1:{port}"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"no Ray cluster reachable at '127.0.0.1:{port}'" in err[0]


def test_options_parse_json_values_else_strings():
    assert _options(["chunk_bins=64", "priority=hot_first", "replicate=true", "gap_s=0.05"]) == {
        "chunk_bins": 64, "priority": "hot_first", "replicate": True, "gap_s": 0.05}
    with pytest.raises(CliError, match="--option expects KEY=VALUE, got 'chunk_bins'"):
        _options(["chunk_bins"])


def test_plain_makes_json():
    class State(str, enum.Enum):
        RUNNING = "RUNNING"

    data = {("count", 1): {"state": State.RUNNING, "events": ("a", "b"), "error": ValueError("bad")}}
    assert json.loads(json.dumps(plain_json(data))) == {"count/1": {"state": "RUNNING", "events": ["a", "b"],
                                                                "error": "bad"}}


def test_autoscale_verb_maps_its_flags_to_the_options(monkeypatch, capsys):
    import chiray.cli_jobs as cli_jobs

    calls = []

    class FakeJob:
        name = "wc"

        def autoscale(self, enabled, **options):
            calls.append((enabled, options))
            return {"name": "wc", "autoscale": "on" if enabled else "off", "options": options}

    monkeypatch.setattr(cli_jobs, "_attach", lambda args: FakeJob())
    assert main(["autoscale", "wc", "on", "--min", "2", "--max", "6", "--budget-ms", "250", "--operators",
                 "count,join", "--option", "cooldown_s=3", "--json"]) == 0
    assert calls[-1] == (True, {"cooldown_s": 3, "min_parallelism": 2, "max_parallelism": 6,
                                "latency_budget_ms": 250.0, "operators": ["count", "join"]})
    assert json.loads(capsys.readouterr().out)["autoscale"] == "on"
    assert main(["autoscale", "wc", "off"]) == 0 and calls[-1] == (False, {})
    assert main(["autoscale", "wc", "off", "--max", "3"]) == 1
    assert "autoscale off takes no options" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["autoscale", "wc", "sometimes"])
    assert exit_.value.code == 2


def test_tail_verb_prints_the_newest_rows_as_a_table_or_json(monkeypatch, capsys):
    import pyarrow as pa

    import chiray.cli_jobs as cli_jobs

    calls = []

    class FakeJob:
        name = "wc"

        def tail(self, sink, n):
            calls.append((sink, n))
            return pa.table({"word": ["a", "be"], "count": [4, 12]})

    monkeypatch.setattr(cli_jobs, "_attach", lambda args: FakeJob())
    assert main(["tail", "wc", "out", "-n", "2"]) == 0
    assert calls[-1] == ("out", 2)
    assert capsys.readouterr().out.splitlines() == ["wc: the newest rows of out: 2 rows", "word  count",
                                                    "a         4", "be       12"]
    assert main(["tail", "wc", "--json"]) == 0 and calls[-1] == (None, 10)
    assert json.loads(capsys.readouterr().out) == [{"word": "a", "count": 4}, {"word": "be", "count": 12}]


def test_rescale_wait_prints_one_line_per_state_when_not_on_a_terminal(monkeypatch, capsys):
    import chiray.cli_jobs as cli_jobs
    from chiray.actors.jobs.jobvalues import RescaleOutcome, RescaleProgress, RescaleState

    states = [RescaleState.WAITING] * 5 + [RescaleState.PLANNING] * 5 + [RescaleState.MIGRATING] * 90
    polls = [RescaleProgress("count", "fluid", s, steps_done=i // 10, steps=10, bins_moved=i, bins=100)
             for i, s in enumerate(states)]

    class Handle:
        id = "r1"

        def progress(self):
            return polls.pop(0) if polls else RescaleProgress("count", "fluid", RescaleOutcome.DONE, done=True)

        def result(self, timeout):
            return RescaleProgress("count", "fluid", RescaleOutcome.DONE, steps_done=10, steps=10, bins_moved=100,
                                   bins=100, done=True, from_=1, to=2, duration_s=1.5)

    class FakeJob:
        name = "wc"

        def rescale(self, operator, parallelism, strategy, **knobs):
            return Handle()

    monkeypatch.setattr(cli_jobs, "_attach", lambda args: FakeJob())
    monkeypatch.setattr(cli_jobs.time, "sleep", lambda s: None)
    assert main(["rescale", "wc", "count", "2", "--wait"]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    assert [line.split()[-1] for line in lines[:-1]] == ["WAITING", "PLANNING", "MIGRATING", "done"]
    assert lines[-1] == "rescaled 'count' 1 -> 2 in 1.50 s, 100 bins, 0.00 MiB moved"


def test_metrics_waits_for_the_in_band_monitor_briefly_and_shows_the_rest(monkeypatch, capsys):
    """A busy job answers the in-band monitor late: the rows (rates from the hosts' snapshots) come at once,
    without state sizes, instead of waiting for it."""
    import threading

    import chiray.cli_jobs as cli_jobs
    from chiray.actors.jobs.job import JobStatistics
    from chiray.actors.runtime.statistics import InstanceStatistics

    asked: list[float] = []
    released = threading.Event()

    class FakeJob:
        name = "wc"
        polls = 0

        def statistics(self):
            FakeJob.polls += 1
            return JobStatistics((InstanceStatistics("count", 0, 0, 100 * FakeJob.polls, 0, 1, 0, 0, 0, 0, 0.0,
                                                     0.0, False),), float(FakeJob.polls))

        def metrics(self, timeout):
            asked.append(timeout)
            released.wait(timeout)  # the monitor is stuck behind a long step
            raise TimeoutError("monitor")

    monkeypatch.setattr(cli_jobs, "_attach", lambda args: FakeJob())
    monkeypatch.setattr(cli_jobs.time, "sleep", lambda s: None)
    monkeypatch.setattr(cli_jobs, "MONITOR_WAIT_S", 0.05)
    assert main(["metrics", "wc", "--json"]) == 0
    released.set()
    (row,) = json.loads(capsys.readouterr().out)
    assert asked == [0.05] and row["in_per_s"] == 100.0 and row["state_bytes"] is None
