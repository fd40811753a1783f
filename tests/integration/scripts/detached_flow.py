"""Submit a detached keyed count (a generated source held at a gate, a to_parquet sink) to the cluster at
RAY_ADDRESS.

Usage: python detached_flow.py NAME OUT_DIR CHECKPOINT_DIR PARALLELISM GATE [RESTORE_FROM] [--wait]

Each split of the source emits half its records at once, then trickles, and
stops short of its end until the file GATE exists (``tests/gate.py``): the job
cannot end before the test opens the gate, whatever the test does meanwhile,
and the hold stays at the same records across a recovery. Exits once the job
is submitted (or, with --wait, once it finished); a failed submit prints one
line and exits 1. The records are ``source()`` below, which the test reads
again for its oracle.
"""

from __future__ import annotations

import functools
import operator
import pathlib
import sys

import cloudpickle

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))  # the checkout, for tests.gate

import chiray  # noqa: E402
import tests.gate  # noqa: E402

cloudpickle.register_pickle_by_value(tests.gate)  # the cluster's workers have no checkout on their path

RECORDS = 240_000
SPLITS = 2
BATCH = 4_000


def source() -> chiray.Source:
    return chiray.generate(RECORDS, batch_size=BATCH, num_keys=500, seed=3, num_splits=SPLITS)


def gated_source(gate: str) -> chiray.Source:
    per_split = RECORDS / SPLITS  # a split's offset is the batches it emitted
    return tests.gate.Gated(source(), gate, hold_after=int(0.5 * per_split), trickle=500.0,
                            hold_at=int(0.75 * per_split), position=functools.partial(operator.mul, BATCH))


def main(argv: list[str]) -> int:
    wait = "--wait" in argv
    name, out, checkpoints, parallelism, gate, *rest = [a for a in argv if a != "--wait"]
    flow = chiray.Dataflow("keyed-count")
    (flow.source(gated_source(gate), parallelism=2, name="events")
         .key_by("key").count(parallelism=int(parallelism), name="count")
         .sink(chiray.to_parquet(out), name="out"))
    try:
        job = chiray.submit(flow, name=name, detached=True, checkpoint_dir=checkpoints,
                            restore_from=rest[0] if rest else None)
        if wait:
            job.wait(timeout=120)
    except Exception as exc:
        print(f"submit failed: {exc}", file=sys.stderr)
        return 1
    print(f"submitted {job.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
