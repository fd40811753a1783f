"""Submit a detached keyed count (a paced generated source, a to_parquet sink) to the cluster at RAY_ADDRESS.

Usage: python detached_flow.py NAME OUT_DIR CHECKPOINT_DIR PARALLELISM [RESTORE_FROM] [--wait]

Exits once the job is submitted (or, with --wait, once it finished); a failed
submit prints one line and exits 1. The records are ``source()`` below, which
the test reads again for its oracle.
"""

from __future__ import annotations

import sys

import chiray

RECORDS = 240_000
RATE = 8_000.0


def source() -> chiray.Source:
    return chiray.generate(RECORDS, rate=RATE, batch_size=4_000, num_keys=500, seed=3, num_splits=2)


def main(argv: list[str]) -> int:
    wait = "--wait" in argv
    name, out, checkpoints, parallelism, *rest = [a for a in argv if a != "--wait"]
    flow = chiray.Dataflow("keyed-count")
    (flow.source(source(), parallelism=2, name="events")
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
