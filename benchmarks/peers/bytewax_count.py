"""bytewax_count.py: the keyed count + sum on Bytewax's ``stateful_map``, the peer that ``keyed_count --peers`` runs.

Runs in a virtualenv of its own holding Bytewax 0.21 and pyarrow (``keyed_count`` makes it, see
``benchmarks/peers/__init__.py``), never in the project's. Reads the records (``key``, ``value``) from an
Arrow IPC file, turns them into ``(key, value)`` tuples before timing, and times a flow of
``TestingSource -> key_on -> stateful_map -> sink``: the mapper adds one record to its key's
``(count, total)`` and emits it, as a per-record Python keyed function does. ``--processes 2`` runs it as
two processes of one cluster (Bytewax's ``-p 2``), each a worker; the source is read by one of them and
``stateful_map`` exchanges the records by key. Each process writes its keys' last ``(count, total)`` to
``OUT.<process>.json`` and its timing to stdout as one JSON line.

Run (what ``keyed_count`` does): ``bytewax-venv/bin/python bytewax_count.py IN.arrow OUT --processes N``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any


def _flow(items: list[tuple[str, int]], finals: dict[str, Any], batch_size: int) -> Any:
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.testing import TestingSource

    class _Last(StatelessSinkPartition):
        def write_batch(self, items: list[tuple[str, tuple[int, int]]]) -> None:
            finals.update(items)

    class _LastSink(DynamicSink):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> _Last:
            return _Last()

    def count_sum(state: tuple[int, int] | None, item: tuple[str, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        count, total = state or (0, 0)
        state = (count + 1, total + item[1])
        return state, state

    flow = Dataflow("keyed_count")
    records = op.input("records", flow, TestingSource(items, batch_size=batch_size))
    keyed = op.key_on("key", records, lambda item: item[0])
    counted = op.stateful_map("count_sum", keyed, count_sum)
    op.output("out", counted, _LastSink())
    return flow


def _run_one(path: str, out: str, process: int, addresses: list[str] | None, batch_size: int) -> None:
    import pyarrow as pa
    from bytewax.run import cli_main

    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    items = list(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
    del table
    finals: dict[str, Any] = {}
    flow = _flow(items, finals, batch_size)
    t0 = time.perf_counter()
    if addresses is None:
        cli_main(flow, workers_per_process=1)
    else:
        cli_main(flow, addresses=addresses, process_id=process, workers_per_process=1)
    elapsed = time.perf_counter() - t0
    with open(f"{out}.{process}.json", "w") as f:
        json.dump({k: list(v) for k, v in finals.items()}, f)
    print(json.dumps({"process": process, "seconds": elapsed, "records": len(items)}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", help="Arrow IPC file of (key, value) records")
    parser.add_argument("out", help="prefix of the result files")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=200_000,
                        help="items per batch of the source (keyed_count passes its own: with 100,000 keys, "
                             "Bytewax took 5x as long with batches of 10,000)")
    parser.add_argument("--process", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--addresses", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.processes == 1:
        _run_one(args.records, args.out, 0, None, args.batch_size)
        return
    if args.process is not None:
        _run_one(args.records, args.out, args.process, args.addresses.split(";"), args.batch_size)
        return
    addresses = ";".join(f"127.0.0.1:{_free_port()}" for _ in range(args.processes))
    children = [subprocess.Popen([sys.executable, __file__, args.records, args.out, "--processes",
                                  str(args.processes), "--process", str(i), "--addresses", addresses,
                                  "--batch-size", str(args.batch_size)],
                                 env=os.environ.copy())
                for i in range(args.processes)]
    codes = [child.wait() for child in children]
    if any(codes):
        raise SystemExit(f"bytewax processes exited with {codes}")


if __name__ == "__main__":
    main()
