"""Checkpoint and restore: stop a job with a savepoint and finish its work in a new job, at another
parallelism, with every record counted exactly once.

Run it with ``python examples/checkpoint_restore.py``.

Checkpoints are aligned control operations that travel with the data: each
instance records its state when the checkpoint's barrier has reached it on
all of its inputs, and the checkpoint is committed once every instance has
acknowledged it. A job rolls back to its last checkpoint when a host dies; a
new job can start from one, as from a savepoint.
"""

from __future__ import annotations

import tempfile

import pandas as pd

import chiray

RECORDS = 3_000


def events(paced: bool) -> chiray.Source:
    """The same 3,000 records over 100 keys each time (seeded). Paced, the stream delivers 2,000 records a
    second for half a second and then goes quiet (a live source with nothing new); unpaced, it is read to
    its end as fast as the job takes it. A restored source goes on from the offsets in the checkpoint."""
    return chiray.generate(RECORDS, rate=[(0, 2_000), (0.5, 0)] if paced else None, batch_size=100,
                           num_keys=100, seed=2)


def build(source: chiray.Source, parallelism: int) -> chiray.Dataflow:
    flow = chiray.Dataflow("counts")
    (flow.source(source, name="events")
         .key_by("key")
         .count(parallelism=parallelism, name="count", emit="final")   # the input ends: one row per key
         .sink(chiray.collect(), name="out"))
    return flow


def main() -> tuple[pd.DataFrame, int]:
    root = tempfile.mkdtemp()        # use durable storage (a directory, or an s3:// URI) in earnest
    job = chiray.submit(build(events(paced=True), 2), checkpoint_dir=f"{root}/chk")
    while job.statistics().records_in("count") < 500:
        try:
            job.wait(timeout=0.1)    # raises TimeoutError while the job runs
        except TimeoutError:
            pass
    print("checkpoint", job.checkpoint(timeout=60))     # an aligned checkpoint now; its id once durable
    stopped = job.stop(savepoint=f"{root}/savepoints")  # a final checkpoint, copied to the savepoint
    first = job.statistics().records_out("events")
    print(f"job 1 read {first:,} records; stopped at checkpoint {stopped.id}, {job.status().state.value}")
    print("savepoint", stopped.path)

    # A new job from the savepoint: three instances of the count instead of two, the source read on.
    restored = chiray.submit(build(events(paced=False), 3), restore_from=f"{root}/savepoints",
                             checkpoint_dir=f"{root}/chk2")
    restored.wait(timeout=120)
    counts = restored.result("out").to_pandas()
    print(f"job 2 read the other {restored.statistics().records_out('events'):,} records")
    print(len(counts), "keys,", counts["count"].sum(), "records")     # 100 keys, 3000 records
    return counts, first


if __name__ == "__main__":
    main()
