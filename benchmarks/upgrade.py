"""upgrade.py: what changing a running keyed operator's code costs, live (``job.upgrade``) and by a restart.

Pipeline: ``generate`` (2 splits, 2 instances, int keys, open loop at ``--load``
(60 %) of the capacity measured first, unpaced) -> ``key_by("key")`` ->
``process(count_v1)`` (2 instances, named ``p``; its state is a running count
per key) -> ``collect()``. Each output row carries the record (key, value,
seq), its key's running count ``n``, ``y`` (``2 * value`` in ``count_v1``,
``3 * value`` in ``count_v2``), the code's ``version`` and ``t``, the time the
operator's code ran.

Live: after ``--lead`` seconds the driver calls ``job.upgrade("p", count_v2)``;
the job runs on to the end of its input. ``upgrade_pause_ms``: the
operator's pause at the change, per instance of ``p`` from its last output by
the old code to its first by the new (the longest of the instances); beside
it ``baseline_gap_ms``, the longest gap between two outputs of one instance
over a second before the call, and ``inputs_held_ms``, how long the upgrade's
blocking op held the instances' inputs (its record's ``pause_ms``).
``total_s``: the upgrade call, start to return (its checks on a sample, then
the op). Restart: the same job, after the same lead, stopped with a savepoint
and restored with ``count_v2``; ``restart_pause_ms`` likewise from the
stopped job's last output to the restored job's first (per instance, the
longest). ``pause_ratio`` = upgrade / restart pause.

``exact`` (and ``restart_exact``): the output equals a plain computation over
the source's splits read straight: every record once, its key's ``n`` counting
1, 2, ... (the state is kept across the change), ``y`` by the old code for
the records before the cut and by the new one after. The cut of an upgrade is
what its op reports (per instance of ``p`` and upstream instance, the records
it took before the cut); a restart's is the savepoint's source offsets.

Target: ``upgrade_pause_ms`` <= 100 and ``pause_ratio`` <= 0.05. Expected on
a 2-core machine: a restart pauses the operator for seconds (a stop, a
savepoint, new processes, a restore), an upgrade for about one input batch's
interval plus the op's alignment (tens of ms).

Run: ``python -m benchmarks.upgrade [--quick] [--lead S] [--after S] [--load F] [--keys N] [--batch-size N]
[--num-hosts N]``. ``--quick`` (under a minute): 2 s before and after the change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import emit, start_ray, stop_ray
from benchmarks.measure import loadavg
from chiray.operators.logic import InstanceInfo, Sink, SinkWriter

PARALLELISM = 2
SPLITS = 2
SEED = 11


class Discard(Sink):
    """A sink that keeps nothing (the capacity run)."""

    class Writer(SinkWriter):
        def write(self, batch: pa.RecordBatch) -> None:
            pass

    def create_writer(self, info: InstanceInfo) -> SinkWriter:
        return Discard.Writer()


def _counted(key: Any, rows: pa.RecordBatch, state: Any, version: int) -> pa.RecordBatch:
    n0 = state.value or 0
    k = rows.num_rows
    state.value = n0 + k
    return pa.record_batch({"key": rows["key"], "value": rows["value"], "seq": rows["seq"],
                            "n": pa.array(np.arange(n0 + 1, n0 + k + 1, dtype=np.int64)),
                            "y": pc.multiply(rows["value"], version + 1),
                            "version": pa.array(np.full(k, version, dtype=np.int64)),
                            "t": pa.array(np.full(k, time.time_ns(), dtype=np.int64))})


def count_v1(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
    """The submitted code: the key's running count, ``y = 2 * value``."""
    return _counted(key, rows, state, 1)


def count_v2(key: Any, rows: pa.RecordBatch, state: Any) -> pa.RecordBatch:
    """The new code: the same state, ``y = 3 * value``."""
    return _counted(key, rows, state, 2)


def source(records: int | None, rate: float | None, args: argparse.Namespace) -> Any:
    from chiray.operators import generate

    return generate(records, rate=rate, batch_size=args.batch_size, num_keys=args.keys, seed=SEED,
                    num_splits=SPLITS, key_type="int")


def build(name: str, fn: Any, records: int | None, rate: float | None, args: argparse.Namespace,
          sink: Any = None) -> Any:
    """generate (p=2) -> key_by("key") -> process(fn) as ``p`` (p=2) -> ``sink`` (collect) as ``out``."""
    import chiray

    flow = chiray.Dataflow(name)
    (flow.source(source(records, rate, args), parallelism=PARALLELISM, name="source")
         .key_by("key").process(fn, parallelism=PARALLELISM, name="p")
         .sink(sink if sink is not None else chiray.collect(), name="out"))
    return flow


def _wait_records(job: Any, n: int, timeout_s: float = 120.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while job.statistics().records_in("p") < n:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"upgrade: {n:,} records did not reach the operator within {timeout_s} s")
        time.sleep(0.02)


def capacity(args: argparse.Namespace, root: str) -> float:
    """Records/s the operator takes unpaced (a sink that keeps nothing), over the last ``--measure`` seconds."""
    job = build("upgrade-capacity", count_v1, None, None, args, Discard()).submit(
        checkpoint_dir=os.path.join(root, "capacity"), num_hosts=args.num_hosts)
    try:
        _wait_records(job, 1)
        time.sleep(args.warm_up)
        n0, t0 = job.statistics().records_in("p"), time.perf_counter()
        time.sleep(args.measure)
        return (job.statistics().records_in("p") - n0) / (time.perf_counter() - t0)
    finally:
        job.cancel()


def read_splits(args: argparse.Namespace, records: int) -> list[pd.DataFrame]:
    """Each split's records in order (split ``i`` is read by source instance ``i``), with the instance of
    ``p`` its key is routed to under the bin table the run used (``owner``, set by the caller)."""
    src = source(records, None, args)
    out = []
    for split in src.splits():
        reader = src.open_split(split)
        batches = []
        while (batch := reader.read()) is not None:
            batches.append(batch.select(["key", "value", "seq"]))
        out.append(pa.Table.from_batches(batches).to_pandas())
    return out


def oracle(splits: list[pd.DataFrame], table: list[int], old_before: dict[tuple[int, int], int]) -> pd.DataFrame:
    """The expected rows, ``y`` by the old code for the first ``old_before[(split, instance)]`` records split
    ``split`` sent instance ``instance`` of ``p``, by the new code after."""
    from chiray.operators.hashing import bins_of

    parts = []
    for s, frame in enumerate(splits):
        owner = np.asarray(table)[bins_of(pa.array(frame["key"].to_numpy()), len(table))]
        position = frame.groupby(owner).cumcount().to_numpy()  # index among the records sent to that instance
        limit = np.array([old_before.get((s, int(o)), 0) for o in owner])
        old = position < limit
        parts.append(frame.assign(y=np.where(old, frame["value"] * 2, frame["value"] * 3)))
    return pd.concat(parts, ignore_index=True)


def exact(output: pd.DataFrame, expected: pd.DataFrame) -> bool:
    """Every record once with the expected ``y``, and each key's ``n`` counting 1, 2, ... (its state kept)."""
    cols = ["key", "seq", "value", "y"]
    got = output[cols].sort_values(cols, ignore_index=True)
    want = expected[cols].sort_values(cols, ignore_index=True)
    if len(got) != len(want) or not (got.to_numpy() == want.to_numpy()).all():
        return False
    ns = output.sort_values(["key", "n"])
    return bool((ns["n"].to_numpy() == ns.groupby("key").cumcount().to_numpy() + 1).all())


def _owners(output: pd.DataFrame, table: list[int]) -> np.ndarray:
    """The instance of ``p`` each output row's key is routed to."""
    from chiray.operators.hashing import bins_of

    return np.asarray(table)[bins_of(pa.array(output["key"].to_numpy()), len(table))]


def longest_gap_ms(output: pd.DataFrame, table: list[int], start_ns: int, end_ns: int) -> float:
    """The longest gap between two consecutive outputs of one instance of ``p`` that overlaps
    ``[start_ns, end_ns]`` (each instance's outputs by the time its code ran)."""
    owner = _owners(output, table)
    longest = 0
    for instance in np.unique(owner):
        t = np.unique(output["t"].to_numpy()[owner == instance])
        a, b = t[:-1], t[1:]
        overlap = (b >= start_ns) & (a <= end_ns)
        if overlap.any():
            longest = max(longest, int((b - a)[overlap].max()))
    return longest / 1e6


def pause_ms(output: pd.DataFrame, table: list[int], new: np.ndarray) -> float:
    """The operator's pause at the change: per instance of ``p``, from its last output by the old code to its
    first by the new; the longest."""
    owner = _owners(output, table)
    t = output["t"].to_numpy()
    gaps = [int(t[new & (owner == i)].min()) - int(t[~new & (owner == i)].max()) for i in np.unique(owner)
            if (new & (owner == i)).any() and (~new & (owner == i)).any()]
    return max(gaps, default=0) / 1e6


def live(args: argparse.Namespace, rate: float, records: int, root: str) -> dict[str, Any]:
    """The job upgraded live: its output, the cut, the upgrade's record and when it was called."""
    job = build("upgrade-live", count_v1, records, rate, args).submit(
        checkpoint_dir=os.path.join(root, "live"), num_hosts=args.num_hosts)
    try:
        _wait_records(job, int(rate * args.lead))
        start = time.time_ns()
        record = job.upgrade("p", count_v2)
        job.wait(timeout=600)
        output = job.result("out").to_pandas()
        table = list(job.plan.bin_tables["p"])
    finally:
        job.cancel()
    cut = {(int(up.rsplit("/", 1)[1]), int(inst.rsplit("/", 1)[1])): n
           for inst, entry in record.cut.items() for up, n in entry["inputs"].items()}
    return {"output": output, "table": table, "cut": cut, "start": start, "record": record}


def restart(args: argparse.Namespace, rate: float, records: int, root: str) -> dict[str, Any]:
    """The same change by stop-with-savepoint and restore: both jobs' output (``new``: the restored job's rows)
    and the savepoint's cut."""
    from chiray.actors.runtime.restore import RestoreInfo
    from chiray.actors.runtime.storage import MANIFEST

    job = build("upgrade-restart", count_v1, records, rate, args).submit(
        checkpoint_dir=os.path.join(root, "restart"), num_hosts=args.num_hosts)
    try:
        _wait_records(job, int(rate * args.lead))
        taken = job.stop(savepoint=os.path.join(root, "savepoint"))
        before = job.result("out").to_pandas()
        table = list(job.plan.bin_tables["p"])
    finally:
        job.cancel()
    restored = build("upgrade-restart", count_v2, records, rate, args).submit(
        checkpoint_dir=os.path.join(root, "restored"), restore_from=taken.path, num_hosts=args.num_hosts)
    try:
        restored.wait(timeout=600)
        after = restored.result("out").to_pandas()
    finally:
        restored.cancel()
    with open(os.path.join(taken.path, MANIFEST)) as f:
        offsets = RestoreInfo(None, json.load(f)).source_offsets("source")  # type: ignore[arg-type]
    split_ids = [s.split_id for s in source(records, None, args).splits()]
    per_split = {s: int(offsets.get(sid) or 0) * args.batch_size for s, sid in enumerate(split_ids)}
    output = pd.concat([before, after], ignore_index=True)
    new = np.arange(len(output)) >= len(before)
    return {"output": output, "table": table, "per_split": per_split, "new": new}


def restart_cut(splits: list[pd.DataFrame], table: list[int], per_split: dict[int, int]) -> dict[tuple[int, int], int]:
    """A savepoint's cut as records per (split, instance of ``p``): those of the first ``per_split[s]`` records
    of each split."""
    from chiray.operators.hashing import bins_of

    cut = {}
    for s, frame in enumerate(splits):
        head = frame["key"].to_numpy()[:per_split[s]]
        owner = np.asarray(table)[bins_of(pa.array(head), len(table))] if len(head) else np.zeros(0, np.int64)
        for instance in range(PARALLELISM):
            cut[(s, instance)] = int((owner == instance).sum())
    return cut


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s before and after the change (under a minute)")
    parser.add_argument("--lead", type=float, default=None, help="seconds before the change (default 8, quick 2)")
    parser.add_argument("--after", type=float, default=None, help="seconds after it (default 8, quick 2)")
    parser.add_argument("--load", type=float, default=0.6, help="offered rate as a fraction of capacity")
    parser.add_argument("--keys", type=int, default=20, help="distinct keys")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--warm-up", type=float, default=None, metavar="S",
                        help="seconds of the unpaced run before its capacity is measured (default 3, quick 1)")
    parser.add_argument("--measure", type=float, default=None, metavar="S",
                        help="seconds over which capacity is measured (default 4, quick 2)")
    parser.add_argument("--num-hosts", type=int, default=None, metavar="N",
                        help="host processes of each job (default: the runtime's; see JobConfig.num_hosts)")
    args = parser.parse_args(argv)
    args.lead = args.lead if args.lead is not None else 2.0 if args.quick else 8.0
    args.after = args.after if args.after is not None else 2.0 if args.quick else 8.0
    args.warm_up = args.warm_up if args.warm_up is not None else 1.0 if args.quick else 3.0
    args.measure = args.measure if args.measure is not None else 2.0 if args.quick else 4.0
    started, load_at_start = time.perf_counter(), loadavg()
    print(f"upgrade: keyed process, {args.keys:,} keys, batches of {args.batch_size:,}; load average "
          f"{load_at_start}", flush=True)
    tmp = tempfile.mkdtemp(prefix="chiray-bench-upgrade-")
    started_ray = start_ray()
    try:
        cap = capacity(args, tmp)
        rate = args.load * cap
        per_round = SPLITS * args.batch_size  # whole batches of each split
        records = max(int(rate * (args.lead + args.after)) // per_round, 4) * per_round
        print(f"  capacity {cap:,.0f} records/s; offering {rate:,.0f} records/s ({args.load:.0%}), "
              f"{records:,} records", flush=True)
        up = live(args, rate, records, tmp)
        print(f"  live upgrade: {up['record'].duration_s:.3f} s, inputs held {up['record'].pause_ms:.1f} ms",
              flush=True)
        re = restart(args, rate, records, tmp)
    finally:
        stop_ray(started_ray)
        shutil.rmtree(tmp, ignore_errors=True)
    splits = read_splits(args, records)
    start = up["start"]
    out = up["output"]
    upgrade_pause = pause_ms(out, up["table"], (out["version"] == 2).to_numpy())
    baseline = longest_gap_ms(out, up["table"], start - 1_500_000_000, start - 500_000_000)
    restart_pause = pause_ms(re["output"], re["table"], re["new"])
    ratio = upgrade_pause / restart_pause if restart_pause else None
    emit({
        "benchmark": "upgrade", "quick": args.quick, "keys": args.keys, "batch_size": args.batch_size,
        "parallelism": PARALLELISM, "num_hosts": args.num_hosts, "records": records,
        "capacity_records_per_s": round(cap), "offered_records_per_s": round(rate), "load": args.load,
        "upgrade_pause_ms": round(upgrade_pause, 1), "baseline_gap_ms": round(baseline, 1),
        "inputs_held_ms": round(up["record"].pause_ms or 0.0, 1), "total_s": round(up["record"].duration_s, 3),
        "exact": exact(up["output"], oracle(splits, up["table"], up["cut"])),
        "restart_pause_ms": round(restart_pause, 1), "pause_ratio": None if ratio is None else round(ratio, 4),
        "restart_exact": exact(re["output"], oracle(splits, re["table"],
                                                    restart_cut(splits, re["table"], re["per_split"]))),
        "target_met": upgrade_pause <= 100 and ratio is not None and ratio <= 0.05,
        "loadavg_1m_at_start": load_at_start, "loadavg_1m_at_end": loadavg(),
        "wall_s": round(time.perf_counter() - started, 1),
    })


if __name__ == "__main__":
    main()
