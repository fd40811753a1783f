"""Timers: remind a shopper who left items in their cart and did nothing for 10 minutes.

Run it with ``python examples/timers.py``.

A keyed ``process`` keeps state per key (here, per user) and sets event-time
*timers*: ``state.register(t)`` asks for a call to ``on_timer`` once the
watermark reaches ``t``. Every activity moves the user's reminder 10 minutes
past it; a purchase empties the cart. A timer fires when the watermark
passes its time, after the records read before that watermark: an activity
read first cancels the reminder even if it happened later. When the input
ends, event time ends and the timers still pending fire.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

import chiray

T0 = datetime(2026, 3, 1, 9, 0)
GAP = timedelta(minutes=10)
GAP_TICKS = GAP // timedelta(milliseconds=1)
"""Timers are integers in the ticks of the time column: milliseconds for ``timestamp("ms")``."""

ACTIVITY = [("ann", 0, "add"), ("bob", 1, "add"), ("bob", 3, "buy"), ("ann", 4, "add"),
            ("cid", 6, "add"), ("cid", 12, "add"), ("cid", 19, "add"), ("bob", 20, "add"),
            ("ann", 25, "add"), ("bob", 27, "add"), ("ann", 29, "buy"), ("bob", 32, "add"),
            ("cid", 35, "add"), ("cid", 40, "buy"), ("ann", 44, "add"), ("bob", 50, "add")]
"""(user, minutes after T0, action): what the shop's front end reports, in time order."""

SCHEMA = pa.schema([("user", pa.string()), ("ts", pa.timestamp("ms")), ("action", pa.string())])
REMINDERS = pa.schema([("user", pa.string()), ("items", pa.int64()), ("last_seen", pa.timestamp("ms")),
                       ("remind_at", pa.timestamp("ms"))])


def track(user: str, rows: pa.RecordBatch, state: Any) -> None:
    """Called with the user's rows of each batch: count the items in the cart, note the last activity."""
    items, last = state.value or (0, 0)
    for action, ts in zip(rows.column("action").to_pylist(), rows.column("ts").cast(pa.int64()).to_pylist()):
        items = 0 if action == "buy" else items + 1
        last = max(last, ts)
    state.value = (items, last)
    if items:
        state.register(last + GAP_TICKS)     # an older timer stays pending; remind() tells it is stale


def remind(user: str, time: int, state: Any) -> list[dict[str, Any]]:
    """The watermark reached ``time``: remind the user if this is the timer of their last activity."""
    items, last = state.value or (0, 0)
    if items == 0 or time != last + GAP_TICKS:
        return []                            # bought since, or active since: a newer timer is pending
    state.value = None                       # reminded once; the next activity starts afresh
    at = datetime(1970, 1, 1) + timedelta(milliseconds=time)
    return [{"user": user, "items": items, "last_seen": at - GAP, "remind_at": at}]


def main() -> pa.Table:
    rows = [{"user": u, "ts": T0 + timedelta(minutes=m), "action": a} for u, m, a in ACTIVITY]
    flow = chiray.Dataflow("reminders")
    (flow.source(chiray.from_items(rows, schema=SCHEMA, batch_size=1),   # one record a batch: the watermark
                 name="activity",                                         # moves on after each record
                 watermarks=chiray.bounded_out_of_orderness("ts", timedelta(minutes=1)))
         .key_by("user")
         .process(track, on_timer=remind, schema=REMINDERS, parallelism=2, name="reminders")
         .sink(chiray.collect(), name="out"))
    job = chiray.submit(flow)
    job.wait(timeout=120)
    reminders = job.result("out").sort_by([("remind_at", "ascending"), ("user", "ascending")])
    print(reminders.to_pandas().to_string(index=False))
    return reminders


if __name__ == "__main__":
    main()
