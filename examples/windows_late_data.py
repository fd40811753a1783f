"""Windows and late data: clicks per user and minute, in event time, with the late clicks set aside.

Run it with ``python examples/windows_late_data.py``.

Each click carries the time it happened (``ts``). The source makes
*watermarks* from it: a watermark ``w`` says that no click at or before ``w``
is expected any more. A window emits its result once the watermark passes its
end; a click that arrives after that is *late* and goes to a side output.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa

import chiray

T0 = datetime(2026, 1, 1)
CLICKS = [("a", 1, 30), ("b", 5, 12), ("a", 70, 8), ("a", 3, 50), ("b", 65, 40), ("b", 20, 5)]
"""(user, seconds after T0, milliseconds the page took), in the order they arrive."""

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.timestamp("ms")), ("ms", pa.int64())])


def main() -> tuple[pa.Table, pa.Table]:
    rows = [{"user": user, "ts": T0 + timedelta(seconds=s), "ms": ms} for user, s, ms in CLICKS]
    source = chiray.from_items(rows, schema=SCHEMA, batch_size=2)       # two clicks a batch
    flow = chiray.Dataflow("clicks")
    per_minute = (
        flow.source(source, name="clicks",
                    # the watermark trails the newest click by 10 s: clicks may come up to 10 s out of order
                    watermarks=chiray.bounded_out_of_orderness("ts", timedelta(seconds=10)))
            .key_by("user")
            .window(chiray.tumbling(timedelta(minutes=1)), on="ts",     # a timedelta on a timestamp column
                    late_side_output=True)                              # keep late clicks, do not drop them
            .agg(clicks=(None, "count"), total_ms=("ms", "sum"), parallelism=2, name="per_minute"))
    per_minute.sink(chiray.collect(), name="out")
    per_minute.side_output("late").sink(chiray.collect(), name="late")  # the clicks behind the watermark
    job = chiray.submit(flow)
    job.wait(timeout=120)
    windows = job.result("out").sort_by([("user", "ascending"), ("window_start", "ascending")])
    late = job.result("late")
    print(windows.to_pandas().to_string(index=False))
    print("late:", late.to_pylist())
    return windows, late


if __name__ == "__main__":
    main()
