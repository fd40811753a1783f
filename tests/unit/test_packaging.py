"""The distribution installs one import package, ``chiray``; ``import chiray`` stays light."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_wheel_holds_only_chiray(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("chiray-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    outside = [n for n in names if not (n.startswith("chiray/") or n.split("/")[0].endswith(".dist-info"))]
    assert not outside, f"the wheel installs files outside chiray/: {outside[:10]}"
    for module in ("chiray/__init__.py", "chiray/__main__.py", "chiray/cli.py", "chiray/actors/jobs/job.py",
                   "chiray/operators/dataflow.py", "chiray/control/ops/monitor.py", "chiray/spark_bridge/source.py",
                   "chiray/grafana/chiray_dashboard.json"):
        assert module in names, f"{module} is missing from the wheel"
    assert not any(n.startswith("chiray/benchmarks") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "chiray = chiray.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_import_chiray_imports_neither_pyspark_nor_the_dashboard(tmp_path):
    """Nor deltalake, which only ``to_delta`` imports."""
    code = ("import sys, chiray\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'deltalake')\n"
            "               or m.startswith('ray.dashboard'))\n"
            "print(heavy)\n"
            "assert chiray.Dataflow is chiray.operators.Dataflow\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"import chiray imported {done.stdout.strip()}"


def test_spark_names_load_lazily(tmp_path):
    code = "import chiray, chiray.spark_bridge as sb\nassert chiray.from_spark is sb.from_spark\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_python_dash_m_chiray_runs_the_cli(tmp_path):
    done = subprocess.run([sys.executable, "-m", "chiray", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "demo" in done.stdout
