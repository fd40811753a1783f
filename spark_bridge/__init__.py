"""spark_bridge: Spark DataFrames as replayable dataflow sources (to come; see the Spark bridge issue)."""

__all__: list[str] = []
