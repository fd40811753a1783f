"""A detached job on a real multi-process Ray cluster (``ray start --head`` and a second ``ray start`` node on
this machine), operated only through the CLI.

The module starts its own head node and a worker node (each with its own ports
and temp dir, ``--block`` in a process group it owns; the head runs the
dashboard for ``ray job submit``) and stops exactly those processes whatever happens
(``ray stop`` would stop every Ray on the machine). The worker's first ``ray start``
dies before it joins, as one whose port was taken would: the cluster starts it again
(``test_a_worker_node_that_exits_before_joining_is_started_again``). The first job is
deployed as a user would, with ``ray job submit --no-wait`` of a driver script that
submits a detached flow and exits.

A process of Python costs seconds to start and to connect to Ray, so the CLI
(``python -m chiray ...``), the later drivers and the crash scripts run as requests to one
process connected to the cluster (``scripts/warm_python.py``), which runs each as
``__main__`` with its own arguments and reports its output and exit code; the failures
that must be one line on stderr of a process of their own, and the usage error's exit
code, are real ``python -m chiray`` processes.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.request

import pandas as pd
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow  # a multi-process cluster of its own

SCRIPTS = pathlib.Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))

import detached_flow  # noqa: E402

from benchmarks.cluster import LocalCluster, free_ports  # noqa: E402
from tests.gate import Gate  # noqa: E402
from tests.oracles import key_counts  # noqa: E402
from tests.waiting import wait_for as wait_until  # noqa: E402


class FirstWorkerDies(LocalCluster):
    """A cluster whose first worker's ``ray start`` dies before it joins; ``spawned``: each worker's ``ray start``."""

    max_worker_restarts = LocalCluster.max_worker_restarts + 1  # the one it makes, and as many as any cluster

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.spawned: list[subprocess.Popen] = []

    def _spawn_worker(self, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
        worker, temp = super()._spawn_worker(env)
        if not self.spawned:  # a real one, with its ports and temp dir, that dies as a taken port would
            os.killpg(worker.pid, signal.SIGKILL)
        self.spawned.append(worker)
        return worker, temp


@pytest.fixture(scope="module")
def cluster():
    """A head node of our own (its own ports and temp dir) and a worker node; only their processes are stopped."""
    with FirstWorkerDies(num_cpus=4, worker_nodes=1, worker_cpus=2, dashboard=True) as head:  # one machine
        yield head


class WarmPython:
    """``scripts/warm_python.py`` in a process of its own: ``run(*argv)`` is ``python *argv`` run there."""

    def __init__(self, env: dict[str, str], log: pathlib.Path) -> None:
        self._log = log
        with open(log, "wb") as err:
            self._proc = subprocess.Popen([sys.executable, str(SCRIPTS / "warm_python.py")], env=env, text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._ready = False

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def _answer(self, timeout: float, what: str) -> dict:
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            self._stop()  # stuck: a late answer must not be taken for the next request's
            raise AssertionError(f"{what}: no answer within {timeout} s; {self._stderr()}") from None
        if line is None:
            raise AssertionError(f"{what}: warm_python.py exited ({self._proc.wait()}); {self._stderr()}")
        return json.loads(line)

    def _stderr(self) -> str:
        return "its stderr ends: " + "".join(self._log.read_text(errors="replace").splitlines(True)[-20:])

    def run(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        if self._proc.poll() is not None:
            raise AssertionError(f"warm_python.py is not running ({self._proc.returncode}); {self._stderr()}")
        if not self._ready:
            assert self._answer(120.0, "warm_python.py connecting to the cluster") == {"ready": True}
            self._ready = True
        argv = tuple(str(a) for a in argv)
        self._proc.stdin.write(json.dumps({"argv": argv}) + "\n")
        self._proc.stdin.flush()
        answer = self._answer(timeout, f"python {' '.join(argv)}")
        return subprocess.CompletedProcess(["python", *argv], answer["returncode"], answer["stdout"],
                                           answer["stderr"])

    def close(self) -> None:
        """The end of its input: it exits (killed if it does not within 30 s)."""
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._stop()

    def _stop(self) -> None:
        self._proc.kill()
        self._proc.wait()


@pytest.fixture(scope="module")
def python(cluster, tmp_path_factory):
    """One process connected to the cluster for the CLI, the drivers and the scripts (started, not waited for)."""
    warm = WarmPython(cluster.env, tmp_path_factory.mktemp("warm") / "stderr.log")
    try:
        yield warm
    finally:
        warm.close()


@pytest.fixture
def processes():
    """The processes a test starts in the background; any still running at its end is killed."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def cli(python: WarmPython, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = python.run("-m", "chiray", *args)
    if ok:
        assert done.returncode == 0, f"chiray {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def cli_json(python: WarmPython, *args: str):
    return json.loads(cli(python, *args, "--json").stdout)


def cli_process(processes: list, env: dict, *args: str) -> subprocess.Popen:
    """A real ``python -m chiray`` process, started now; ``finished(proc)`` is its outcome."""
    proc = subprocess.Popen([sys.executable, "-m", "chiray", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    processes.append(proc)
    return proc


def finished(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_one_line_error(done: subprocess.CompletedProcess, needle: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], done.stderr


def ray_job_submit(env: dict, dashboard: str, *args: str) -> str:
    """``ray job submit --no-wait`` of the driver script (as a user deploys); the submission id."""
    done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address", dashboard,
                           "--no-wait", "--", sys.executable, str(SCRIPTS / "detached_flow.py"), *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r"(raysubmit_\w+)", done.stdout + done.stderr)
    assert found, done.stdout + done.stderr
    return found.group(1)


def submitted(dashboard: str, submission: str, what: str = "") -> dict:
    """The dashboard's record of a ``ray job submit`` (what ``ray job status`` shows), or with ``what="logs"``
    its driver's output (``{"logs": ...}``)."""
    with urllib.request.urlopen(f"{dashboard}/api/jobs/{submission}/{what}".rstrip("/"), timeout=10) as r:
        return json.load(r)


def driver(python: WarmPython, *args: str) -> subprocess.CompletedProcess:
    return python.run(SCRIPTS / "detached_flow.py", *args, timeout=180)


def wait_for(condition, what: str, timeout: float = 45.0, detail=None):
    return wait_until(condition, timeout, what, interval=0.3, detail=detail)


def oracle() -> dict[str, int]:
    return key_counts(detached_flow.source())


def scrape(ports: list[int]) -> str:
    """Every node's Prometheus endpoint (a job's actors report where they run)."""
    texts = []
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            texts.append(r.read().decode())
    return "\n".join(texts)


def scraped_records_in(text: str, job: str) -> dict[tuple[str, int], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or "chiray_records_in" not in line or f'job="{job}"' not in line:
            continue
        op = re.search(r'operator="([^"]*)"', line).group(1)
        inst = re.search(r'instance="([^"]*)"', line).group(1)
        out[(op, int(inst))] = float(line.rsplit(" ", 1)[1])
    return out


def exported(final: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """What Ray's endpoint shows of a job's final counters: a counter that never grew has no series
    (``Counter.inc`` takes only positive values), so an instance that read nothing is absent."""
    return {key: value for key, value in final.items() if value > 0}


def test_detached_job_through_the_cli(cluster, python, processes, tmp_path):
    address, env, metrics_ports, dashboard = (cluster.address, cluster.env, cluster.metrics_ports,
                                              cluster.dashboard_address)
    out1, out2, chk1, chk2, sp = (str(tmp_path / d) for d in ("out1", "out2", "chk1", "chk2", "sp"))
    gate = Gate(tmp_path / "gate")  # the first job holds mid-input until the restored one runs
    os.makedirs(tmp_path / "gate")
    submission = ray_job_submit(env, dashboard, "wc", out1, chk1, "2", gate.path)  # the driver submits, exits
    no_job = cli_process(processes, env, "status", "nope")  # real processes, meanwhile: each takes seconds
    no_cluster = cli_process(processes, env, "list", "--address", f"127.0.0.1:{free_ports(1)[0]}")
    usage = cli_process(processes, env, "rescale", "wc")
    state = wait_for(lambda: (s := submitted(dashboard, submission)["status"]) in ("SUCCEEDED", "FAILED", "STOPPED")
                     and s, "the submitted driver to exit")
    assert state == "SUCCEEDED", submitted(dashboard, submission, "logs")["logs"]
    listed = wait_for(lambda: cli_json(python, "list", "--address", address) or None, "the detached job")
    assert [j["name"] for j in listed] == ["wc"] and listed[0]["state"] == "RUNNING"

    duplicate = driver(python, "wc", out1, chk1, "2", gate.path)
    assert duplicate.returncode == 1 and "a job named 'wc' is already running" in duplicate.stderr.splitlines()[-1]
    assert_one_line_error(finished(no_job), "no job named 'nope'")  # Ray's own connect lines included
    assert_one_line_error(cli(python, "rescale", "wc", "nosuch", "2", ok=False), "nosuch")
    assert_one_line_error(finished(no_cluster), "no Ray cluster reachable")
    assert finished(usage).returncode == 2

    rescaled = cli_json(python, "rescale", "wc", "count", "3", "--wait")
    assert rescaled["state"] == "done" and rescaled["to"] == 3 and rescaled["bins_moved"] > 0
    assert cli_json(python, "rescales", "wc")[0]["to"] == 3
    taken = cli_json(python, "checkpoint", "wc")
    assert os.path.isdir(taken["path"]) and taken["id"] >= 1
    rows = cli_json(python, "metrics", "wc")
    assert {r["operator"] for r in rows} == {"events", "count", "out"}
    assert len([r for r in rows if r["operator"] == "count"]) == 3

    killed = python.run(SCRIPTS / "kill_manager.py", "wc", timeout=60)
    assert killed.returncode == 0, killed.stderr
    status = wait_for(lambda: (s := cli_json(python, "status", "wc"))["restarts"] == 1
                      and s["state"] == "RUNNING" and s, "the restarted manager")
    assert any("recovery: the job manager restarted" in e for e in status["events"]), status["events"]
    assert status["operators"]["count"] == 3
    killed = python.run(SCRIPTS / "kill_host.py", "wc", "count", timeout=60)  # a host process dies: the
    assert killed.returncode == 0, killed.stderr  # manager's supervisor rolls the job back
    wait_for(lambda: any("recovered from" in e for e in cli_json(python, "status", "wc")["events"]),
             "the job's recovery from the killed host")
    assert os.path.isdir(cli_json(python, "savepoint", "wc")["path"])

    stopped = cli_json(python, "stop", "wc", "--savepoint", sp)
    assert stopped["path"].startswith(sp)
    assert cli_json(python, "status", "wc")["state"] == "FINISHED"
    assert_one_line_error(cli(python, "checkpoint", "wc", ok=False), "finished")
    assert cli_json(python, "list", "--all")[0]["state"] == "FINISHED"

    gate.open()
    done = driver(python, "wc2", out2, chk2, "1", gate.path, sp, "--wait")  # restored at parallelism 1, to the end
    assert done.returncode == 0, done.stderr
    counts = pd.concat([pq.read_table(d).to_pandas() for d in (out1, out2) if os.listdir(d)])
    got = counts.groupby("key")["count"].sum()
    assert {k: int(v) for k, v in got.items()} == oracle()  # nothing lost or doubled

    final = {(r["operator"], r["instance"]): r["records_in"] for r in cli_json(python, "metrics", "wc2")}
    wait_for(lambda: scraped_records_in(scrape(metrics_ports), "wc2") == exported(final),
             "chiray_records_in on /metrics", timeout=30,
             detail=lambda: {"scraped": scraped_records_in(scrape(metrics_ports), "wc2"), "final": final})

    assert cli_json(python, "forget", "wc")["forgotten"] is True
    assert [j["name"] for j in cli_json(python, "list", "--all")] == ["wc2"]
    shut = Gate(tmp_path / "shut")  # never opened: the job cannot finish before it is cancelled
    os.makedirs(tmp_path / "shut")
    assert driver(python, "wc3", str(tmp_path / "out3"), str(tmp_path / "chk3"), "1", shut.path).returncode == 0
    assert cli_json(python, "cancel", "wc3")["state"] == "CANCELLED"
    assert cli_json(python, "status", "wc3")["state"] == "CANCELLED"


EMPTY_SPLIT = """
import chiray
flow = chiray.Dataflow("one-empty-split")
(flow.source(chiray.generate(1_000, batch_size=100, num_keys=10, num_splits=1), parallelism=2, name="events")
     .key_by("key").count(name="count").collect(name="out"))
chiray.submit(flow, name="empty-split", detached=True).wait(timeout=120)
"""


def test_an_instance_that_read_nothing_has_no_series_on_metrics(cluster, python):
    """The cause of the metrics wait's old flakiness: the job's final statistics list every instance, but
    Ray exports no series for a counter that never grew. A restored job whose source instance found its
    split already read (a stop that landed after that split ended) never matched its statistics."""
    metrics_ports = cluster.metrics_ports
    done = python.run("-c", EMPTY_SPLIT, timeout=180)
    assert done.returncode == 0, done.stderr
    final = {(r["operator"], r["instance"]): r["records_in"] for r in cli_json(python, "metrics", "empty-split")}
    assert final[("events", 1)] == 0 and final[("events", 0)] == 1_000  # one split for two instances
    wait_for(lambda: scraped_records_in(scrape(metrics_ports), "empty-split") == exported(final),
             "chiray_records_in on /metrics", timeout=30,
             detail=lambda: scraped_records_in(scrape(metrics_ports), "empty-split"))
    assert ("events", 1) not in scraped_records_in(scrape(metrics_ports), "empty-split")
    assert cli_json(python, "forget", "empty-split")["forgotten"] is True


NODES = "import ray; print(sorted(n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']))"


def test_a_worker_node_that_exits_before_joining_is_started_again(cluster, python):
    """A worker's ``ray start`` can exit before it joins (a port that ``free_ports`` gave was taken before Ray
    bound it); the cluster starts that worker again instead of waiting out its deadline. This module's
    cluster is one whose first worker died so (``FirstWorkerDies``)."""
    first, *others, worker = cluster.spawned  # others: workers that a loaded machine failed to start
    assert first.returncode is not None and all(p.returncode is not None for p in others)  # dead, reaped
    assert worker.poll() is None and cluster.worker_restarts == 1 + len(others)  # each dead one started again
    assert len(cluster.metrics_ports) == 2 and len(set(cluster.metrics_ports)) == 2
    probe = python.run("-c", NODES)
    assert probe.stdout.strip().splitlines()[-1:] == ["[2.0, 4.0]"], probe.stdout + probe.stderr
