"""Every program in ``examples/`` runs on the session's Ray and prints what an independent oracle computes.

Each example is loaded with ``runpy`` (so its functions and classes travel to
the hosts by value, as from a script) and its ``main()`` is called; the test
compares what ``main()`` returned and printed with the same question answered
over the example's own input by pandas, DuckDB, Spark or a plain loop. Each
job gets one host (``num_hosts=1``) unless the example asks for others.
``test_every_example_is_checked`` fails for an example that no test checks.
"""

from __future__ import annotations

import ast
import collections
import os
import pathlib
import re
import runpy
import shlex
from datetime import timedelta
from typing import Any, Callable

import pandas as pd
import pyarrow as pa
import pytest

import chiray
from chiray.operators import dataflow
from tests.oracles import key_counts

# `make test` runs these beside the other integration tests, at low CPU priority: they check results, not timings.
pytestmark = [pytest.mark.ray, pytest.mark.background]

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CHECKED: set[str] = set()
SPARK = pytest.mark.skipif(os.environ.get("CHIRAY_SPARK_TESTS") == "0",
                           reason="Spark tests skipped (CHIRAY_SPARK_TESTS=0)")


def checks(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a test as the check of ``examples/<name>.py``."""
    CHECKED.add(name)
    return lambda test: test


def test_every_example_is_checked() -> None:
    found = {path.stem for path in EXAMPLES.glob("*.py")}
    assert found - CHECKED == set(), f"examples without a check in this file: {sorted(found - CHECKED)}"
    assert CHECKED - found == set(), f"checks of examples that do not exist: {sorted(CHECKED - found)}"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.stem)
def test_example_is_a_program_with_an_annotated_main(path: pathlib.Path) -> None:
    """A module docstring, a ``main()`` run under ``if __name__ == "__main__"``, every function annotated."""
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.name}: no module docstring"
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert "main" in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, f"{path.name}: no main()"
    for f in functions:
        args = [a for a in f.args.args if a.arg != "self"]
        assert f.returns is not None and all(a.annotation is not None for a in args), \
            f"{path.name}:{f.lineno}: {f.name}() is not fully annotated"
    guard = tree.body[-1]
    assert isinstance(guard, ast.If) and "__main__" in ast.unparse(guard.test) and \
        ast.unparse(guard.body[0]) == "main()", f"{path.name}: does not end with if __name__ == '__main__': main()"


@pytest.fixture
def run(ray_session: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> Callable[[str], tuple[dict[str, Any], Any, str]]:
    """``run(name)``: load ``examples/<name>.py``, call its ``main()``; its namespace, result and output."""
    submit = chiray.submit

    def one_host(flow: chiray.Dataflow, **options: Any) -> Any:
        return submit(flow, **{"num_hosts": 1, **options})

    monkeypatch.setattr(chiray, "submit", one_host)
    monkeypatch.setattr(dataflow, "_RUNTIME", one_host)

    def run_example(name: str) -> tuple[dict[str, Any], Any, str]:
        namespace = runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"example_{name}")
        capsys.readouterr()
        value = namespace["main"]()
        return namespace, value, capsys.readouterr().out

    return run_example


def _rows(table: pa.Table, *columns: str) -> list[tuple[Any, ...]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)))


def _generated(source: Any, records: int) -> list[pa.RecordBatch]:
    """The first ``records`` records of a one-split generator source, read straight from its split."""
    (split,) = source.splits()
    reader, batches, read = source.open_split(split), [], 0
    while read < records:
        batch = reader.read()
        batches.append(batch.slice(0, records - read))
        read += batches[-1].num_rows
    return batches


def _final_counts(table: pa.Table) -> dict[str, int]:
    return dict(zip(table.column("key").to_pylist(), table.column("count").to_pylist()))


@checks("wordcount")
def test_wordcount_counts_each_word(run: Any) -> None:
    namespace, counts, out = run("wordcount")
    expected = collections.Counter(word for line in namespace["LINES"] for word in line.split(" "))
    assert dict(_rows(counts, "word", "count")) == dict(expected)
    printed = [line.split() for line in out.splitlines() if re.fullmatch(r" *[a-z]+ +[0-9]+", line)]
    assert printed == [[w, str(n)] for w, n in sorted(expected.items(), key=lambda item: (-item[1], item[0]))]


@checks("windows_late_data")
def test_windows_count_clicks_per_minute_and_set_late_clicks_aside(run: Any) -> None:
    namespace, (windows, late), out = run("windows_late_data")
    t0, delay, tick = namespace["T0"], timedelta(seconds=10), timedelta(milliseconds=1)
    clicks = [(u, t0 + timedelta(seconds=s), ms) for u, s, ms in namespace["CLICKS"]]
    on_time, behind, watermark = [], [], None
    for first in range(0, len(clicks), 2):  # the example reads two clicks a batch; a batch's watermark follows it
        for user, ts, ms in clicks[first:first + 2]:
            end = ts.replace(second=0) + timedelta(minutes=1)
            (behind if watermark is not None and watermark >= end - tick else on_time).append((user, ts, ms))
        watermark = max(ts for _, ts, _ in clicks[:first + 2]) - delay - tick
    frame = pd.DataFrame(on_time, columns=["user", "ts", "ms"]).assign(window_start=lambda f: f.ts.dt.floor("min"))
    expected = frame.groupby(["user", "window_start"]).agg(clicks=("ms", "size"), total_ms=("ms", "sum"))
    assert _rows(windows, "user", "window_start", "clicks", "total_ms") == [
        (u, w.to_pydatetime(), c, t) for (u, w), (c, t) in expected.iterrows()]
    assert _rows(late, "user", "ts", "ms") == sorted(behind) and behind, "the example shows no late click"
    assert f"late: {late.to_pylist()}" in out


@checks("timers")
def test_timers_remind_idle_carts(run: Any) -> None:
    namespace, reminders, _ = run("timers")
    t0, gap = namespace["T0"], namespace["GAP"]
    expected = []
    by_user: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for user, minute, action in namespace["ACTIVITY"]:
        by_user[user].append((minute, action))
    for user, activity in by_user.items():
        items = 0
        for i, (minute, action) in enumerate(sorted(activity)):
            items = 0 if action == "buy" else items + 1
            last = t0 + timedelta(minutes=minute)
            idle = i + 1 == len(activity) or t0 + timedelta(minutes=activity[i + 1][0]) > last + gap
            if items and idle:  # nothing happened for 10 minutes after this, with items left in the cart
                expected.append((user, items, last, last + gap))
                items = 0
    assert _rows(reminders, "user", "items", "last_seen", "remind_at") == sorted(expected)
    assert len(expected) >= 3


@checks("joins")
def test_joins_match_orders_payments_and_customers(run: Any) -> None:
    namespace, joined, _ = run("joins")
    t0, five = namespace["T0"], timedelta(minutes=5)
    orders = pd.DataFrame(namespace["ORDERS"], columns=["order_id", "customer", "amount", "minute"])
    payments = pd.DataFrame(namespace["PAYMENTS"], columns=["order_id", "paid", "pay_minute"])
    customers = pd.DataFrame(namespace["CUSTOMERS"], columns=["customer", "name", "city"])
    both = orders.merge(payments, on="order_id").merge(customers, on="customer")
    both = both[both.minute // 5 == both.pay_minute // 5]  # paid in the same 5-minute window
    expected = sorted((r.order_id, r.customer, r.name, r.city, r.amount, r.paid, t0 + int(r.minute) // 5 * five)
                      for r in both.itertuples())
    assert _rows(joined, "order_id", "customer", "name", "city", "amount", "paid", "window_start") == expected
    assert 0 < len(expected) < len(orders)


@checks("custom_source_sink")
def test_custom_source_and_sink_write_each_sensors_aggregates_once(run: Any) -> None:
    namespace, table, out = run("custom_source_sink")
    celsius, sensors, readings = namespace["celsius"], namespace["SENSORS"], namespace["READINGS"]
    frame = pd.DataFrame([(f"s{s}", celsius(s, r)) for s in range(sensors) for r in range(readings)],
                         columns=["sensor", "celsius"])
    expected = frame.groupby("sensor").celsius.agg(["size", "mean", "max"])
    got = table.to_pandas().set_index("sensor").sort_index()
    assert list(got.index) == list(expected.index)
    assert (got.readings == expected["size"]).all() and (got.hottest == expected["max"]).all()
    assert (abs(got["mean"] - expected["mean"]) < 1e-9).all()
    files = re.search(r"files: (\[.*\])", out)
    assert files and all(not name.startswith(".") for name in ast.literal_eval(files.group(1)))


@checks("nexmark")
def test_nexmark_queries_equal_duckdb(run: Any, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("duckdb")
    import pyarrow.parquet as pq

    from benchmarks.nexmark.oracle import run_sql, same_rows

    namespace, results, _ = run("nexmark")
    paths = {}
    for kind, table in namespace["nexmark_events"]().items():  # the example's events, as the benchmark's oracle reads them
        paths[kind] = str(tmp_path / f"{kind}.parquet")
        pq.write_table(table, paths[kind])
    for query, got in results.items():
        expected = run_sql(query, paths)
        assert len(expected) >= 5, f"{query}: the oracle selects almost nothing"
        difference = same_rows(got.to_pandas(), expected)
        assert difference is None, f"{query}: {difference}"


@checks("live_rescale")
def test_live_rescale_counts_every_record_once(run: Any) -> None:
    namespace, (counts, read), out = run("live_rescale")
    expected = key_counts(_generated(namespace["events"](), read))
    assert _final_counts(counts) == expected
    assert "(('events', 1), ('count', 3), ('out', 2))" in out and "count 2 -> 3 non_disruptive done" in out
    keys = re.search(r"keys per instance of count: (\{.*\})", out)
    assert keys and sum(ast.literal_eval(keys.group(1)).values()) == len(expected) == 100


@checks("checkpoint_restore")
def test_checkpoint_restore_counts_every_record_once_across_two_jobs(run: Any) -> None:
    namespace, (counts, first), out = run("checkpoint_restore")
    expected = key_counts(namespace["events"](paced=False))
    assert dict(zip(counts["key"], counts["count"])) == expected
    assert 500 <= first < namespace["RECORDS"], "job 1 was not stopped mid-stream"
    assert f"job 2 read the other {namespace['RECORDS'] - first:,} records" in out
    assert "checkpoint 1" in out and "FINISHED" in out


@checks("detached_cli")
def test_detached_job_operated_by_the_cli(run: Any) -> None:
    try:
        namespace, (counts, read, said), _ = run("detached_cli")
    finally:  # a failed run must not leave the detached job's actors behind
        if "counts" in {job.name for job in chiray.jobs(all=True)}:
            job = chiray.attach("counts")
            job.cancel()
            job.forget()
    assert _final_counts(counts) == key_counts(_generated(namespace["events"](), read))
    assert "counts" in said["list"] and "RUNNING" in said["status"]
    assert "rescaled 'count' 2 -> 3" in said["rescale"] and re.search(r"count +2 -> 3 .* done", said["rescales"])
    assert re.match(r"checkpoint 1 ", said["checkpoint"]) and "stopped at checkpoint 2; savepoint" in said["stop"]
    savepoint = said["stop"].split("; savepoint ")[1].strip()
    assert savepoint in said["savepoints"], "chiray savepoints does not list the savepoint of the stop"
    assert said["forget"].strip() == "forgot counts"
    # The tutorial's session: every command parses and is one this example ran.
    from chiray.cli import build_parser

    page = (ROOT / "docs" / "tutorial" / "detached.md").read_text()
    commands = [shlex.split(line[2:]) for line in page.splitlines() if line.startswith("$ chiray ")]
    assert commands, "the tutorial shows no chiray commands"
    for argv in commands:
        build_parser().parse_args(argv[1:])
        assert argv[1] in said, f"the tutorial shows `chiray {argv[1]}`, which the example does not run"


@SPARK
@checks("spark_batch")
def test_spark_batch_aggregates_per_user(run: Any, spark: Any) -> None:
    namespace, result, _ = run("spark_batch")
    frame = namespace["events"](spark).toPandas()
    expected = frame.groupby("user").agg(n=("v", "size"), total=("v", "sum")).reset_index()
    assert result[["user", "n", "total"]].astype("int64").equals(expected.astype("int64"))


@SPARK
@checks("spark_streaming")
def test_spark_streaming_counts_every_row_once(run: Any, spark: Any) -> None:
    namespace, counts, _ = run("spark_streaming")
    ids = range(namespace["FILES"] * namespace["ROWS_PER_FILE"])
    expected = collections.Counter(f"k{i % namespace['KEYS']}" for i in ids)
    assert dict(zip(counts["key"], counts["count"])) == dict(expected)
