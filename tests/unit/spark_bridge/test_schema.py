"""The strict Spark -> Arrow schema mapping (pyspark types only; no JVM)."""

from __future__ import annotations

import pyarrow as pa
import pytest

st = pytest.importorskip("pyspark.sql.types")

from chiray.spark_bridge.schema import UnsupportedSparkType, conform, to_arrow_schema


def test_supported_types_map_to_one_arrow_type_each():
    spark = st.StructType(
        [
            st.StructField("k", st.StringType()),
            st.StructField("n", st.IntegerType(), False),
            st.StructField("ts", st.TimestampType()),
            st.StructField("d", st.DecimalType(12, 3)),
            st.StructField("tags", st.ArrayType(st.StringType())),
            st.StructField("pt", st.StructType([st.StructField("x", st.DoubleType())])),
        ]
    )
    assert to_arrow_schema(spark) == pa.schema(
        [
            pa.field("k", pa.string()),
            pa.field("n", pa.int32(), False),
            pa.field("ts", pa.timestamp("us", tz="UTC")),
            pa.field("d", pa.decimal128(12, 3)),
            pa.field("tags", pa.list_(pa.field("element", pa.string()))),
            pa.field("pt", pa.struct([pa.field("x", pa.float64())])),
        ]
    )


def test_unsupported_types_are_named_with_their_path():
    spark = st.StructType(
        [
            st.StructField(
                "pt", st.StructType([st.StructField("m", st.MapType(st.StringType(), st.LongType()))])
            )
        ]
    )
    with pytest.raises(UnsupportedSparkType, match=r"'pt\.m' has Spark type map<string,bigint>"):
        to_arrow_schema(spark)


def test_conform_normalises_spark_arrow_output():
    schema = pa.schema([("k", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["a"], pa.large_string()), pa.array([1], pa.timestamp("us", tz="Europe/Paris"))],
        names=["k", "ts"],
    )
    assert conform(batch, schema).schema == schema
    with pytest.raises(TypeError, match=r"columns \['x'\], expected \['k', 'ts'\]"):
        conform(pa.RecordBatch.from_pydict({"x": [1]}), schema)
