"""A live rescale: a keyed count goes from two instances to three while records keep flowing.

Run it with ``python examples/live_rescale.py``.

A keyed operator's state lives in key *bins*. A rescale moves bins between
instances while the job runs: every record of a key is applied to that key's
state exactly once and in order, before, during and after the move. The
input here never ends (``generate(None)``), so the count emits each key's new
value as it changes (``emit="updates"``) and the program ends the job with
``stop()``: a final checkpoint, whose output is committed.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

import chiray


def events() -> chiray.Source:
    """An endless, deterministic stream of key, value, seq and ts columns: 100 keys, 1,000 records/s."""
    return chiray.generate(None, rate=1_000, batch_size=100, num_keys=100, seed=1)


def main() -> tuple[pa.Table, int]:
    flow = chiray.Dataflow("rescale-demo")
    (flow.source(events(), name="events")
         .key_by("key")
         .count(parallelism=2, name="count", emit="updates")     # an endless input: updates, not final rows
         .sink(chiray.collect(), name="out"))
    job = chiray.submit(flow, spare_hosts=1)    # one idle host ready for the scale-out

    # --8<-- [start:watch]
    # A job's handle answers while it runs: statistics() has each instance's counters.
    while (counted := job.statistics().records_in("count")) < 500:
        print(f"{counted:,} records counted")
        try:
            job.wait(timeout=0.1)               # raises TimeoutError while the job runs
        except TimeoutError:
            pass
    # --8<-- [end:watch]

    handle = job.rescale("count", 3, strategy="non_disruptive", chunk_bins=64)
    print(handle.progress().state.value)        # WAITING, PLANNING, MIGRATING, then DONE
    done = handle.result(timeout=120)           # waits; raises RescaleError if it failed
    print(f"moved {done.bins_moved} bins, {done.bytes_moved:,} bytes in {done.elapsed_s:.2f} s")
    print(job.info().operators)                 # (('events', 1), ('count', 3), ('out', 2))
    for record in job.rescales():               # the job's rescale history
        print(record.operator, record.from_, "->", record.to, record.strategy, record.state.value)

    # metrics() runs a monitor in-band, behind the records already queued: keys per instance, state sizes.
    monitor = job.metrics(timeout=60)
    keys = {index: m["keys"] for (operator, index), m in sorted(monitor.instances.items())
            if operator == "count"}
    print("keys per instance of count:", keys)
    print(job.tail("out", 3).to_pandas().to_string(index=False))   # the newest rows that reached the sink

    # stop(): a final checkpoint cuts the stream; the output up to it is committed and the job ends.
    stopped = job.stop()
    read = job.statistics().records_out("events")   # what the source read before the cut
    updates = job.result("out")
    counts = updates.group_by("key").aggregate([("count", "max")]).rename_columns(["key", "count"])
    print(f"stopped at checkpoint {stopped.id}: {read:,} records read, "
          f"{pc.sum(counts['count']).as_py():,} counted over {counts.num_rows} keys")
    return counts, read


if __name__ == "__main__":
    main()
