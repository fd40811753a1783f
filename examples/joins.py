"""Joins: orders matched with their payments in the same 5-minute window, then with their customer.

Run it with ``python examples/joins.py``.

Two streams are *connected* and keyed by one column each, so that rows with
equal keys meet in the same instance. ``window_join`` pairs the rows of one
key that fall in the same event-time window and emits them when the
watermark passes the window's end, so its state stays bounded. ``join`` pairs
rows whenever the second one arrives and keeps every row: fine for a small
table such as the customers here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa

import chiray

T0 = datetime(2026, 5, 4, 12, 0)
ORDERS = [(1, "c1", 25, 0), (2, "c2", 40, 1), (3, "c1", 12, 3), (4, "c3", 99, 6), (5, "c2", 8, 8),
          (6, "c1", 60, 12), (7, "c3", 15, 14)]
"""(order id, customer, amount, minutes after T0)."""
PAYMENTS = [(1, 25, 2), (3, 12, 4), (2, 40, 6), (5, 8, 9), (4, 99, 11), (6, 60, 13)]
"""(order id, amount paid, minutes after T0): orders 2 and 4 are paid in the next window, 7 not at all."""
CUSTOMERS = [("c1", "Ada", "Oslo"), ("c2", "Bo", "Lund"), ("c3", "Cy", "Turku")]

ORDER_SCHEMA = pa.schema([("order_id", pa.int64()), ("customer", pa.string()), ("amount", pa.int64()),
                          ("ts", pa.timestamp("ms"))])
PAYMENT_SCHEMA = pa.schema([("order_id", pa.int64()), ("paid", pa.int64()), ("ts", pa.timestamp("ms"))])


def main() -> pa.Table:
    orders = [{"order_id": o, "customer": c, "amount": a, "ts": T0 + timedelta(minutes=m)}
              for o, c, a, m in ORDERS]
    payments = [{"order_id": o, "paid": p, "ts": T0 + timedelta(minutes=m)} for o, p, m in PAYMENTS]
    customers = [{"id": c, "name": n, "city": city} for c, n, city in CUSTOMERS]
    watermarks = chiray.bounded_out_of_orderness("ts", timedelta(minutes=1))
    flow = chiray.Dataflow("joins")
    order_stream = flow.source(chiray.from_items(orders, schema=ORDER_SCHEMA, batch_size=2), name="orders",
                               watermarks=watermarks)
    payment_stream = flow.source(chiray.from_items(payments, schema=PAYMENT_SCHEMA, batch_size=2),
                                 name="payments", watermarks=watermarks)
    # Columns: order_id, window_start, window_end, the order's, the payment's (a clash gets "_right").
    paid = (order_stream.connect(payment_stream)
                        .key_by("order_id")
                        .window_join(chiray.tumbling(timedelta(minutes=5)), on="ts", parallelism=2,
                                     name="paid_in_window"))
    # The customer table needs no watermarks: join() does not act on event time.
    customer_stream = flow.source(chiray.from_items(customers), name="customers")
    (paid.connect(customer_stream)
         .key_by("customer", "id")                       # a key column of each side
         .join(parallelism=2, name="with_customer")      # the key (the left name), left columns, right ones
         .sink(chiray.collect(), name="out"))
    job = chiray.submit(flow)
    job.wait(timeout=120)
    joined = job.result("out").sort_by("order_id")
    print(joined.select(["order_id", "customer", "name", "city", "amount", "paid", "window_start"])
                .to_pandas().to_string(index=False))
    return joined


if __name__ == "__main__":
    main()
