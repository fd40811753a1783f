"""oracle.py: each NEXMark query's reference SQL (nexmark-flink's text in DuckDB's dialect), run by DuckDB.

The tables ``person``, ``auction`` and ``bid`` are views over the Parquet files that
``source.write_parquet`` wrote from the same events the chiray sources generate.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["SQL", "run_sql"]

SQL = {
    "q0": "SELECT auction, bidder, price, channel, url, date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908 AS price, date_time FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """
        SELECT P.name, P.city, P.state, A.id AS auction
        FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
        WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
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
