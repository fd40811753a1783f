"""Losing a whole node: a simulated cluster (head + two workers) in its own process, one node removed."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a simulated three-node cluster of its own


def test_removing_the_node_of_a_stateful_host_recovers_exactly():
    script = ROOT / "tests" / "integration" / "scripts" / "node_failure.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ENABLE_AUTO_CONNECT": "0"}
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the script printed no result (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["exact"], result
    assert any(e.startswith("recovered") for e in result["events"]), result
    assert done.returncode == 0
