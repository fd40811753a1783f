"""schema.py: the strict mapping from a Spark schema to the Arrow schema of the dataflow's batches.

Every Spark type the bridge accepts maps to exactly one Arrow type, so the
batches the dataflow sees never depend on Spark's Arrow settings (large
string types, the session time zone). Anything else is refused when the
source is built, with the field's path and type named.

Example:
    >>> from pyspark.sql.types import StructType, StructField, StringType, LongType
    >>> to_arrow_schema(StructType([StructField("k", StringType()), StructField("v", LongType(), False)]))
    k: string
    v: int64 not null
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from chiray.operators.errors import ChirayError

__all__ = ["UnsupportedSparkType", "conform", "to_arrow_schema"]


class UnsupportedSparkType(ChirayError, TypeError):
    """A column has a Spark type the bridge does not hand to the dataflow."""


def _scalar(t: Any) -> pa.DataType | None:
    from pyspark.sql import types as st

    simple: list[tuple[type, pa.DataType]] = [
        (st.BooleanType, pa.bool_()),
        (st.ByteType, pa.int8()),
        (st.ShortType, pa.int16()),
        (st.IntegerType, pa.int32()),
        (st.LongType, pa.int64()),
        (st.FloatType, pa.float32()),
        (st.DoubleType, pa.float64()),
        (st.StringType, pa.string()),
        (st.BinaryType, pa.binary()),
        (st.DateType, pa.date32()),
        (st.TimestampNTZType, pa.timestamp("us")),
        (st.TimestampType, pa.timestamp("us", tz="UTC")),
    ]
    for spark_type, arrow_type in simple:
        if type(t) is spark_type:
            return arrow_type
    if isinstance(t, st.DecimalType):
        return pa.decimal128(t.precision, t.scale)
    return None


def _arrow_type(t: Any, path: str) -> pa.DataType:
    from pyspark.sql import types as st

    found = _scalar(t)
    if found is not None:
        return found
    if isinstance(t, st.ArrayType):
        return pa.list_(pa.field("element", _arrow_type(t.elementType, f"{path}[]"), t.containsNull))
    if isinstance(t, st.StructType):
        return pa.struct([_arrow_field(f, f"{path}.{f.name}") for f in t.fields])
    raise UnsupportedSparkType(
        f"from_spark: column {path!r} has Spark type {t.simpleString()}, which the bridge does not support "
        "(supported: boolean, tinyint, smallint, int, bigint, float, double, string, binary, date, "
        "timestamp, "
        "timestamp_ntz, decimal, and arrays and structs of these); cast or drop it in Spark first"
    )


def _arrow_field(f: Any, path: str) -> pa.Field:
    return pa.field(f.name, _arrow_type(f.dataType, path), f.nullable)


def to_arrow_schema(spark_schema: Any) -> pa.Schema:
    """The Arrow schema of the batches the dataflow receives for a Spark ``StructType``.

    Timestamps become ``timestamp[us, tz=UTC]`` (the instant, whatever the
    session time zone), ``timestamp_ntz`` a zone-less ``timestamp[us]``, strings
    ``string`` (never ``large_string``).

    Raises:
        UnsupportedSparkType: a column (or nested field) has a type outside the
            mapping; the message names its path and Spark type.
    """
    names = [f.name for f in spark_schema.fields]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"from_spark: duplicate column names {dup}; alias them in Spark first")
    return pa.schema([_arrow_field(f, f.name) for f in spark_schema.fields])


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to ``schema`` (Spark's Arrow output may use large types or another time zone).

    Raises:
        TypeError: the columns or a type do not match, naming the column.
    """
    if batch.schema.equals(schema):
        return batch
    if batch.schema.names != schema.names:
        raise TypeError(f"from_spark: Spark sent columns {batch.schema.names}, expected {schema.names}")
    columns = []
    for name, column, field in zip(schema.names, batch.columns, schema):
        try:
            columns.append(column.cast(field.type) if not column.type.equals(field.type) else column)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise TypeError(
                f"from_spark: column {name!r} arrived as {column.type}, expected {field.type}: {e}"
            ) from e
    return pa.RecordBatch.from_arrays(columns, schema=schema)
