"""peers: the same workload on other stream processors, each in a virtualenv of its own (never a dependency).

:func:`run_bytewax` runs ``keyed_count``'s records through Bytewax 0.21's ``stateful_map``
(``bytewax_count.py``) in ``benchmarks/out/bytewax-venv``, made on first use with ``python -m venv`` and
``pip install bytewax==0.21.1 pyarrow`` (a minute; it needs the package index).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Any, Callable

import pyarrow as pa

__all__ = ["run_bytewax", "bytewax_python"]

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, "..", "out", "bytewax-venv")
BYTEWAX = "bytewax==0.21.1"


def bytewax_python() -> str:
    """The Python of the Bytewax virtualenv, made (and Bytewax installed) if missing."""
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        print(f"  making {os.path.normpath(VENV)} with {BYTEWAX} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    if subprocess.run([python, "-c", "import bytewax, pyarrow"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", BYTEWAX, "pyarrow"], check=True)
    return python


def run_bytewax(batches: list[pa.RecordBatch], layouts: list[int], check: Callable[[pa.Table], None],
                batch_size: int) -> dict[str, Any]:
    """Each layout (a number of processes) once over ``batches``, its source in batches of ``batch_size``
    items; every result checked by ``check``.

    Returns ``bytewax_records_per_s`` (the best layout's), ``bytewax_processes`` (that layout) and
    ``bytewax_runs`` (records/s per layout). A layout's time is its slowest process's run of the flow
    (from the records in memory as tuples until its end)."""
    python = bytewax_python()
    out_dir = os.path.join(HERE, "..", "out", "bytewax")
    os.makedirs(out_dir, exist_ok=True)
    records = os.path.join(out_dir, "records.arrow")
    table = pa.Table.from_batches(batches).select(["key", "value"])
    with pa.OSFile(records, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)
    runs: dict[str, int] = {}
    for processes in layouts:
        prefix = os.path.join(out_dir, f"result-{processes}")
        for old in glob.glob(prefix + ".*.json"):
            os.remove(old)
        print(f"  Bytewax stateful_map, {processes} process(es) ...", flush=True)
        done = subprocess.run([python, os.path.join(HERE, "bytewax_count.py"), records, prefix,
                               "--processes", str(processes),
                               "--batch-size", str(batch_size)], check=True, capture_output=True, text=True)
        seconds = max(json.loads(line)["seconds"] for line in done.stdout.splitlines() if line.startswith("{"))
        finals: dict[str, list[int]] = {}
        for path in glob.glob(prefix + ".*.json"):
            with open(path) as f:
                finals.update(json.load(f))
        check(pa.table({"key": list(finals), "count": [v[0] for v in finals.values()],
                        "total": [v[1] for v in finals.values()]}))
        runs[str(processes)] = round(table.num_rows / seconds)
        print(f"    {runs[str(processes)] / 1e3:.0f}K records/s ({seconds:.2f} s), result matches pandas", flush=True)
    best = max(runs, key=lambda p: runs[p])
    return {"bytewax_records_per_s": runs[best], "bytewax_processes": int(best), "bytewax_runs": runs}
