"""Every benchmark runs at a tiny size and ends with its JSON line, so none can rot.

Each runs in this process, on the session's Ray (and, for those that use
Spark, its SparkSession): a benchmark starts its own only where the process
has none (``benchmarks.common.start_ray``). The figures are not checked here,
only that the run completes, verifies its own result where it has one, and
reports the keys its issue asks for.

Every phase of a benchmark runs, each as short as its flags allow: short
warm-ups, settling times and windows, a low offered load (less backlog to
wait out), and one host process per job where the benchmark lets the number
be chosen (``--num-hosts``, NEXMark's ``--parallelism``): at these sizes most
of a run's time is starting processes (about a second of CPU each).
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

RUNS = {
    "keyed_count": (["--records", "100000", "--keys", "2000", "--batch-size", "20000", "--num-hosts", "1",
                     "--op", "agg,process,process_batch,reduce,map_records"],
                    ["records_per_s", "reference_records_per_s", "ratio", "peak_rss_mb", "job_rss_mb",
                     "state_bytes_per_key", "ops_per_s"]),
    "control_overhead": (["--quick", "--window", "0.2", "--load", "0.3", "--calibration", "0.5,0.5",
                          "--warm-up", "0.5", "--num-hosts", "1"],
                         ["throughput_ratio_nonblocking_100", "throughput_ratio_blocking_100",
                          "completion_p99_ms_nonblocking_100"]),
    "hashing": (["--quick"], ["string_rows_per_s", "int64_rows_per_s"]),
    "control_scale": (["--sizes", "8", "--ops", "1", "--num-hosts", "1"],
                      ["tree_completion_ms_8", "flat_completion_ms_8"]),
    "checkpoint": (["--quick", "--keys", "5000", "--window", "0.5", "--load", "0.3", "--warm-up", "0.5",
                    "--settle", "0.5", "--lead-in", "1", "--num-hosts", "1"],
                   ["throughput_ratio_checkpoint_1s", "latency_p99_ms_lead_in", "checkpoint_p50_ms", "checkpoint_p99_ms", "max_stall_ms",
                    "bytes_per_checkpoint", "full_bytes", "changed_rows_per_interval", "state_bytes_per_key",
                    "rss_mb_per_million_keys", "recovery_s", "recovered_keys", "settle_s", "checkpoints_full",
                    "full_copy_s", "latency_p99_ms_checkpoint_1s_changes"]),
    "recovery": (["--quick", "--sizes", "5000", "--rate", "50000", "--fill", "0.5", "--steady-window", "0.5",
                  "--num-hosts", "1"],
                 ["records_replayed"]),
    "autoscale": (["--phases", "0.5,1.5,1.5", "--png", "/dev/null", "--interval", "0.5"],
                  ["decisions_up", "decisions_down", "time_to_converge_up_s", "final_parallelism_up",
                   "oracle_parallelism_up", "overprovision_ratio", "exact"]),
    "migration": (["--keys", "2000", "--bins", "16", "--batch-size", "1000", "--strategies",
                   "all_at_once,non_disruptive_16", "--png", "/dev/null", "--theta", "0.5", "--settle", "0.3",
                   "--load", "0.3", "--warm-up", "0.5", "--wide-window", "0.5", "--num-hosts", "1"],
                  ["strategies", "best_over_all_at_once", "all_at_once_max_latency_ms",
                   "best_fine_grained_max_latency_ms"]),
    "windows": (["--records", "100000", "--keys", "2000", "--batch-size", "20000", "--latency-records", "20000",
                 "--rate", "100000", "--num-hosts", "1"],
                ["records_per_s", "ratio", "window_latency_p50_ms", "window_latency_p99_ms"]),
    "nexmark": (["--events", "10000", "--queries", "q0,q5", "--batch-events", "5000", "--parallelism", "1"],
                ["queries", "migration"]),
    "spark_ingest": (["--rows", "20000", "--small-rows", "5000", "--partitions", "2", "--repeat", "1",
                      "--num-hosts", "1"],
                     ["bridge_rows_per_s", "to_arrow_rows_per_s", "ratio", "driver_rss_mb_1m", "driver_rss_mb_5m",
                      "driver_rss_growth_mb_5m", "to_arrow_driver_rss_growth_mb_5m", "naive_rows_per_s",
                      "ratio_to_naive", "bridge_cpu_us_per_row"]),
    "upgrade": (["--quick", "--lead", "0.5", "--after", "0.5", "--warm-up", "0.3", "--measure", "0.5", "--load", "0.3",
                 "--num-hosts", "1"],
                ["upgrade_pause_ms", "total_s", "exact", "restart_pause_ms", "pause_ratio", "restart_exact"]),
    "chaos": (["--seeds", "1", "--kinds", "host_kill,stop_restore_same_dir", "--faults", "2", "--records", "16000",
               "--num-hosts", "1"],
              ["runs", "faults", "lost", "duplicated", "reordered", "exact", "recovery_s_p50"]),
}


SPARK = {"spark_ingest", "nexmark"}  # they run Spark too (nexmark: Structured Streaming, for its comparison)
# Runs whose checks hold whatever their speed (exact results, the keys of their JSON line): `make test` runs them
# beside the other integration tests at low CPU priority (the `background` marker).
BACKGROUND = {"spark_ingest", "nexmark"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.background) if n in BACKGROUND else n
                                  for n in sorted(RUNS)])
def test_benchmark_runs_and_reports(name, ray_session, request, capsys):
    if name in SPARK:
        if os.environ.get("CHIRAY_SPARK_TESTS") == "0":
            pytest.skip("Spark runs skipped (CHIRAY_SPARK_TESTS=0), like tests/integration/test_spark_bridge.py")
        request.getfixturevalue("spark")  # the session's, which the benchmark uses and leaves running
    args, keys = RUNS[name]
    module = importlib.import_module("benchmarks.nexmark.__main__" if name == "nexmark" else f"benchmarks.{name}")
    module.main(args)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"{name} printed no JSON line:\n{out[-2000:]}"
    figures = json.loads(lines[-1])
    missing = [k for k in keys if k not in figures]
    assert not missing, f"{name}'s JSON lacks {missing}: {figures}"
    if name == "nexmark":  # each query checks itself against DuckDB's SQL on the same events
        assert [q["query"] for q in figures["queries"]] == ["q0", "q5"]
        assert all(q["exact"] for q in figures["queries"]), figures
    if name == "upgrade":  # both changes cut exactly: the old code before the reported cut, the new after
        assert figures["exact"] and figures["restart_exact"], figures
    if name == "chaos":  # both kinds injected while the input flowed; the output matched the oracle
        assert figures["faults"] == {"host_kill": 1, "stop_restore_same_dir": 1} and figures["exact"], figures
