"""A source fed from outside the dataflow, on real Ray actors: readers bound to their address, fed through their host.

The readers of a small test source register their split address and host
handle in a registry actor when their instance opens them (all at once:
``read_ahead``); the test then sends rows to each reader with
``OperatorHost.feed_reader`` and ends each split with ``to_reader``, and
checks the job's output against the rows it sent (a plain Python oracle).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
import ray

from chiray.operators import Dataflow, Source, SourceSplit, SplitAddress, SplitReader
from tests.waiting import wait_for

pytestmark = pytest.mark.usefixtures("ray_session")

SCHEMA = pa.schema([("x", pa.int64())])
NAMESPACE = "chiray-test-fed"


@ray.remote(num_cpus=0)
class Registry:
    def __init__(self) -> None:
        self.readers: dict[str, tuple[SplitAddress, object]] = {}

    def add(self, address: SplitAddress, host: object) -> None:
        self.readers[address.split_id] = (address, host)

    def all(self) -> dict[str, tuple[SplitAddress, object]]:
        return self.readers


class FedReader(SplitReader):
    """Buffers the rows it is sent; ends when told to."""

    def __init__(self, registry: str) -> None:
        self.registry, self.rows, self.ended, self.emitted = registry, [], False, 0

    def bind(self, address: SplitAddress) -> None:
        registry = ray.get_actor(self.registry, namespace=NAMESPACE)
        registry.add.remote(address, ray.get_runtime_context().current_actor)

    def receive(self, message):
        kind, values = message
        if kind == "end":
            self.ended = True
            return "ended after %d" % (self.emitted + len(self.rows))
        self.rows.extend(values)
        return len(self.rows)

    def ready_at(self):
        return None if self.rows or self.ended else time.monotonic() + 0.005

    def read(self):
        if not self.rows:
            return None if self.ended else pa.RecordBatch.from_pylist([], schema=SCHEMA)
        rows, self.rows = self.rows, []
        self.emitted += len(rows)
        return pa.RecordBatch.from_pydict({"x": rows}, schema=SCHEMA)

    def offset(self) -> int:
        return self.emitted


class FedSource(Source):
    def __init__(self, registry: str, num_splits: int) -> None:
        self.registry, self.num_splits = registry, num_splits

    def schema(self):
        return SCHEMA

    def splits(self):
        return [SourceSplit(f"fed-{i}", i) for i in range(self.num_splits)]

    def open_split(self, split, offset=None):
        return FedReader(self.registry)

    def read_ahead(self) -> int:
        return self.num_splits


def test_readers_opened_ahead_take_fed_rows_from_outside_in_order():
    registry = Registry.options(name="fed-registry", namespace=NAMESPACE).remote()
    flow = Dataflow("fed")
    flow.source(FedSource("fed-registry", 4), parallelism=2, name="src").collect(name="out")
    job = flow.submit()
    try:
        def registered():
            readers = ray.get(registry.all.remote())
            return readers if len(readers) >= 4 else None

        readers = wait_for(registered, 60, "every reader, opened ahead, to register",
                           detail=lambda: sorted(ray.get(registry.all.remote())))
        sent: list[int] = []
        for i, (split_id, (address, host)) in enumerate(sorted(readers.items())):
            assert address.split_id == split_id and address.operator == "src" and address.index == i % 2
            for chunk in range(3):
                values = list(range(1000 * i + 10 * chunk, 1000 * i + 10 * chunk + 10))
                assert ray.get(host.feed_reader.remote("src", address.index, split_id, ("rows", values)))
                sent += values
            # to_reader takes the queued rows first, so the reader has all 30 when it is told to end
            answer = ray.get(host.to_reader.remote("src", address.index, split_id, ("end", None)))
            assert answer == "ended after 30"
        assert ray.get(host.to_reader.remote("src", 0, "no-such-split", ("end", None))) is None
        job.wait(timeout=60)
    finally:
        job.cancel()
        ray.kill(registry)
    assert sorted(job.result("out").column("x").to_pylist()) == sorted(sent)
