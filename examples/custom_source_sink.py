"""A source and a sink of your own: sensor readings in, a CSV file per sink instance out, exactly once.

Run it with ``python examples/custom_source_sink.py``.

A source is a set of *splits* (here, one per sensor), each read batch by batch
from an *offset* that a checkpoint records, so that a job restarted from the
checkpoint reads on exactly where it stopped. A sink has one writer per sink
instance: at each checkpoint barrier it *stages* what it was given (here, a
hidden file), and the sink *commits* the staged output (renames the file) once
the checkpoint is durable. The classes travel to the Ray processes with the
dataflow, pickled; a class defined in the script travels by value.
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.csv as csv

import chiray
from chiray.operators import InstanceInfo

SENSORS, READINGS = 4, 500
SCHEMA = pa.schema([("sensor", pa.string()), ("reading", pa.int64()), ("celsius", pa.float64())])


def celsius(sensor: int, reading: int) -> float:
    """A sensor's reading in degrees: made up, but the same each time it is read (a replay must be)."""
    return 15.0 + 2 * sensor + (reading * (sensor + 3)) % 47 / 10


class SensorReader(chiray.SplitReader):
    """Reads one sensor's readings; its offset is the number of readings read so far."""

    def __init__(self, sensor: int, offset: int, batch_size: int) -> None:
        self.sensor, self.next, self.batch_size = sensor, offset, batch_size

    def read(self) -> pa.RecordBatch | None:
        if self.next >= READINGS:
            return None                                    # the split is done
        numbers = range(self.next, min(self.next + self.batch_size, READINGS))
        self.next = numbers.stop
        return pa.record_batch([pa.array([f"s{self.sensor}"] * len(numbers)), pa.array(numbers, pa.int64()),
                                pa.array([celsius(self.sensor, n) for n in numbers])], schema=SCHEMA)

    def offset(self) -> int:
        return self.next                                   # where a restore resumes this split


class SensorSource(chiray.Source):
    """One split per sensor; split ``i`` goes to source instance ``i % parallelism``."""

    def __init__(self, batch_size: int = 100) -> None:
        self.batch_size = batch_size

    def schema(self) -> pa.Schema:
        return SCHEMA

    def splits(self) -> list[chiray.SourceSplit]:          # called once, on the driver, at submit()
        return [chiray.SourceSplit(f"sensor-{i}", i) for i in range(SENSORS)]

    def open_split(self, split: chiray.SourceSplit, offset: Any = None) -> chiray.SplitReader:  # in a host
        return SensorReader(split.payload, offset or 0, self.batch_size)

    def bounded(self) -> bool:
        return True                                        # it ends: emit="final" aggregations are fine


class CsvWriter(chiray.SinkWriter):
    """One sink instance: keeps the batches it is given, stages them as a hidden CSV file at each barrier."""

    def __init__(self, directory: str, prefix: str) -> None:
        self.directory, self.prefix = directory, prefix
        self.batches: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def prepare_commit(self, epoch: Any) -> str | None:
        if not self.batches:
            return None
        path = os.path.join(self.directory, f".{self.prefix}-{epoch}.csv")
        csv.write_csv(pa.Table.from_batches(self.batches), path)   # durable before the checkpoint completes
        self.batches = []
        return path                                        # for Sink.commit, once the checkpoint is durable

    def finish(self) -> str | None:                        # end of input: stage the rest
        return self.prepare_commit("end")

    def abort(self) -> None:                               # the job failed or was cancelled
        self.batches = []


class CsvSink(chiray.Sink):
    """CSV files in ``directory``, visible (renamed without their leading dot) once committed."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def create_writer(self, info: InstanceInfo) -> chiray.SinkWriter:   # called in the sink instance's host
        os.makedirs(self.directory, exist_ok=True)
        return CsvWriter(self.directory, f"part-{info.index}")

    def commit(self, staged: Iterable[str | None]) -> list[str]:
        done = []
        for path in filter(None, staged):
            final = os.path.join(os.path.dirname(path), os.path.basename(path)[1:])
            if os.path.exists(path):                       # a commit may be repeated: it must be idempotent
                os.replace(path, final)
            done.append(final)
        return done

    def combine(self, results: Iterable[Any]) -> list[str]:      # the job's result(): the committed files
        return sorted(glob.glob(os.path.join(self.directory, "part-*.csv")))


def main() -> pa.Table:
    out = os.path.join(tempfile.mkdtemp(), "out")
    flow = chiray.Dataflow("sensors")
    (flow.source(SensorSource(), parallelism=2, name="readings")
         .key_by("sensor")
         .agg(readings=(None, "count"), mean=("celsius", "mean"), hottest=("celsius", "max"), emit="final",
              parallelism=2, name="per_sensor")
         .sink(CsvSink(out), name="csv"))
    job = chiray.submit(flow, checkpoint_interval_s=1)
    job.wait(timeout=120)
    files = job.result("csv")
    table = pa.concat_tables([csv.read_csv(path) for path in files]).sort_by("sensor")
    print(len(files), "files:", [os.path.basename(path) for path in files])
    print(table.to_pandas().to_string(index=False))
    return table


if __name__ == "__main__":
    main()
