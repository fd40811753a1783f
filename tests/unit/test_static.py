"""The packages type-check with mypy and have no unused or undefined names (ruff's F rules)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["actors", "operators", "control", "spark_bridge"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_mypy_is_clean():
    done = run("mypy", *PACKAGES, "--ignore-missing-imports", "--no-error-summary")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_no_unused_or_undefined_names():
    done = run("ruff", "check", *PACKAGES, "benchmarks", "tests", "--select", "F,E9", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
