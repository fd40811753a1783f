"""oracle.py: each NEXMark query's reference SQL (nexmark-flink's text in DuckDB's dialect), run by DuckDB.

The tables ``person``, ``auction`` and ``bid`` are views over the Parquet files that
``source.write_parquet`` wrote from the same events the chiray sources generate.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["SQL", "run_sql", "same_rows"]

SQL = {
    "q0": "SELECT auction, bidder, price, channel, url, date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908 AS price, date_time FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """
        SELECT P.name, P.city, P.state, A.id AS auction
        FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
        WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """
        SELECT Q.category, AVG(Q.final) AS mean FROM (
            SELECT MAX(B.price) AS final, A.category FROM auction A, bid B
            WHERE A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
            GROUP BY A.id, A.category) Q
        GROUP BY Q.category""",
    # HOP(date_time, 2 s, 10 s): each bid is in the five windows starting at the 2 s marks before it
    "q5": """
        WITH hop AS (SELECT auction, (epoch_ms(date_time) // 2000 - k) * 2000 AS start
                     FROM bid, range(5) AS r(k)),
             counts AS (SELECT auction, start, count(*) AS num FROM hop GROUP BY auction, start),
             maxn AS (SELECT start, max(num) AS maxn FROM counts GROUP BY start)
        SELECT C.auction, C.num, epoch_ms(C.start) AS window_start
        FROM counts C JOIN maxn M ON C.start = M.start AND C.num >= M.maxn""",
    # the window is [start, start + 10 s), as TUMBLE's (nexmark-flink bounds the join by the
    # window's rowtime instead, which lets a bid 1 ms before the window in)
    "q7": """
        SELECT B.auction, B.price, B.bidder, B.date_time, B.extra
        FROM bid B JOIN (SELECT max(price) AS maxprice, epoch_ms(date_time) // 10000 AS w
                         FROM bid GROUP BY w) M
          ON B.price = M.maxprice AND epoch_ms(B.date_time) // 10000 = M.w""",
    "q8": """
        SELECT P.id, P.name, epoch_ms(P.w * 10000) AS starttime
        FROM (SELECT id, name, epoch_ms(date_time) // 10000 AS w FROM person GROUP BY id, name, w) P
        JOIN (SELECT seller, epoch_ms(date_time) // 10000 AS w FROM auction GROUP BY seller, w) A
          ON P.id = A.seller AND P.w = A.w""",
}


def run_sql(query: str, paths: dict[str, str], threads: int = 1) -> pd.DataFrame:
    """DuckDB's answer to ``query`` over the Parquet files ``paths`` (kind -> file), on ``threads`` threads."""
    import duckdb  # the test extra; imported here so the queries need it only when checked

    con = duckdb.connect()
    try:
        con.execute(f"SET threads TO {int(threads)}")
        for kind, path in paths.items():
            escaped = path.replace("'", "''")
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM read_parquet('{escaped}')")
        return con.execute(SQL[query]).df()
    finally:
        con.close()


def _canonical(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            frame[column] = frame[column].astype("datetime64[ms]")
    return frame.sort_values(list(frame.columns), kind="stable").reset_index(drop=True)


def same_rows(got: pd.DataFrame, expected: pd.DataFrame, rtol: float = 1e-12) -> str | None:
    """``None`` if both hold the same rows in any order (floats within ``rtol``), else what differs."""
    if list(got.columns) != list(expected.columns):
        return f"columns {list(got.columns)} != {list(expected.columns)}"
    try:
        pd.testing.assert_frame_equal(_canonical(got), _canonical(expected), check_dtype=False, rtol=rtol)
    except AssertionError as exc:
        return str(exc)
    return None
