"""A detached job on a real multi-process Ray cluster (``ray start --head`` and a second ``ray start`` node on
this machine), operated only through the CLI.

The test starts its own head node and a worker node (each with its own ports
and temp dir, ``--block`` in a process group it owns; the head runs the
dashboard for ``ray job submit``) and stops exactly those processes whatever happens
(``ray stop`` would stop every Ray on the machine). The first job is deployed
as a user would, with ``ray job submit --no-wait`` of a driver script that
submits a detached flow and exits; later drivers run directly with ``RAY_ADDRESS``.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
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


@pytest.fixture(scope="module")
def cluster():
    """A head node of our own (its own ports and temp dir); only its processes are stopped."""
    with LocalCluster(num_cpus=4, worker_nodes=1, worker_cpus=2, dashboard=True) as head:  # two nodes, one machine
        yield head.address, head.env, head.metrics_ports, head.dashboard_address


def cli(env: dict, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "chiray", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    if ok:
        assert done.returncode == 0, f"chiray {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def cli_json(env: dict, *args: str):
    return json.loads(cli(env, *args, "--json").stdout)


def assert_one_line_error(done: subprocess.CompletedProcess, needle: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], done.stderr


def ray_cli(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *args], env=env, capture_output=True,
                          text=True, timeout=120)
    return done.stdout + done.stderr


def ray_job_submit(env: dict, dashboard: str, *args: str) -> str:
    """``ray job submit --no-wait`` of the driver script (as a user deploys); the submission id."""
    output = ray_cli(env, "job", "submit", "--address", dashboard, "--no-wait", "--",
                     sys.executable, str(SCRIPTS / "detached_flow.py"), *args)
    found = re.search(r"(raysubmit_\w+)", output)
    assert found, output
    return found.group(1)


def driver(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / "detached_flow.py"), *args], env=env,
                          capture_output=True, text=True, timeout=180)


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


def test_detached_job_through_the_cli(cluster, tmp_path):
    address, env, metrics_ports, dashboard = cluster
    out1, out2, chk1, chk2, sp = (str(tmp_path / d) for d in ("out1", "out2", "chk1", "chk2", "sp"))
    gate = Gate(tmp_path / "gate")  # the first job holds mid-input until the restored one runs
    os.makedirs(tmp_path / "gate")
    submission = ray_job_submit(env, dashboard, "wc", out1, chk1, "2", gate.path)  # the driver submits, exits
    wait_for(lambda: "succeeded" in ray_cli(env, "job", "status", "--address", dashboard, submission),
             "the submitted driver to exit")
    listed = wait_for(lambda: cli_json(env, "list", "--address", address) or None, "the detached job")
    assert [j["name"] for j in listed] == ["wc"] and listed[0]["state"] == "RUNNING"

    duplicate = driver(env, "wc", out1, chk1, "2", gate.path)  # Ray's own connect lines come first
    assert duplicate.returncode == 1 and "a job named 'wc' is already running" in duplicate.stderr.splitlines()[-1]
    assert_one_line_error(cli(env, "status", "nope", ok=False), "no job named 'nope'")
    assert_one_line_error(cli(env, "rescale", "wc", "nosuch", "2", ok=False), "nosuch")
    assert_one_line_error(cli(env, "list", "--address", f"127.0.0.1:{free_ports(1)[0]}", ok=False),
                          "no Ray cluster reachable")
    assert cli(env, "rescale", "wc", ok=False).returncode == 2

    rescaled = cli_json(env, "rescale", "wc", "count", "3", "--wait")
    assert rescaled["state"] == "done" and rescaled["to"] == 3 and rescaled["bins_moved"] > 0
    assert cli_json(env, "rescales", "wc")[0]["to"] == 3
    taken = cli_json(env, "checkpoint", "wc")
    assert os.path.isdir(taken["path"]) and taken["id"] >= 1
    rows = cli_json(env, "metrics", "wc")
    assert {r["operator"] for r in rows} == {"events", "count", "out"}
    assert len([r for r in rows if r["operator"] == "count"]) == 3

    subprocess.run([sys.executable, str(SCRIPTS / "kill_manager.py"), "wc"], env=env, check=True, timeout=60)
    status = wait_for(lambda: (s := cli_json(env, "status", "wc"))["restarts"] == 1
                      and s["state"] == "RUNNING" and s, "the restarted manager")
    assert any("recovery: the job manager restarted" in e for e in status["events"]), status["events"]
    assert status["operators"]["count"] == 3
    subprocess.run([sys.executable, str(SCRIPTS / "kill_host.py"), "wc", "count"], env=env, check=True,
                   timeout=60)  # a host process dies: the manager's supervisor rolls the job back
    wait_for(lambda: any("recovered from" in e for e in cli_json(env, "status", "wc")["events"]),
             "the job's recovery from the killed host")
    assert os.path.isdir(cli_json(env, "savepoint", "wc")["path"])

    stopped = cli_json(env, "stop", "wc", "--savepoint", sp)
    assert stopped["path"].startswith(sp)
    assert cli_json(env, "status", "wc")["state"] == "FINISHED"
    assert_one_line_error(cli(env, "checkpoint", "wc", ok=False), "finished")
    assert cli_json(env, "list", "--all")[0]["state"] == "FINISHED"

    gate.open()
    done = driver(env, "wc2", out2, chk2, "1", gate.path, sp, "--wait")  # restored at parallelism 1, to the end
    assert done.returncode == 0, done.stderr
    counts = pd.concat([pq.read_table(d).to_pandas() for d in (out1, out2) if os.listdir(d)])
    got = counts.groupby("key")["count"].sum()
    assert {k: int(v) for k, v in got.items()} == oracle()  # nothing lost or doubled

    final = {(r["operator"], r["instance"]): r["records_in"] for r in cli_json(env, "metrics", "wc2")}
    wait_for(lambda: scraped_records_in(scrape(metrics_ports), "wc2") == exported(final),
             "chiray_records_in on /metrics", timeout=30,
             detail=lambda: {"scraped": scraped_records_in(scrape(metrics_ports), "wc2"), "final": final})

    assert cli_json(env, "forget", "wc")["forgotten"] is True
    assert [j["name"] for j in cli_json(env, "list", "--all")] == ["wc2"]
    shut = Gate(tmp_path / "shut")  # never opened: the job cannot finish before it is cancelled
    os.makedirs(tmp_path / "shut")
    assert driver(env, "wc3", str(tmp_path / "out3"), str(tmp_path / "chk3"), "1", shut.path).returncode == 0
    assert cli_json(env, "cancel", "wc3")["state"] == "CANCELLED"
    assert cli_json(env, "status", "wc3")["state"] == "CANCELLED"


EMPTY_SPLIT = """
import chiray
flow = chiray.Dataflow("one-empty-split")
(flow.source(chiray.generate(1_000, batch_size=100, num_keys=10, num_splits=1), parallelism=2, name="events")
     .key_by("key").count(name="count").collect(name="out"))
chiray.submit(flow, name="empty-split", detached=True).wait(timeout=120)
"""


def test_an_instance_that_read_nothing_has_no_series_on_metrics(cluster):
    """The cause of the metrics wait's old flakiness: the job's final statistics list every instance, but
    Ray exports no series for a counter that never grew. A restored job whose source instance found its
    split already read (a stop that landed after that split ended) never matched its statistics."""
    address, env, metrics_ports, _ = cluster
    done = subprocess.run([sys.executable, "-c", EMPTY_SPLIT], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    final = {(r["operator"], r["instance"]): r["records_in"] for r in cli_json(env, "metrics", "empty-split")}
    assert final[("events", 1)] == 0 and final[("events", 0)] == 1_000  # one split for two instances
    wait_for(lambda: scraped_records_in(scrape(metrics_ports), "empty-split") == exported(final),
             "chiray_records_in on /metrics", timeout=30,
             detail=lambda: scraped_records_in(scrape(metrics_ports), "empty-split"))
    assert ("events", 1) not in scraped_records_in(scrape(metrics_ports), "empty-split")
    assert cli_json(env, "forget", "empty-split")["forgotten"] is True


def test_a_worker_node_that_exits_before_joining_is_started_again(monkeypatch):
    """A worker's ``ray start`` can exit before it joins (a port that ``free_ports`` gave was taken before Ray
    bound it); the cluster starts that worker again instead of waiting out its deadline."""
    spawn = LocalCluster._spawn_worker
    failed = []

    def first_one_fails(self, env):
        if failed:
            return spawn(self, env)
        worker, temp = spawn(self, env)  # a real one, with its ports and temp dir, that dies as a taken port would
        os.killpg(worker.pid, 9)
        failed.append(worker)
        return worker, temp

    monkeypatch.setattr(LocalCluster, "_spawn_worker", first_one_fails)
    with LocalCluster(num_cpus=1, worker_nodes=1, worker_cpus=1) as head:
        assert head.worker_restarts == 1 and failed[0].returncode is not None
        assert len(head.metrics_ports) == 2 and len(set(head.metrics_ports)) == 2
        code = ("import ray; ray.init(logging_level='ERROR'); "
                "print(sorted(n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']))")
        probe = subprocess.run([sys.executable, "-c", code], env=head.env, capture_output=True, text=True,
                               timeout=120, check=False)
        assert probe.stdout.strip().splitlines()[-1] == "[1.0, 1.0]", probe.stdout + probe.stderr
    assert not [p for p in failed if p.poll() is None]
