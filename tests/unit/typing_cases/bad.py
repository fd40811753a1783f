"""User code that ``mypy --strict`` must refuse: each line marked ``# error: <code>`` is an error of that code,
and no other line may be one (tests/unit/test_typing.py), so the check cannot pass vacuously.
"""

from __future__ import annotations

import pyarrow as pa

import chiray


def timer_fn(key: object, rows: pa.RecordBatch, state: chiray.KeyedTimerState) -> None:
    state.register(state.watermark + 1)


def misuse(stream: chiray.Stream) -> None:
    keyed = stream.key_by("k")
    keyed.agg(x=("a", 1))  # error: arg-type
    keyed.agg(x=("a", "median"))  # error: arg-type
    keyed.agg(x=("a", "sum", "b"))  # error: arg-type
    keyed.window(chiray.tumbling(10), on="ts").agg(x=(None, "sum"))  # error: arg-type
    keyed.process(timer_fn)  # error: call-overload
    keyed.process(lambda key, rows: None)  # error: call-overload
    keyed.window(chiray.tumbling(10), on="ts").count().no_such_verb()  # error: attr-defined
    stream.connect(stream).key_by("k").join().key_by(1)  # error: arg-type


def submit_misuse(flow: chiray.Dataflow) -> None:
    job = chiray.submit(flow, detached=True)
    job.no_such_verb()  # error: attr-defined
    flow.submit().rescale("count")  # error: call-arg
    flow.submit(restore_from=3)  # error: arg-type
    chiray.submit(flow).checkpoint().upper()  # error: attr-defined
