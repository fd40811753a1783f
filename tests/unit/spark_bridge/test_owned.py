"""Job-owned Spark sources without Ray or Spark: what the factories accept, what they refuse, how they pickle."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("pyspark")

from chiray.operators import SideState, SourceSideStatus  # noqa: E402
from chiray.operators.sides import source_sides  # noqa: E402
from chiray.spark_bridge import SparkConfig, from_spark, from_spark_stream  # noqa: E402
from chiray.spark_bridge.owned import OwnedStagedSource  # noqa: E402
from chiray.spark_bridge.source import OwnedBatchSource  # noqa: E402
from chiray.spark_bridge.streaming import OwnedStreamSource  # noqa: E402


def build(spark):
    return spark.readStream.format("rate").load()


def test_a_build_function_makes_a_source_that_needs_no_driver_and_pickles_without_a_side():
    src = from_spark_stream(build, checkpoint_location="chk", spark=SparkConfig(master="local[1]"), name="ev")
    assert isinstance(src, OwnedStreamSource)
    assert src.driver_bound() is None and src.side() is None and src.schema() is None
    copy = pickle.loads(pickle.dumps(src))
    assert copy.describe() == "ev" and copy.read_ahead() == 1 and copy.bounded() is None
    ending = from_spark_stream(build, checkpoint_location="chk", trigger={"availableNow": True})
    assert ending.bounded() is True
    assert isinstance(from_spark(build), OwnedBatchSource)
    assert isinstance(from_spark(build, staged=True, path="stage/"), OwnedStagedSource)


def test_bad_build_arguments_are_named():
    with pytest.raises(ValueError, match="has one lane, got lanes=2"):
        from_spark_stream(build, checkpoint_location="chk", lanes=2)
    with pytest.raises(TypeError, match="spark must be a SparkConfig"):
        from_spark_stream(build, checkpoint_location="chk", spark={"master": "local"})
    with pytest.raises(TypeError, match="expected a streaming DataFrame, got int"):
        from_spark_stream(3, checkpoint_location="chk")
    with pytest.raises(TypeError, match="spark= goes with a build function"):
        from_spark(object(), spark=SparkConfig())
    with pytest.raises(ValueError, match="staged=True needs path="):
        from_spark(build, staged=True)


def test_spark_config_checks_its_fields():
    assert SparkConfig(remote="sc://host:15002").describe() == "sc://host:15002"
    assert SparkConfig(conf={"spark.sql.shuffle.partitions": 2}).conf == {"spark.sql.shuffle.partitions": "2"}
    with pytest.raises(ValueError, match="master or remote, not both"):
        SparkConfig(master="local[1]", remote="sc://h:1")
    with pytest.raises(ValueError, match="Spark Connect URL"):
        SparkConfig(remote="http://h:1")
    with pytest.raises(ValueError, match="cores must be a positive integer"):
        SparkConfig(cores=0)


def test_source_sides_lists_the_started_sides_and_a_status_reads_as_one_line():
    class Node:
        def __init__(self, name, source):
            self.name, self.source = name, source

    class Graph:
        nodes = {"a": Node("a", None), "b": Node("b", from_spark_stream(build, checkpoint_location="c"))}

    assert source_sides(Graph()) == []
    status = SourceSideStatus("events", "spark streaming query", SideState.RUNNING, "Waiting for data to arrive",
                              last_batch=7, input_rows_per_s=1200.0, rows_waiting=0)
    assert status.describe() == ("events (spark streaming query): RUNNING, batch 7, 1,200 rows/s in, 0 rows waiting, "
                                 "Waiting for data to arrive")
