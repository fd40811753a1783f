"""spark.py: the NEXMark queries Spark Structured Streaming runs, on the same events, for rates.

Each kind's Parquet file is a file-stream source (``readStream.parquet`` over a folder);
a query's SQL (Spark's dialect) runs as a streaming query into the ``noop`` sink with
``trigger(availableNow=True)``: it reads everything there is and stops. The time from
start to termination, on a session that is already up, gives ``spark_events_per_s``.

Spark runs the stateless queries (q0, q1, q2, q10, q14, q21, q22) and q3, a stream-stream
inner join. The others use what Spark's streaming SQL refuses or cannot say alike:
chained aggregations (q4, q5, q6, q7, q9, q15-q17 in append mode), session windows
grouped further, row numbers over a partition (q18, q19), a windowed join whose result
is aggregated (q8); they report ``null``.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

SPARK_SQL = {
    "q0": "SELECT auction, bidder, price, channel, url, date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908 AS price, date_time FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id AS auction
             FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
             WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q10": """SELECT auction, bidder, price, date_time, extra, date_format(date_time, 'yyyy-MM-dd') AS dt,
                     date_format(date_time, 'HH:mm') AS hm FROM bid""",
    "q14": """SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908 AS price,
                     CASE WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime'
                          WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime'
                          ELSE 'otherTime' END AS bid_time_type,
                     date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts
              FROM bid WHERE CAST(price AS DOUBLE) * 0.908 > 1000000 AND CAST(price AS DOUBLE) * 0.908 < 50000000""",
    "q21": """SELECT auction, bidder, price, channel,
                     CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
                          WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
                          ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
              FROM bid WHERE url RLIKE '(&|^)channel_id=([^&]*)'
                          OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
    "q22": """SELECT auction, bidder, price, channel, try_element_at(split(url, '/'), 4) AS dir1,
                     try_element_at(split(url, '/'), 5) AS dir2, try_element_at(split(url, '/'), 6) AS dir3 FROM bid""",
}


def stream_folders(paths: dict[str, str]) -> dict[str, str]:
    """A folder per kind holding (a hard link to) its Parquet file: what a file-stream source reads."""
    folders = {}
    for kind, path in paths.items():
        folder = os.path.join(os.path.dirname(path), f"stream-{kind}")
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, os.path.basename(path))
        if not os.path.exists(target):
            os.link(path, target)
        folders[kind] = folder
    return folders


def tables(sql: str) -> list[str]:
    """The streams a query reads (``FROM`` and ``JOIN``), each a view over its file-stream source."""
    return sorted(set(re.findall(r"\b(?:FROM|JOIN)\s+(\w+)", sql, flags=re.IGNORECASE)))


def spark_rate(spark: Any, query: str, folders: dict[str, str], num_events: int) -> float | None:
    """Events per second of ``query`` on Spark Structured Streaming, or ``None`` if Spark does not run it."""
    sql = SPARK_SQL.get(query)
    if sql is None:
        return None
    for kind in tables(sql):  # only those it reads: each schema costs Spark a job
        folder = folders[kind]
        schema = spark.read.parquet(folder).schema
        spark.readStream.schema(schema).parquet(folder).createOrReplaceTempView(kind)
    started = time.perf_counter()
    running = (spark.sql(sql).writeStream.format("noop").outputMode("append")
               .option("checkpointLocation", os.path.join(os.path.dirname(next(iter(folders.values()))),
                                                          f"spark-checkpoint-{query}-{time.time_ns()}"))
               .trigger(availableNow=True).start())
    running.awaitTermination()
    return num_events / (time.perf_counter() - started)
