"""cli_jobs.py: the ``chiray`` verbs that operate detached jobs on a Ray cluster.

Each verb is a small function ``do_<verb>(args) -> int``, one for each
``JobHandle`` verb the CLI offers (the table of verbs is derived from the
protocol, ``chiray.actors.jobs.handle.VERBS``), that calls the job's manager
through ``chiray.attach`` / ``chiray.jobs`` and prints either a human table
or, with ``--json``, one JSON document (the values' ``to_json()``). Failures print one line
(``chiray: error: ...``) on stderr and exit 1; usage errors exit 2.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import sys
import time
from typing import Any, Callable

from chiray.operators.errors import ChirayError
from chiray.progress import Progress

__all__ = ["add_job_verbs", "run_verb"]


class CliError(ChirayError):
    """A failure to report as one line."""


def _connect(address: str | None) -> None:
    """Connect to the cluster, failing fast with one line when nothing listens at ``address``."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or "auto"
    if address != "auto" and "://" not in address:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=3).close()
        except (OSError, ValueError):
            raise CliError(f"no Ray cluster reachable at {address!r} (start one with `ray start --head`, "
                           f"or pass --address / set RAY_ADDRESS)") from None
    from chiray.actors.jobs.client import connect

    try:
        connect(address)
    except (ConnectionError, RuntimeError) as exc:
        raise CliError(f"no Ray cluster reachable at {address!r}: {str(exc).splitlines()[0]}") from None
    if not ray.is_initialized():
        raise CliError(f"no Ray cluster reachable at {address!r}")


def _attach(args: argparse.Namespace) -> Any:
    from chiray.actors.jobs.client import attach

    _connect(args.address)
    return attach(args.job)


def _emit(args: argparse.Namespace, data: Any, human: Callable[[], str]) -> int:
    from chiray.actors.jobs.jobvalues import plain_json

    print(json.dumps(plain_json(data), sort_keys=True) if args.json else human())
    return 0


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


# -- verbs ---------------------------------------------------------------------------------


def do_list(args: argparse.Namespace) -> int:
    from chiray.actors.jobs.client import jobs

    _connect(args.address)
    found = jobs(all=args.all)

    def human() -> str:
        rows = [f"{'NAME':<20} {'STATE':<11} {'UPTIME':>8}  {'RECORDS/S':>10}  OPERATORS (PARALLELISM)"]
        for j in found:
            rate = j.records_per_second
            ops = ", ".join(f"{k}={v}" for k, v in j.operators)
            rows.append(f"{j.name:<20} {j.as_dict()['state']:<11} {_ago(j.uptime_s):>8}  "
                        f"{'-' if rate is None else f'{rate:,.0f}':>10}  {ops}")
        return "\n".join(rows) if found else "no jobs" if args.all else "no running jobs (--all lists ended ones)"
    return _emit(args, found, human)


def do_status(args: argparse.Namespace) -> int:
    job = _attach(args)
    status, info = job.status(), job.info()
    events = [str(e) for e in status.history]  # rendered here, from the typed events
    data = {**info.to_json(), "events": events, "finished_instances": list(status.finished_instances)}

    def human() -> str:
        last = info.last_checkpoint
        lines = [f"job {info.name}: {info.as_dict()['state']}, up {_ago(info.uptime_s)}, "
                 f"manager restarts {info.restarts}",
                 "operators: " + ", ".join(f"{k} x{v}" for k, v in info.operators),
                 f"last checkpoint: {last.id} at {last.path}" if last else "last checkpoint: none"]
        if info.error:
            lines.append(f"error: {info.error}")
        sides = ["sources:", *(f"  {s.describe()}" for s in info.sources)] if info.sources else []
        return "\n".join([*lines, *sides, "events:", *(f"  {e}" for e in events)])
    return _emit(args, data, human)


MONITOR_WAIT_S = 2.0
"""How long ``metrics`` waits for the in-band monitor (state sizes, keys): it waits its turn behind the records
in the channels, so a busy job answers late; the rows come without those columns then."""


def _metrics_rows(job: Any) -> list[dict[str, Any]]:
    """Per instance: counters and their rates over a second (snapshots the hosts answer at once, even during a
    long step of user code), and what the in-band monitor says within ``MONITOR_WAIT_S``."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        monitor = pool.submit(job.metrics, MONITOR_WAIT_S)
        first = job.statistics()
        time.sleep(1.0)  # two snapshots a second apart give the rates
        second = job.statistics()
        try:
            monitored = monitor.result().instances
        except Exception:  # it did not come in time, or the job ended meanwhile
            monitored = {}
    before = {(s.operator, s.index): s for s in first.instances}
    span = max(second.taken_at - first.taken_at, 1e-6)
    marks = [s.watermark for s in second.instances if s.watermark is not None]
    order = {op: i for i, op in enumerate(dict.fromkeys(s.operator for s in second.instances))}
    rows = []
    for s in sorted(second.instances, key=lambda s: (order[s.operator], s.index)):
        b = before.get((s.operator, s.index), s)
        mon = monitored.get((s.operator, s.index), {})
        rows.append({"operator": s.operator, "instance": s.index, "records_in": s.records_in,
                     "records_out": s.records_out, "in_per_s": (s.records_in - b.records_in) / span,
                     "out_per_s": (s.records_out - b.records_out) / span, "queued_batches": s.queued_batches,
                     "backpressured_pct": 100 * max(s.backpressured_s - b.backpressured_s, 0) / span,
                     "busy_pct": 100 * max(s.busy_s - b.busy_s, 0) / span,
                     "state_bytes": mon.get("state_bytes"), "keys": mon.get("keys"),
                     "watermark_lag": None if s.watermark is None else max(marks) - s.watermark})
    return rows


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GiB"


def _metrics_table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'OPERATOR':<14} {'#':>2} {'IN':>12} {'OUT':>12} {'IN/S':>10} {'OUT/S':>10} {'QUEUED':>6} "
           f"{'BP%':>5} {'BUSY%':>5} {'STATE':>10} {'WM LAG':>8}"]
    for r in rows:
        state = "-" if not r["state_bytes"] else _size(r["state_bytes"])
        lag = "-" if r["watermark_lag"] is None else str(r["watermark_lag"])
        out.append(f"{r['operator']:<14} {r['instance']:>2} {r['records_in']:>12,} {r['records_out']:>12,} "
                   f"{r['in_per_s']:>10,.0f} {r['out_per_s']:>10,.0f} {r['queued_batches']:>6} "
                   f"{r['backpressured_pct']:>5.1f} {r['busy_pct']:>5.1f} {state:>10} {lag:>8}")
    return "\n".join(out)


def _side_rows(job: Any) -> list[dict[str, Any]]:
    """One row per source side (a Spark driver the job owns): ``{"operator", "instance": None, "source_side"}``."""
    from chiray.actors.jobs.jobvalues import plain_json

    try:
        sides = job.info().sources
    except Exception:  # the job ended meanwhile
        return []
    return [{"operator": s.source, "instance": None, "source_side": plain_json(s)} for s in sides]


def _side_lines(rows: list[dict[str, Any]]) -> str:
    out = []
    for r in rows:
        s = r["source_side"]
        rate = "-" if s["input_rows_per_s"] is None else f"{s['input_rows_per_s']:,.0f}"
        out.append(f"{r['operator']:<14} {s['kind']}: {s['state']}  last batch {s['last_batch']}  "
                   f"input rows/s {rate}  rows waiting {s['rows_waiting']}  {s['detail']}")
    return "\n".join(out)


def do_metrics(args: argparse.Namespace) -> int:
    job = _attach(args)
    while True:
        rows = _metrics_rows(job)
        sides = _side_rows(job)
        _emit(args, rows + sides, lambda: "\n".join(filter(None, [_metrics_table(rows), _side_lines(sides)])))
        if not args.watch or job.info().state.terminal:
            return 0
        sys.stdout.flush()


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--option expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def _bar(p: Any, width: int = 30) -> tuple[str, str]:
    """A progress bar for a ``RescaleProgress``, and its state (a terminal redraws the bar; a log gets a line
    per state)."""
    filled = int(width * p.bins_moved / p.bins) if p.bins else (width if p.done else 0)
    state = str(getattr(p.state, "value", p.state))
    return (f"  [{'#' * filled}{'.' * (width - filled)}] steps {p.steps_done}/{p.steps}"
            f"  bins {p.bins_moved}/{p.bins}  {p.bytes_moved / 2**20:.1f} MiB  {state}"), state


def do_rescale(args: argparse.Namespace) -> int:
    job = _attach(args)
    handle = job.rescale(args.operator, args.parallelism, strategy=args.strategy, **_options(args.option))
    if not args.wait:
        return _emit(args, {"id": handle.id, "operator": args.operator, "parallelism": args.parallelism},
                     lambda: f"rescale {handle.id} of {args.operator!r} to {args.parallelism} started")
    shown = Progress()
    while not (progress := handle.progress()).done:
        if not args.json:
            shown.update(*_bar(progress))
        time.sleep(0.2)
    final = handle.result(0)
    if not args.json:
        shown.end(*_bar(final))
    return _emit(args, final, lambda: f"rescaled {args.operator!r} {final.from_} -> {final.to} "
                                      f"in {final.duration_s or 0:.2f} s, {final.bins_moved} bins, "
                                      f"{final.bytes_moved / 2**20:.2f} MiB moved")


def do_rescales(args: argparse.Namespace) -> int:
    history = list(_attach(args).rescales())

    def human() -> str:
        rows = [f"{'WHEN':<9} {'OPERATOR':<14} {'FROM':>4} -> {'TO':<4} {'STRATEGY':<15} {'SECONDS':>8} "
                f"{'BYTES':>12}  OUTCOME"]
        for r in history:
            when = time.strftime("%H:%M:%S", time.localtime(r.started_at))
            secs = r.duration_s
            rows.append(f"{when:<9} {r.operator:<14} {r.from_!s:>4} -> {r.to!s:<4} {r.strategy:<15} "
                        f"{'-' if secs is None else f'{secs:.2f}':>8} {r.bytes_moved or 0:>12,}  "
                        f"{r.state.value}{': ' + r.error if r.error else ''}")
        return "\n".join(rows) if history else "no rescales"
    return _emit(args, history, human)


def _function(ref: str | None, files: list[str]) -> Any:
    """``module:name``: from a ``--file`` shipped with the call (pickled by value) if one defines the module,
    else imported where the job runs (its runtime environment)."""
    if ref is None:
        return None
    import importlib.util

    import cloudpickle

    from chiray.operators.upgrade import FunctionRef

    module, _, name = ref.partition(":")
    for path in files:
        if os.path.splitext(os.path.basename(path))[0] != module:
            continue
        spec = importlib.util.spec_from_file_location(f"chiray_upgrade_{module}", path)
        if spec is None or spec.loader is None:
            raise CliError(f"cannot load {path!r} as Python")
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        cloudpickle.register_pickle_by_value(loaded)  # the code travels with the call
        if not hasattr(loaded, name):
            raise CliError(f"{path!r} defines no {name!r}")
        return getattr(loaded, name)
    return FunctionRef(ref)


def do_upgrade(args: argparse.Namespace) -> int:
    job = _attach(args)
    files = list(args.file)
    record = job.upgrade(args.operator, _function(args.function, files), on_timer=_function(args.on_timer, files),
                         migrate_state=_function(args.migrate_state, files), canary=args.canary,
                         rate_bound=args.rate_bound, timeout=args.timeout)
    return _emit(args, record, lambda: (f"upgraded {args.operator!r} {record.old_code} -> {record.new_code} in "
                                        f"{record.duration_s or 0:.2f} s, pause {record.pause_ms or 0:.1f} ms"
                                        + (f", canary {record.canary_result}" if record.canary else "")))


def do_upgrades(args: argparse.Namespace) -> int:
    history = list(_attach(args).upgrades())

    def human() -> str:
        rows = [f"{'WHEN':<9} {'OPERATOR':<14} {'OLD CODE':<28} {'NEW CODE':<28} {'CANARY':<10} {'SECONDS':>8} "
                f"{'PAUSE MS':>9}  OUTCOME"]
        for r in history:
            when = time.strftime("%H:%M:%S", time.localtime(r.started_at))
            canary = "-" if not r.canary else ("passed" if (r.canary_result or "").startswith("passed")
                                               else "failed")
            secs = "-" if r.duration_s is None else f"{r.duration_s:.2f}"
            pause = "-" if r.pause_ms is None else f"{r.pause_ms:.1f}"
            rows.append(f"{when:<9} {r.operator:<14} {r.old_code:<28} {r.new_code:<28} {canary:<10} {secs:>8} "
                        f"{pause:>9}  {r.outcome.value}{': ' + r.error if r.error else ''}")
        return "\n".join(rows) if history else "no upgrades"
    return _emit(args, history, human)


AUTOSCALE_OPTIONS = {"min": "min_parallelism", "max": "max_parallelism", "budget_ms": "latency_budget_ms",
                     "utilisation": "target_utilisation", "interval": "interval_s"}


def do_autoscale(args: argparse.Namespace) -> int:
    options = _options(args.option)
    for flag, name in AUTOSCALE_OPTIONS.items():
        if getattr(args, flag) is not None:
            options[name] = getattr(args, flag)
    if args.operators:
        options["operators"] = args.operators.split(",")
    enabled = args.switch == "on"
    if not enabled and options:
        raise CliError("autoscale off takes no options")
    done = _attach(args).autoscale(enabled, **options)
    return _emit(args, done, lambda: f"autoscale {done['autoscale']} for {done['name']}"
                                     + (f" {done['options']}" if done["options"] else ""))


def do_checkpoint(args: argparse.Namespace) -> int:
    taken = _attach(args).checkpoint_info()
    return _emit(args, taken, lambda: f"checkpoint {taken.id} {taken.path}")


def do_savepoint(args: argparse.Namespace) -> int:
    path = _attach(args).savepoint(args.dir)
    return _emit(args, {"path": path}, lambda: path)


def do_savepoints(args: argparse.Namespace) -> int:
    job = _attach(args)
    if args.delete is not None:  # a local path as the user means it, from where they are
        gone = job.delete_savepoint(args.delete if "://" in args.delete else os.path.abspath(args.delete))
        return _emit(args, gone, lambda: f"deleted savepoint {gone.path}")
    found = job.savepoints()

    def human() -> str:
        rows = [f"{'CHECKPOINT':>10}  {'TAKEN':<19}  {'SIZE':>9}  {'RUN':<9}  PATH"]
        for sp in found:
            taken = "-" if sp.created_at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(sp.created_at))
            rows.append(f"{sp.checkpoint_id:>10}  {taken:<19}  {_size(sp.size_bytes):>9}  {sp.run or '-':<9}  "
                        f"{sp.path}")
        return "\n".join(rows) if found else f"job {job.name} has no savepoints"
    return _emit(args, found, human)


def do_stop(args: argparse.Namespace) -> int:
    taken = _attach(args).stop(savepoint=args.savepoint)
    return _emit(args, taken, lambda: f"stopped at checkpoint {taken.id}"
                                      + (f"; savepoint {taken.path}" if args.savepoint else ""))


def do_cancel(args: argparse.Namespace) -> int:
    job = _attach(args)
    job.cancel()  # an ended job stays as it ended: report its state
    state = job.status().state.value
    return _emit(args, {"name": job.name, "state": state},
                 lambda: f"cancelled {job.name}" if state == "CANCELLED" else f"{job.name} had ended ({state})")


def do_tail(args: argparse.Namespace) -> int:
    from chiray.operators.callsinks import format_batch

    job = _attach(args)
    table = job.tail(args.sink, args.n)
    title = f"{job.name}: the newest rows of {args.sink or 'its sink'}"
    return _emit(args, table.to_pylist(), lambda: format_batch(table, title, max_rows=args.n))


FOLLOW_S = 1.0
"""How often ``logs --follow`` reads the new lines."""


def do_logs(args: argparse.Namespace) -> int:
    job = _attach(args)
    logs = job.logs(args.lines)
    for source, why in logs.missing:
        print(f"chiray logs: no log of {source}: {why}", file=sys.stderr)
    if not args.follow:
        return _emit(args, logs, lambda: "\n".join(map(str, logs.lines)) or f"no log lines of job {job.name}")
    ended = False
    while True:
        if logs.lines:  # with --json: one document per read that found lines
            _emit(args, logs, lambda: "\n".join(map(str, logs.lines)))
            sys.stdout.flush()
        if ended:
            return 0
        ended = job.info().state.terminal  # one more read after the end: its last lines
        time.sleep(FOLLOW_S)
        logs = job.logs(args.lines, since=logs.cursor)


def do_forget(args: argparse.Namespace) -> int:
    job = _attach(args)
    job.forget()
    return _emit(args, {"name": job.name, "forgotten": True}, lambda: f"forgot {job.name}")


def _verbs() -> dict[str, Callable[[argparse.Namespace], int]]:
    """``list``, then each ``JobHandle`` verb that has a ``do_<verb>`` here, in the protocol's order."""
    from chiray.actors.jobs.handle import VERBS as JOB_VERBS

    here = globals()
    return {"list": do_list, **{verb: here[f"do_{verb}"] for verb in JOB_VERBS if f"do_{verb}" in here}}


VERBS = _verbs()
"""Command -> its function: derived from the ``JobHandle`` protocol, never listed again."""


def add_job_verbs(sub: Any) -> None:
    """Add the job verbs to the ``chiray`` parser's subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", default=None,
                        help="Ray cluster address (default: the RAY_ADDRESS env var, else 'auto')")
    common.add_argument("--json", action="store_true", help="print one JSON document")

    def verb(name: str, text: str, job: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, parents=[common])
        if job:
            p.add_argument("job", help="the job's name")
        return p

    verb("list", "running (with --all, also ended) detached jobs", job=False).add_argument("--all", action="store_true")
    verb("status", "state, events, parallelism, last checkpoint")
    verb("metrics", "per operator and instance: records, rates, queues, busy time, state size").add_argument(
        "--watch", action="store_true", help="repeat until the job ends (Ctrl-C stops)")
    p = verb("rescale", "change an operator's parallelism live")
    p.add_argument("operator")
    p.add_argument("parallelism", type=int)
    p.add_argument("--strategy", default="all_at_once",
                   choices=["all_at_once", "batched", "fluid", "non_disruptive"])
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a strategy knob (chunk_bins=64, priority=hot_first, ...)")
    p.add_argument("--wait", action="store_true", help="wait with a progress bar")
    verb("rescales", "the job's rescale history")
    p = verb("upgrade", "replace an operator's code live (blocking op through its inputs only; state kept)")
    p.add_argument("operator")
    p.add_argument("--function", required=True, metavar="MODULE:NAME",
                   help="the new function: from a --file MODULE.py, else imported where the job runs")
    p.add_argument("--file", action="append", default=[], metavar="PATH.py",
                   help="a Python file shipped with the call (its functions travel pickled by value)")
    p.add_argument("--on-timer", default=None, metavar="MODULE:NAME", help="a keyed process's new on_timer")
    p.add_argument("--migrate-state", default=None, metavar="MODULE:NAME",
                   help="fn(key, old_state) -> new_state, applied to each key's state at the cut")
    p.add_argument("--canary", type=int, default=0, metavar="N",
                   help="run the new code on one instance for N batches first; roll back if it fails")
    p.add_argument("--rate-bound", type=float, default=0.5, help="the canary's output rate bound (default 0.5)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per control op (default 60)")
    verb("upgrades", "the job's upgrade history: operator, old and new code, canary, duration, pause")
    p = verb("autoscale", "switch the DS2 autoscaler on or off (decisions show in status and rescales)")
    p.add_argument("switch", choices=["on", "off"])
    p.add_argument("--operators", default=None, help="comma-separated keyed operators (default: all keyed)")
    p.add_argument("--min", type=int, default=None, help="fewest instances")
    p.add_argument("--max", type=int, default=None, help="most instances")
    p.add_argument("--budget-ms", type=float, default=None, help="record-latency budget for migrations")
    p.add_argument("--utilisation", type=float, default=None, help="target busy fraction per instance")
    p.add_argument("--interval", type=float, default=None, help="seconds between decisions")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another autoscale option (scale_down_stable_s=30, cooldown_s=10, ...)")
    verb("checkpoint", "take a checkpoint; prints its id and path once durable")
    verb("savepoint", "take a savepoint; prints its path").add_argument("dir", nargs="?", default=None)
    verb("savepoints", "the job's savepoints: path, checkpoint, time, size, the run that took each").add_argument(
        "--delete", default=None, metavar="PATH",
        help="delete this savepoint (a chk-N directory of the list; refused while a running job was restored "
             "from it)")
    verb("stop", "stop gracefully (final checkpoint, output committed)").add_argument(
        "--savepoint", default=None, metavar="DIR", help="keep the final checkpoint in DIR")
    verb("cancel", "stop now; output since the last checkpoint is discarded")
    p = verb("tail", "the newest rows that reached a sink of the running job")
    p.add_argument("sink", nargs="?", default=None, help="the sink's name (may be omitted when there is one)")
    p.add_argument("-n", type=int, default=10, help="how many rows, 1 to 1000 (default 10)")
    p = verb("logs", "the log lines of the job's manager, hosts and controller, as Ray keeps them")
    p.add_argument("--lines", type=int, default=100, metavar="N", help="the last N lines of each (default 100)")
    p.add_argument("--follow", action="store_true", help="then print new lines as they come, until the job ends "
                                                         "(Ctrl-C stops)")
    verb("forget", "drop an ended job's record and results")


def run_verb(args: argparse.Namespace) -> int:
    """Run a job verb; one line on stderr and exit code 1 on failure."""
    try:
        return VERBS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every failure is one line for a person or a script
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"chiray {args.command}: error: {text}", file=sys.stderr)
        return 1
