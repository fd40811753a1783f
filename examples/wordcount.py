"""Word count: split lines into words and count each word, the smallest complete dataflow.

Run it from a checkout with the package installed (``pip install -e .``)::

    python examples/wordcount.py

It starts a local Ray if none is running, deploys the job, and prints each
word with its count, the most frequent first.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

import chiray

LINES = ["to be or not to be", "that is the question"]


def tokenize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Every word of every line of ``batch``: one call per batch, vectorised with ``pyarrow.compute``."""
    words = pc.list_flatten(pc.split_pattern(batch.column("line"), " "))
    return pa.record_batch({"word": words})


def main() -> pa.Table:
    flow = chiray.Dataflow("wordcount")
    (flow.source(chiray.from_items([{"line": line} for line in LINES]), name="lines")
         .flat_map(tokenize, name="tokenize")        # a whole pyarrow.RecordBatch per call
         .key_by("word")                             # every row of one word goes to the same instance
         .count(parallelism=2, name="count",         # two instances share the words
                emit="final")                        # one row per word, when the input ends
         .sink(chiray.collect(), name="out"))        # committed output, handed to the driver at the end
    job = chiray.submit(flow)    # starts a local Ray if none is running, deploys the job, returns its handle
    job.wait(timeout=120)        # until the input is read and the last counts are committed
    counts = job.result("out").sort_by([("count", "descending"), ("word", "ascending")])
    print(counts.to_pandas().to_string(index=False))
    return counts


if __name__ == "__main__":
    main()
