"""chaos.py: the randomized fault campaign: seeded faults on a running job, its output checked against an oracle.

One seed is one run; ``random.Random(seed)`` decides everything random (the
faults, their order and spacing, which host dies, which operator is rescaled
how). The job: ``generate`` (2 splits, 2 instances, paced at ``--rate``) ->
``slow`` (a map that sleeps ``SLOW_S`` once when a fault asks it to) ->
three Parquet sinks: ``raw`` (every record: key, seq, value), ``checks`` (a
keyed sequence checker: ``key_by("key").process``, one row per record with
the key's running count and a flag, ``ok``, ``gap`` (records of the key
skipped: lost), ``duplicate`` or ``reorder``) and ``counts`` (a keyed
``count``, emitted at the end). Checkpoints every second; hosts are checked
every 0.2 s; a step over 1 s is an event.

``generate``'s ``seq`` counts records per split, so a key's records come in
one order per split, interleaved arbitrarily. The checker reads the source's
splits itself (as the oracle does, once per process) to know each record's
split and its position among its key's records of that split, and keeps per
key the last position per split, the positions it skipped and its count.

Fault kinds (``--kinds``, default all), drawn per run without replacement
until each was drawn once, then again, each after a pause of 0.6-1.4 s once
the job runs again: ``host_kill`` (``ray.kill`` a host), ``controller_kill``
(the job then runs its controller in an actor of its own), ``manager_kill`` (a run
with one submits its jobs detached, ``submit(detached=True)``, and kills the job's manager
actor as a crash would: Ray restarts it and the job rolls back to its last checkpoint; in such
a run hosts and controllers die by ``SIGKILL`` of their process, whose id the manager tells),
``kill_during_checkpoint``
(a checkpoint started in a thread, a host killed right after),
``rescale`` (``check`` or ``count`` up or down by one, within 1-3, with a
random strategy; waits for its result), ``rescale_kill`` (a host killed
while a rescale runs), ``savepoint``, ``stop_restore`` (``job.stop(savepoint=)``
then the same flow submitted with ``restore_from`` into new output
directories; the campaign goes on with the new job), ``stop_restore_same_dir``
(into the same directories), ``storage_error`` (a plain file where the next
checkpoint's directory goes, so that checkpoint fails and the next one must
commit its output; then the newest checkpoint's state file is emptied and a
host killed: the recovery must fall back to the one before) and ``slow_step``.

Checked after the chain of jobs ended, over the union of their committed
files (``job.result(sink)``; a ``part-`` file in the directories that no job
lists counts as a defect), against the source read directly and a plain
Python count: ``lost``, ``duplicated`` (the raw multiset, and the checker's
rows against one per record), ``reordered`` (the checker's flags),
``counts_exact`` (the keyed count and the checker's final counts). A fault
whose operation failed cleanly (a rescale that a kill or the input's end
cut short) is reported, not a defect. Recoveries come from the jobs' events
(``recovered from ... in X.XX s``); ``back_s`` per fault is the time from the
fault to the job running again (the recovery seen, the rescale done, the
restored job running, the slow step over).

Expected on a 2-core machine: recoveries 2-5 s (the supervisor's own figure:
killing and starting the hosts, restoring state; up to 8 s after a
``rescale_kill`` that left three instances), ``back_s`` of a kill a few
tenths to a few seconds more; nothing lost, duplicated or reordered, ever.
``--quick`` (2 runs, 2 faults each): ~45 s.

Run: ``python -m benchmarks.chaos [--quick] [--seeds 1-20] [--kinds a,b] [--faults N] [--records N]
[--rate R] [--num-hosts N] [--keep]``; exits 1 if anything was lost, duplicated or reordered, a
count was wrong or a run failed (its directory is kept and named).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray

from chiray.actors.jobs.jobstore import NAMESPACE
from chiray.actors.jobs.jobvalues import EventKind
from chiray.actors.runtime.storage import CheckpointStorage
from chiray.control.coordination import JobState
from chiray.operators import Dataflow, generate, to_parquet
from benchmarks.common import emit, start_ray, stop_ray

KINDS = ("host_kill", "controller_kill", "manager_kill", "kill_during_checkpoint", "rescale", "rescale_kill",
         "savepoint", "stop_restore", "stop_restore_same_dir", "storage_error", "slow_step")
QUICK_KINDS = ("host_kill", "rescale", "stop_restore_same_dir", "storage_error")
STRATEGIES = ("all_at_once", "batched", "fluid", "non_disruptive")
KEYED = ("check", "count")
SINKS = ("raw", "checks", "counts")
SPLITS, NUM_BINS, MAX_PARALLELISM = 2, 16, 3
SLOW_S = 2.0
GAP_S = (0.6, 1.4)
WAIT_S = 90.0  # longest wait for one fault's effect
RECOVERED = re.compile(r"^recovered from (.*) in ([0-9.]+) s$", re.DOTALL)
CHECK_SCHEMA = pa.schema([("key", pa.string()), ("split", pa.int64()), ("seq", pa.int64()), ("pos", pa.int64()),
                          ("count", pa.int64()), ("flag", pa.string()), ("missing", pa.int64())])


# -- the job ------------------------------------------------------------------------------------------------

def make_checker(source: Any) -> Callable[..., list[dict]]:
    """The per-key sequence checker: ``fn(key, rows, state)`` for ``KeyedStream.process``.

    Self-contained (Ray ships it by value): on its first call in a process it reads the source's splits
    into ``split -> (keys, values, positions)`` indexed by ``seq``. State per key (immutable, so a
    checkpoint never sees it change): ``(count, last position per split, skipped positions per split)``.
    """
    index: dict[int, tuple[list, list, list]] = {}

    def positions() -> dict[int, tuple[list, list, list]]:
        if not index:
            for split in source.splits():
                reader, keys, values, pos = source.open_split(split), [], [], []
                seen: dict[Any, int] = {}
                while (batch := reader.read()) is not None:
                    for k, v in zip(batch.column("key").to_pylist(), batch.column("value").to_pylist()):
                        keys.append(k)
                        values.append(v)
                        pos.append(seen.get(k, 0))
                        seen[k] = pos[-1] + 1
                index[split.payload] = (keys, values, pos)
        return index

    def check(key: Any, rows: Any, state: Any) -> list[dict]:
        idx = positions()
        count, last, skipped = state.value or (0, (-1,) * len(idx), (frozenset(),) * len(idx))
        last, skipped, out = list(last), list(skipped), []
        for seq, value in zip(rows.column("seq").to_pylist(), rows.column("value").to_pylist()):
            count += 1
            hits = [s for s, (ks, vs, _) in idx.items() if seq < len(ks) and ks[seq] == key and vs[seq] == value]
            if len(hits) != 1:
                out.append({"key": key, "split": -1, "seq": seq, "pos": -1, "count": count, "flag": "unknown",
                            "missing": 0})
                continue
            s, missing = hits[0], 0
            p = idx[s][2][seq]
            if p == last[s] + 1:
                flag, last[s] = "ok", p
            elif p > last[s] + 1:
                flag, missing = "gap", p - last[s] - 1
                skipped[s] = skipped[s] | frozenset(range(last[s] + 1, p))
                last[s] = p
            elif p in skipped[s]:
                flag, skipped[s] = "reorder", skipped[s] - {p}
            else:
                flag = "duplicate"
            out.append({"key": key, "split": s, "seq": seq, "pos": p, "count": count, "flag": flag,
                        "missing": missing})
        state.value = (count, tuple(last), tuple(skipped))
        return out

    return check


def make_slow(directory: str, sleep_s: float) -> Callable[[Any], Any]:
    """A pass-through map that sleeps ``sleep_s`` once per ``N.trigger`` file put in ``directory`` (the
    instance that creates ``N.done`` first sleeps)."""

    def slow(batch: Any) -> Any:
        for name in os.listdir(directory):
            if name.endswith(".trigger"):
                try:
                    os.close(os.open(os.path.join(directory, name[:-8] + ".done"), os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    continue
                time.sleep(sleep_s)
        return batch

    return slow


def build_flow(name: str, source: Any, out: dict[str, str], slow_dir: str) -> Dataflow:
    """generate (p=2) -> slow -> {raw, key_by -> check (p=2) -> checks, key_by -> count (p=2) -> counts}."""
    flow = Dataflow(name, num_bins=NUM_BINS)
    stream = flow.source(source, parallelism=SPLITS, name="src").map(
        make_slow(slow_dir, SLOW_S), name="slow", schema=source.schema())
    stream.map(lambda b: b.select(["key", "seq", "value"]), name="project").sink(to_parquet(out["raw"]), name="raw")
    stream.key_by("key").process(make_checker(source), name="check", parallelism=2, schema=CHECK_SCHEMA).sink(
        to_parquet(out["checks"]), name="checks")
    stream.key_by("key").count(name="count", parallelism=2).sink(to_parquet(out["counts"]), name="counts")
    return flow


class Run:
    """One seed's chain of jobs (a stop/restore adds one): the job now running, every job with its output
    and checkpoint directories, and the time the run started. Only the campaign's thread touches it."""

    def __init__(self, seed: int, source: Any, tmp: str, num_hosts: int | None, controller_process: bool,
                 detached: bool = False):
        self.seed, self.source, self.tmp, self.detached = seed, source, tmp, detached
        self.options = {"checkpoint_interval_s": 1.0, "poll_interval_s": 0.2, "step_warning_s": 1.0,
                        "max_restarts": 1000, "num_hosts": num_hosts, "controller_process": controller_process}
        self.jobs: list[tuple[Any, dict[str, str], str]] = []
        self.slow_dir, self.slow_faults = os.path.join(tmp, "slow"), 0
        os.makedirs(self.slow_dir)
        self.t0 = time.monotonic()

    @property
    def job(self) -> Any:
        return self.jobs[-1][0]

    @property
    def chk(self) -> str:
        return self.jobs[-1][2]

    def submit(self, same_dir: bool = False, restore_from: str | None = None) -> Any:
        """Submit the flow (restored from ``restore_from``) into new output directories or, with
        ``same_dir``, the last job's."""
        out = self.jobs[-1][1] if same_dir else {s: os.path.join(self.tmp, f"out-{len(self.jobs)}", s)
                                                 for s in SINKS}
        chk = os.path.join(self.tmp, f"chk-{len(self.jobs)}")
        flow = build_flow(f"chaos-{self.seed}", self.source, out, self.slow_dir)
        named = {"detached": True, "name": f"chaos-{self.seed}-{len(self.jobs)}-{os.getpid()}"} if self.detached \
            else {}
        self.jobs.append((flow.submit(checkpoint_dir=chk, restore_from=restore_from, **self.options, **named),
                          out, chk))
        return self.job

    def manager(self) -> Any:
        """The running job's manager actor (a detached run's)."""
        return ray.get_actor(self.job.name, namespace=NAMESPACE)

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)


# -- waiting on the job -------------------------------------------------------------------------------------

def texts(status: Any) -> list[str]:
    """A ``JobStatus``'s events in words, without their times, and a run's events without the "run N: " a
    detached job's manager puts before them."""
    return [dict(e.fields).get("text", e.text) if e.kind is EventKind.RUN else e.text for e in status.history]


def recoveries(job: Any) -> list[str]:
    return [e for e in texts(job.status()) if e.startswith("recovered from")]


def wait_until(condition: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """Poll ``condition`` every 50 ms until truthy (returned) or ``timeout`` (None); a call that raises
    (the controller being replaced) counts as false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.05)
    return None


def wait_recovered(job: Any, before: int, t: float) -> dict[str, Any]:
    """After a kill: wait for a recovery past the ``before`` ones and the job running (or ended)."""

    def done() -> Any:
        status = job.status()
        if status.state.terminal:
            return ("ended", status)
        seen = [e for e in texts(status) if e.startswith("recovered from")]
        return len(seen) > before and status.state is JobState.RUNNING and ("running", status)

    what, status = wait_until(done) or ("timeout", None)
    new = [] if status is None else [e for e in texts(status) if e.startswith("recovered from")][before:]
    return {"back_s": round(time.monotonic() - t, 2) if what == "running" else None,
            "recovered": [float(m.group(2)) for e in new if (m := RECOVERED.match(e))],
            **({} if what == "running" else {"note": f"no recovery seen: {what}"})}


def kill_host(run: Run, rng: random.Random) -> tuple[int, int]:
    """Kill a random host (never restarted by Ray); the recoveries seen before and the host's index."""
    before = len(recoveries(run.job))
    if run.detached:  # a crash of its process: SIGKILL
        pids = ray.get(run.manager().host_pids.remote(), timeout=30)
        i = rng.randrange(len(pids))
        os.kill(pids[sorted(pids)[i]], signal.SIGKILL)
        return before, i
    hosts = run.job.topology.hosts()
    i = rng.randrange(len(hosts))
    ray.kill(hosts[i], no_restart=True)
    return before, i


def parallelism(run: Run, operator: str) -> int:
    if run.detached:
        return dict(run.job.info().operators)[operator]
    return int(run.job.plan.graph.nodes[operator].parallelism)


def committed_ids(chk: str) -> list[int]:
    storage = CheckpointStorage(chk)
    return [i for i in storage.checkpoint_ids() if storage.has_manifest(i)]


# -- the faults: each returns what it did and when the job ran again ----------------------------------------

def fault_host_kill(run: Run, rng: random.Random) -> dict[str, Any]:
    t = time.monotonic()
    before, host = kill_host(run, rng)
    return {"host": host, **wait_recovered(run.job, before, t)}


def fault_controller_kill(run: Run, rng: random.Random) -> dict[str, Any]:
    before, t = len(recoveries(run.job)), time.monotonic()
    if run.detached:
        pid = ray.get(run.manager().controller_pid.remote(), timeout=30)
        assert pid is not None, "a controller_kill run's controller has no process of its own"
        os.kill(pid, signal.SIGKILL)
    else:
        ray.kill(run.job.topology.controller, no_restart=True)
    return wait_recovered(run.job, before, t)


def fault_manager_kill(run: Run, rng: random.Random) -> dict[str, Any]:
    """Kill the job's manager actor (Ray restarts it; the job rolls back to its last checkpoint)."""
    job = run.job
    restarts, t = job.info().restarts, time.monotonic()
    ray.kill(run.manager(), no_restart=False)

    def back() -> Any:
        info = job.info()
        if info.state.terminal:
            return "ended"
        return info.restarts > restarts and info.state is JobState.RUNNING and not info.restarting and "running"

    what = wait_until(back) or "timeout"
    return {"back_s": round(time.monotonic() - t, 2) if what == "running" else None,
            **({} if what == "running" else {"note": f"the manager did not come back: {what}"})}


def fault_kill_during_checkpoint(run: Run, rng: random.Random) -> dict[str, Any]:
    job, outcome = run.job, {}

    def take() -> None:
        try:
            outcome["checkpoint"] = job.checkpoint(timeout=60)
        except Exception as exc:
            outcome["checkpoint"] = type(exc).__name__
    thread = threading.Thread(target=take, daemon=True)
    t = time.monotonic()
    thread.start()
    time.sleep(rng.uniform(0.0, 0.1))
    before, host = kill_host(run, rng)
    result = wait_recovered(job, before, t)
    thread.join(WAIT_S)
    return {"host": host, **outcome, **result}


def start_rescale(run: Run, rng: random.Random) -> tuple[Any, dict[str, Any]]:
    operator = rng.choice(KEYED)
    p = parallelism(run, operator)
    new = p + 1 if p == 1 or (p < MAX_PARALLELISM and rng.random() < 0.5) else p - 1
    strategy = rng.choice(STRATEGIES)
    return run.job.rescale(operator, new, strategy=strategy), {"operator": operator, "from": p, "to": new,
                                                               "strategy": strategy}


def fault_rescale(run: Run, rng: random.Random) -> dict[str, Any]:
    t = time.monotonic()
    handle, detail = start_rescale(run, rng)
    try:
        handle.result(timeout=WAIT_S)
        detail["back_s"] = round(time.monotonic() - t, 2)
    except Exception as exc:
        detail.update(failed=f"{type(exc).__name__}: {exc}"[:300], back_s=None)
    return detail


def fault_rescale_kill(run: Run, rng: random.Random) -> dict[str, Any]:
    t = time.monotonic()
    handle, detail = start_rescale(run, rng)
    time.sleep(rng.uniform(0.05, 0.5))
    before, detail["host"] = kill_host(run, rng)
    try:
        handle.result(timeout=WAIT_S)
        detail["rescale"] = "done"
    except Exception as exc:
        detail["rescale"] = type(exc).__name__
    return {**detail, **wait_recovered(run.job, before, t)}


def fault_savepoint(run: Run, rng: random.Random) -> dict[str, Any]:
    t = time.monotonic()
    path = run.job.savepoint(os.path.join(run.tmp, "savepoints"), timeout=WAIT_S)
    return {"path": os.path.relpath(path, run.tmp), "back_s": round(time.monotonic() - t, 2)}


def stop_and_restore(run: Run, same_dir: bool) -> dict[str, Any]:
    t, old = time.monotonic(), run.job
    info = old.stop(savepoint=os.path.join(run.tmp, "savepoints"), timeout=WAIT_S)
    if not any(e.startswith("stopped at checkpoint") for e in texts(old.status())):
        return {"note": "the input ended before the stop: nothing to restore", "back_s": None}
    new = run.submit(same_dir=same_dir, restore_from=info.path)
    running = wait_until(lambda: new.status().state in (JobState.RUNNING, JobState.FINISHED))
    return {"savepoint": os.path.relpath(info.path, run.tmp), "job": len(run.jobs) - 1,
            "back_s": round(time.monotonic() - t, 2) if running else None}


def fault_stop_restore(run: Run, rng: random.Random) -> dict[str, Any]:
    return stop_and_restore(run, same_dir=False)


def fault_stop_restore_same_dir(run: Run, rng: random.Random) -> dict[str, Any]:
    return stop_and_restore(run, same_dir=True)


def fault_storage_error(run: Run, rng: random.Random) -> dict[str, Any]:
    """A failed checkpoint (a file where its directory goes), then a torn state file and a host killed."""
    storage, t = CheckpointStorage(run.chk), time.monotonic()
    blocked = max(storage.checkpoint_ids(), default=0) + 1
    while os.path.exists(storage.chk_dir(blocked)):
        blocked += 1
    open(storage.chk_dir(blocked), "x").close()
    later = wait_until(lambda: max(committed_ids(run.chk), default=0) > blocked or run.job.status().state.terminal)
    detail: dict[str, Any] = {"blocked": blocked, "next_committed_s": round(time.monotonic() - t, 2) if later else None}
    torn = tear_newest(storage, run.chk)
    if torn is None or run.job.status().state.terminal:
        return {**detail, "note": "no checkpoint to tear", "back_s": None}
    t = time.monotonic()
    before, detail["host"] = kill_host(run, rng)
    result = wait_recovered(run.job, before, t)
    newest = next(iter(recoveries(run.job)[before:]), "")
    return {**detail, "torn": torn, "fell_back": "unreadable" in newest, **result}


def tear_newest(storage: CheckpointStorage, chk: str) -> int | None:
    """Empty a state file of the newest complete checkpoint; its id (None if none stayed to tear)."""
    for _ in range(5):  # retention may delete the one picked meanwhile
        ids = committed_ids(chk)
        if not ids:
            return None
        try:
            own = f"chk-{ids[-1]:06d}/"  # a file this checkpoint wrote (older ones it names are others')
            state = min(f for f in storage.files_of(storage.load(ids[-1])) if f.startswith(own))
            with open(os.path.join(chk, state), "r+") as f:
                f.truncate(0)
            return ids[-1]
        except Exception:
            time.sleep(0.05)
    return None


def fault_slow_step(run: Run, rng: random.Random) -> dict[str, Any]:
    run.slow_faults += 1
    base = os.path.join(run.slow_dir, str(run.slow_faults))
    t = time.time()
    open(base + ".trigger", "x").close()
    started = wait_until(lambda: os.path.exists(base + ".done") or run.job.status().state.terminal, 30)
    if not started or not os.path.exists(base + ".done"):
        return {"note": "no batch came through the map", "back_s": None}
    began = os.stat(base + ".done").st_mtime
    warned = wait_until(lambda: any(e.startswith("slow step") for e in texts(run.job.status())), SLOW_S + 3)
    return {"warned": bool(warned), "back_s": round(began + SLOW_S - t, 2)}


FAULTS: dict[str, Callable[[Run, random.Random], dict[str, Any]]] = {
    "host_kill": fault_host_kill, "controller_kill": fault_controller_kill, "manager_kill": fault_manager_kill,
    "kill_during_checkpoint": fault_kill_during_checkpoint, "rescale": fault_rescale,
    "rescale_kill": fault_rescale_kill, "savepoint": fault_savepoint, "stop_restore": fault_stop_restore,
    "stop_restore_same_dir": fault_stop_restore_same_dir, "storage_error": fault_storage_error,
    "slow_step": fault_slow_step}


# -- one run ------------------------------------------------------------------------------------------------

def schedule(rng: random.Random, kinds: list[str], n: int) -> list[tuple[str, float]]:
    """``n`` (kind, pause before it) pairs: the kinds drawn without replacement, the pool refilled when empty."""
    pool: list[str] = []
    out = []
    for _ in range(n):
        if not pool:
            pool = list(kinds)
            rng.shuffle(pool)
        out.append((pool.pop(), round(rng.uniform(*GAP_S), 2)))
    return out


def inject(run: Run, rng: random.Random, plan: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """Each fault of ``plan`` after its pause, while the input flows; those due after the job ended are
    reported as skipped."""
    faults = []
    for kind, gap in plan:
        time.sleep(gap)
        at = run.now()
        if run.job.status().state.terminal:
            faults.append({"kind": kind, "at_s": at, "skipped": "the job had ended"})
            continue
        print(f"  seed {run.seed}: {kind} at {at:.1f} s", flush=True)
        try:
            detail = FAULTS[kind](run, rng)
        except Exception as exc:  # the operation failed cleanly (it is reported; the output is still checked)
            detail = {"failed": f"{type(exc).__name__}: {exc}"[:300], "back_s": None}
        faults.append({"kind": kind, "at_s": at, **detail})
    return faults


def run_seed(seed: int, kinds: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One run: submit, inject the seed's faults, wait for the chain's end, check its output."""
    rng = random.Random(seed)
    plan = schedule(rng, kinds, args.faults)
    source = generate(args.records, rate=args.rate, batch_size=args.batch_size, num_keys=args.keys,
                      num_splits=SPLITS, seed=seed)
    tmp = tempfile.mkdtemp(prefix=f"chiray-chaos-{seed}-")
    kinds_drawn = {k for k, _ in plan}
    run = Run(seed, source, tmp, args.num_hosts, controller_process="controller_kill" in kinds_drawn,
              detached="manager_kill" in kinds_drawn)
    print(f"seed {seed}: {args.records:,} records at {args.rate:,.0f}/s; faults {[k for k, _ in plan]}", flush=True)
    faults: list[dict[str, Any]] = []
    error = None
    try:
        run.submit()
        faults = inject(run, rng, plan)
        run.job.wait(timeout=WAIT_S + 2 * args.records / args.rate)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        for job, _, _ in run.jobs:
            job.cancel()
    result = {"seed": seed, "detached": run.detached, "faults": faults, "recoveries": chain_recoveries(run),
              "jobs": len(run.jobs), "wall_s": run.now(), **verify(run, error)}
    if run.detached:  # their managers and records go
        for job, _, _ in run.jobs:
            try:
                job.forget()
            except Exception as exc:
                result.setdefault("not_forgotten", []).append(f"{job.name}: {type(exc).__name__}: {exc}"[:200])
    if result["exact"] and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        result["dir"] = tmp
    return result


def chain_recoveries(run: Run) -> list[dict[str, Any]]:
    """Every recovery of the chain's jobs, from their events: which job, from where, how long it took."""
    out: list[dict[str, Any]] = []
    for i, (job, _, _) in enumerate(run.jobs):
        try:
            events = texts(job.status())
        except Exception:
            continue
        out.extend({"job": i, "from": m.group(1)[:160], "s": float(m.group(2))}
                   for e in events if (m := RECOVERED.match(e)))
    return out


# -- the oracle ---------------------------------------------------------------------------------------------

def oracle(source: Any) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """From the source's splits read directly: the (key, seq, value) multiset, the (key, split, position
    among the key's records of the split) multiset and the records per key (plain Python)."""
    rows: collections.Counter = collections.Counter()
    places: collections.Counter = collections.Counter()
    for split in source.splits():
        reader, seen = source.open_split(split), collections.Counter[Any]()
        while (batch := reader.read()) is not None:
            for key, seq, value in zip(*(batch.column(c).to_pylist() for c in ("key", "seq", "value"))):
                rows[(key, seq, value)] += 1
                places[(key, split.payload, seen[key])] += 1
                seen[key] += 1
    return rows, places, collections.Counter(key for key, _, _ in rows.elements())


def read(paths: list[str], columns: list[str]) -> list[tuple]:
    tables = [pq.read_table(p, columns=columns) for p in paths]
    if not tables:
        return []
    table = pa.concat_tables(tables)
    return list(zip(*(table.column(c).to_pylist() for c in columns)))


def committed_files(run: Run) -> tuple[dict[str, list[str]], list[str]]:
    """Per sink the files the chain's jobs committed (``job.result``), and the ``part-`` files on disk that
    no job lists (or listed files not on disk)."""
    files: dict[str, list[str]] = {s: [] for s in SINKS}
    dirs = set()
    for job, out, _ in run.jobs:
        for sink in SINKS:
            files[sink].extend(job.result(sink))
            dirs.add(out[sink])
    listed = {os.path.abspath(f) for paths in files.values() for f in paths}
    on_disk = {os.path.abspath(os.path.join(d, n)) for d in dirs if os.path.isdir(d)
               for n in os.listdir(d) if n.startswith("part-")}
    return files, sorted(os.path.relpath(f, run.tmp) for f in listed ^ on_disk)


def difference(got: collections.Counter, expected: collections.Counter) -> tuple[int, int, int]:
    """(records missing, records extra that the input has, records extra that it has not)."""
    extra = got - expected
    return (sum((expected - got).values()), sum(n for r, n in extra.items() if r in expected),
            sum(n for r, n in extra.items() if r not in expected))


def verify(run: Run, error: str | None) -> dict[str, Any]:
    """The chain's committed output against the oracle: lost, duplicated, reordered, counts exact."""
    if error is None:
        try:
            files, stray = committed_files(run)
        except Exception as exc:
            error = f"reading the results: {type(exc).__name__}: {exc}"[:500]
    if error is not None:
        return {"error": error, "lost": None, "duplicated": None, "reordered": None, "counts_exact": False,
                "exact": False}
    rows, places, counts = oracle(run.source)
    raw_lost, raw_dup, raw_invented = difference(collections.Counter(read(files["raw"], ["key", "seq", "value"])),
                                                 rows)
    checks = read(files["checks"], ["key", "split", "pos", "count", "flag", "missing"])
    flags = collections.Counter(r[4] for r in checks)
    gaps = sum(r[5] for r in checks if r[4] == "gap")
    check_lost, check_dup, _ = difference(collections.Counter((k, s, p) for k, s, p, _, f, _ in checks
                                                              if f != "unknown"), places)
    final: dict[Any, int] = {}
    for key, _, _, count, _, _ in checks:
        final[key] = max(final.get(key, 0), count)
    counted = read(files["counts"], ["key", "count"])
    counts_exact = (len(counted) == len(dict(counted)) and dict(counted) == dict(counts)
                    and final == dict(counts))
    lost = max(raw_lost, check_lost, gaps - flags["reorder"])
    duplicated = max(raw_dup + raw_invented, check_dup, flags["duplicate"] + flags["unknown"])
    return {"records": sum(counts.values()), "lost": lost, "duplicated": duplicated, "reordered": flags["reorder"],
            "counts_exact": counts_exact, "stray_files": stray,
            "evidence": {"raw_lost": raw_lost, "raw_duplicated": raw_dup, "raw_invented": raw_invented,
                         "checker_rows_lost": check_lost, "checker_rows_duplicated": check_dup,
                         "checker_flags": dict(flags), "checker_gap_records": gaps},
            "exact": lost == duplicated == flags["reorder"] == 0 and counts_exact and not stray}


# -- the campaign -------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    return None if not values else round(float(np.percentile(values, q)), 2)


def by_kind(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per fault kind: runs, faults (injected, skipped, failed), recoveries and their times, back_s, and
    the lost / duplicated / reordered totals of the runs that had it."""
    rows: dict[str, dict[str, Any]] = {}
    for n, r in enumerate(results):
        for f in r["faults"]:
            row = rows.setdefault(f["kind"], {"runs": set(), "faults": 0, "skipped": 0, "failed": 0,
                                              "recovery_s": [], "back_s": [], "lost": 0, "duplicated": 0,
                                              "reordered": 0})
            if "skipped" in f:
                row["skipped"] += 1
                continue
            row["faults"] += 1
            row["failed"] += "failed" in f
            row["recovery_s"] += f.get("recovered", [])
            if f.get("back_s") is not None:
                row["back_s"].append(f["back_s"])
            if n not in row["runs"]:
                row["runs"].add(n)
                for what in ("lost", "duplicated", "reordered"):
                    row[what] += r[what] or 0
    return rows


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    head = ("kind", "runs", "faults", "skip", "fail", "recov", "rec_p50", "rec_p90", "rec_max", "back_p50",
            "back_max", "lost", "dup", "reord")
    print(("{:<24}" + "{:>9}" * (len(head) - 1)).format(*head))
    for kind in sorted(rows, key=KINDS.index):
        row = rows[kind]
        rec, back = row["recovery_s"], row["back_s"]
        cells = (kind, len(row["runs"]), row["faults"], row["skipped"], row["failed"], len(rec),
                 percentile(rec, 50), percentile(rec, 90), max(rec, default=None), percentile(back, 50),
                 max(back, default=None), row["lost"], row["duplicated"], row["reordered"])
        print(("{:<24}" + "{:>9}" * (len(head) - 1)).format(*("-" if c is None else str(c) for c in cells)))


def summarise(results: list[dict[str, Any]], args: argparse.Namespace, kinds: list[str]) -> dict[str, Any]:
    rows = by_kind(results)
    recovery = [x["s"] for r in results for x in r["recoveries"]]
    return {
        "benchmark": "chaos", "quick": args.quick, "runs": len(results), "seeds": [r["seed"] for r in results],
        "kinds": kinds, "faults": {k: rows[k]["faults"] for k in rows},
        "faults_skipped": {k: rows[k]["skipped"] for k in rows if rows[k]["skipped"]},
        "faults_failed": {k: rows[k]["failed"] for k in rows if rows[k]["failed"]},
        "recoveries": len(recovery),
        "lost": sum(r["lost"] or 0 for r in results), "duplicated": sum(r["duplicated"] or 0 for r in results),
        "reordered": sum(r["reordered"] or 0 for r in results),
        "counts_exact": all(r["counts_exact"] for r in results), "exact": all(r["exact"] for r in results),
        "recovery_s_p50": percentile(recovery, 50), "recovery_s_p90": percentile(recovery, 90),
        "recovery_s_max": max(recovery, default=None),
        "back_s_p50_by_kind": {k: percentile(rows[k]["back_s"], 50) for k in rows},
        "back_s_max_by_kind": {k: max(rows[k]["back_s"], default=None) for k in rows},
        "failed_runs": [r["seed"] for r in results if "error" in r],
        "kept_dirs": [r["dir"] for r in results if "dir" in r],
        "records_per_run": args.records, "rate": args.rate, "faults_per_run": args.faults,
    }


def parse_seeds(text: str) -> list[int]:
    """``"1-20"``, ``"3"`` or ``"1,4,7-9"``."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[int], list[str]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"seeds 1-2, kinds {','.join(QUICK_KINDS)}, 2 faults a run (under a minute)")
    parser.add_argument("--seeds", default=None, help="seeds, e.g. 1-20, 3 or 1,4,7-9 (default 1-20; quick 1-2)")
    parser.add_argument("--kinds", default=None, help=f"comma-separated fault kinds (default all: {','.join(KINDS)})")
    parser.add_argument("--faults", type=int, default=None, help="faults a run (default 3; quick 2)")
    parser.add_argument("--records", type=int, default=None,
                        help="records a run (default: rate x (3 + 2 x faults) s of input)")
    parser.add_argument("--rate", type=float, default=4_000, help="offered records/s (default 4,000)")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--keys", type=int, default=50, help="distinct keys (default 50)")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N", help="host processes of each job")
    parser.add_argument("--keep", action="store_true", help="keep every run's directory (else only failed runs')")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",") if args.kinds else list(QUICK_KINDS if args.quick else KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; the kinds: {', '.join(KINDS)}")
    args.faults = args.faults if args.faults is not None else 2 if args.quick else 3
    args.records = args.records or int(args.rate * (3 + 2 * args.faults))
    return args, parse_seeds(args.seeds or ("1-2" if args.quick else "1-20")), kinds


def main(argv: list[str] | None = None) -> None:
    args, seeds, kinds = parse_args(argv)
    started, started_ray = time.perf_counter(), start_ray()
    results = []
    try:
        for seed in seeds:
            results.append(run_seed(seed, kinds, args))
            print(json.dumps(results[-1]), flush=True)
    finally:
        stop_ray(started_ray)
    print_table(by_kind(results))
    figures = summarise(results, args, kinds)
    emit({**figures, "wall_s": round(time.perf_counter() - started, 1)})
    if not figures["exact"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
