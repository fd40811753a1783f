"""A Spark-fed job that outlives its driver, operated through the CLI only, exact against Spark SQL.

A Structured Streaming JSON file source (files written into a directory while
the job runs), preprocessed in Spark (a filter, a join with a static table, a
decimal column), feeds a keyed event-time window; the job is submitted
detached by a process that then exits (``scripts/spark_detached_flow.py``),
so its Spark side runs in an actor of the job's manager. Through ``chiray``'s
CLI: rescale, checkpoint, status and metrics (which show the Spark side);
then the Spark side is killed, the job manager is killed, a host is killed,
the job stops with a savepoint, and a second job restores it at another
parallelism and reads the rest. The Parquet output of both equals Spark
SQL's batch answer over every file exactly.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pyarrow.dataset as ds
import pytest

from chiray.cli import main
from tests.waiting import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.background, pytest.mark.timeout(900)]

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "spark_detached_flow.py"
ROWS_PER_FILE = 60
START_S = 240  # a Spark side starts a JVM: on a busy small machine, most of a minute


def write_files(root: pathlib.Path, first: int, count: int) -> None:
    """Files ``first .. first+count-1``: file k holds rows with ``t`` in [k*1000, k*1000+990], written whole."""
    for k in range(first, first + count):
        rows = [{"id": k * 1000 + i, "user": i % 12, "kind": "click" if i % 4 else "view",
                 "amount": f"{i}.{k % 100:02d}", "t": k * 1000 + i * 15} for i in range(ROWS_PER_FILE)]
        tmp = root / "in" / f".k{k}.tmp"
        tmp.write_text("\n".join(json.dumps(r) for r in rows))
        tmp.rename(root / "in" / f"part-{k:04d}.json")


def submit(root: pathlib.Path, name: str, parallelism: int, restore_from: str | None = None) -> None:
    """Submit from a process that exits at once (the job must not need it)."""
    import ray

    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": os.getcwd()}
    args = [sys.executable, str(SCRIPT), name, str(root), str(parallelism), *([restore_from] if restore_from else [])]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=START_S + 60)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def cli(*argv: str, ok: bool = True) -> Any:
    """``chiray ARGV --json`` in this process (connected to the session's Ray); its JSON (``None``: it failed,
    where ``ok`` is false)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--json"])
    if code != 0 and not ok:
        return None
    assert code == 0, out.getvalue() + err.getvalue()
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture
def jobs(ray_session):
    """The names of the detached jobs a test submits: any still there at its end is cancelled and forgotten."""
    names: list[str] = []
    yield names
    import chiray

    for name in names:
        try:
            job = chiray.attach(name)
            job.cancel()
            job.forget()
        except Exception:  # ended and forgotten by the test itself
            pass


def status(name: str) -> dict:
    """``chiray status NAME``; an empty one while the manager is between runs (a verb may fail then)."""
    return cli("status", name, ok=False) or {"sources": [], "events": [], "restarts": -1, "state": None}


def side_of(name: str) -> dict | None:
    """The Spark side's status (``None`` while the job's manager starts a new run)."""
    sources = status(name)["sources"]
    return sources[0] if sources else None


def wait_batches(name: str, past: int) -> int:
    """Wait until the job's Spark side ran a micro-batch after ``past``; the batch id."""
    def ran() -> int | None:
        side = side_of(name)
        batch = None if side is None else side["last_batch"]
        return batch if side and side["state"] == "RUNNING" and batch is not None and batch > past else None

    return wait_for(ran, START_S, f"job {name!r}'s query to run a batch after {past}", interval=1.0,
                    detail=lambda: status(name))


def spark_side_actor():
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == "chiray-spark" and a["name"].endswith("-spark")]
    assert len(names) == 1, names
    return ray.get_actor(names[0], namespace="chiray-spark")


def oracle(spark, root: pathlib.Path):
    """Spark SQL's batch answer over every file: per user and window, the count and the decimal sum."""
    spark.read.schema("id long, user long, kind string, amount string, t long").json(str(root / "in")) \
        .createOrReplaceTempView("events")
    spark.read.json(str(root / "users")).createOrReplaceTempView("users")
    return spark.sql("""
        SELECT e.user, CAST(FLOOR(t / 2500) * 2500 AS BIGINT) AS window_start, COUNT(*) AS n,
               SUM(CAST(amount AS DECIMAL(10,2))) AS total
        FROM events e JOIN users u ON e.user = u.user WHERE kind = 'click'
        GROUP BY e.user, FLOOR(t / 2500)""").toPandas()


def test_a_detached_spark_fed_job_survives_its_driver_and_every_fault_exactly(ray_session, spark, jobs, tmp_path):
    import ray

    root = tmp_path
    jobs += ["spark-detached", "spark-restored"]
    (root / "in").mkdir()
    (root / "users").mkdir()
    (root / "users" / "users.json").write_text(
        "\n".join(json.dumps({"user": u, "region": f"r{u % 3}"}) for u in range(0, 12) if u != 5))
    write_files(root, 0, 3)
    name = "spark-detached"
    submit(root, name, parallelism=1)
    batch = wait_batches(name, -1)

    cli("rescale", name, "win", "2", "--wait")
    write_files(root, 3, 2)
    batch = wait_batches(name, batch)
    assert cli("checkpoint", name)["id"] >= 1
    rows = cli("metrics", name)
    side = [r for r in rows if r.get("source_side")][0]["source_side"]
    assert side["kind"] == "spark streaming query" and side["rows_waiting"] is not None

    ray.kill(spark_side_actor())  # the Spark driver is lost: the manager restarts the job and a new side
    wait_for(lambda: any("source_recovery" in str(e) or "Spark side" in str(e)
                         for e in status(name)["events"]), 60, "the recovery after the Spark side died")
    write_files(root, 5, 2)
    batch = wait_batches(name, -1)

    ray.kill(ray.get_actor(name, namespace="chiray"), no_restart=False)  # the job manager (and its side) die
    wait_for(lambda: status(name)["restarts"] >= 1, 60, "the manager to restart")
    write_files(root, 7, 2)
    batch = wait_batches(name, -1)

    pids = ray.get(ray.get_actor(name, namespace="chiray").host_pids.remote())
    os.kill(pids[max(pids)], signal.SIGKILL)  # a host: the job recovers in place, the side stays
    write_files(root, 9, 2)
    batch = wait_batches(name, batch)

    stopped = wait_for(lambda: cli("stop", name, "--savepoint", str(root / "savepoints"), ok=False), 120,
                       "a stop with a savepoint (refused while the job recovers from the lost host)", interval=1.0)
    assert cli("status", name)["state"] == "FINISHED"
    wait_for(lambda: not [a for a in ray.util.list_named_actors(all_namespaces=True)
                          if a["namespace"] == "chiray-spark"], 30, "the stopped job's Spark side to be gone")

    write_files(root, 11, 2)  # read by the restored job only
    submit(root, "spark-restored", parallelism=3, restore_from=stopped["path"])
    wait_for(lambda: status("spark-restored")["state"] == "FINISHED", START_S + 120,
             "the restored job to read the rest and finish", interval=1.0, detail=lambda: status("spark-restored"))
    for job in (name, "spark-restored"):  # its manager records the end (and commits the final output)
        wait_for(lambda: cli("forget", job, ok=False) is not None, 30, f"job {job!r} to be forgotten")
    got = ds.dataset(str(root / "out")).to_table().to_pandas()  # after the commit: the run says FINISHED before

    expected = oracle(spark, root)
    key = ["user", "window_start"]
    got = got[[*key, "n", "total"]].sort_values(key).reset_index(drop=True)
    expected = expected[[*key, "n", "total"]].sort_values(key).reset_index(drop=True)
    assert len(got) == len(expected) and got[key].astype("int64").equals(expected[key].astype("int64"))
    assert got["n"].astype("int64").tolist() == expected["n"].astype("int64").tolist()
    assert [str(v) for v in got["total"]] == [str(v) for v in expected["total"]]  # decimals, exactly
