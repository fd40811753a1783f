"""oracle.py: each NEXMark query's reference SQL (nexmark-flink's text in DuckDB's dialect), run by DuckDB.

The tables ``person``, ``auction`` and ``bid`` are views over the Parquet files that
``source.write_parquet`` wrote from the same events the chiray sources generate.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["SQL", "run_sql", "same_rows"]

_RANKED = """count(*) AS total_bids,
        count(*) FILTER (WHERE price < 10000) AS rank1_bids,
        count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
        count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
        count(DISTINCT bidder) AS total_bidders,
        count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
        count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
        count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
        count(DISTINCT auction) AS total_auctions,
        count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
        count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
        count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"""

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
    "q6": """
        WITH winners AS (
            SELECT A.id, A.seller, A.expires, max(B.price) AS price FROM auction A JOIN bid B
              ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires
            GROUP BY A.id, A.seller, A.expires)
        SELECT seller, avg(price) OVER (PARTITION BY seller ORDER BY expires, id
                                        ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
        FROM winners""",
    "q9": """
        SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category, extra,
               auction, bidder, price, bid_date_time, bid_extra FROM (
            SELECT A.*, B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS bid_extra,
                   row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.date_time ASC) AS rownum
            FROM auction A JOIN bid B ON A.id = B.auction AND B.date_time BETWEEN A.date_time AND A.expires)
        WHERE rownum <= 1""",
    "q19": """
        SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC, date_time ASC)
                                 AS rank_number FROM bid)
        WHERE rank_number <= 10""",
    "q10": """SELECT auction, bidder, price, date_time, extra, strftime(date_time, '%Y-%m-%d') AS dt,
                     strftime(date_time, '%H:%M') AS hm FROM bid""",
    # sessions: a bid 10 s or more after the bidder's previous one starts a new session
    "q11": """
        WITH marked AS (
            SELECT bidder, date_time,
                   CASE WHEN epoch_ms(date_time) - epoch_ms(lag(date_time) OVER w) < 10000 THEN 0 ELSE 1 END AS new
            FROM bid WINDOW w AS (PARTITION BY bidder ORDER BY date_time)),
        numbered AS (SELECT bidder, date_time, sum(new) OVER (PARTITION BY bidder ORDER BY date_time
                                                               ROWS UNBOUNDED PRECEDING) AS s FROM marked)
        SELECT bidder, count(*) AS bid_count, min(date_time) AS starttime,
               max(date_time) + INTERVAL 10 SECOND AS endtime
        FROM numbered GROUP BY bidder, s""",
    "q13": """
        WITH side AS (SELECT range AS key, 'side-' || ((range * 7919) % 10007)::VARCHAR AS value FROM range(10000))
        SELECT B.auction, B.bidder, B.price, B.date_time, S.value FROM bid B JOIN side S ON B.auction % 10000 = S.key""",
    "q14": """
        SELECT auction, bidder, CAST(price AS DOUBLE) * 0.908 AS price,
               CASE WHEN hour(date_time) >= 8 AND hour(date_time) <= 18 THEN 'dayTime'
                    WHEN hour(date_time) <= 6 OR hour(date_time) >= 20 THEN 'nightTime'
                    ELSE 'otherTime' END AS bid_time_type,
               date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts
        FROM bid WHERE CAST(price AS DOUBLE) * 0.908 > 1000000 AND CAST(price AS DOUBLE) * 0.908 < 50000000""",
    "q15": """
        SELECT strftime(date_time, '%Y-%m-%d') AS day, """ + _RANKED + """ FROM bid GROUP BY day""",
    "q16": """
        SELECT channel, strftime(date_time, '%Y-%m-%d') AS day, max(strftime(date_time, '%H:%M')) AS minute,
               """ + _RANKED + """ FROM bid GROUP BY channel, day""",
    "q17": """
        SELECT auction, strftime(date_time, '%Y-%m-%d') AS day, count(*) AS total_bids,
               count(*) FILTER (WHERE price < 10000) AS rank1_bids,
               count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
               count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
               min(price) AS min_price, max(price) AS max_price, sum(price) // count(*) AS avg_price,
               sum(price) AS sum_price
        FROM bid GROUP BY auction, day""",
    "q18": """
        SELECT auction, bidder, price, channel, url, date_time, extra FROM (
            SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS rank_number
            FROM bid) WHERE rank_number <= 1""",
    "q20": """
        SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time AS bid_date_time, B.extra AS bid_extra,
               A.item_name, A.description, A.initial_bid, A.reserve, A.date_time AS auction_date_time, A.expires,
               A.seller, A.category, A.extra AS auction_extra
        FROM bid B JOIN auction A ON B.auction = A.id WHERE A.category = 10""",
    "q21": """
        SELECT auction, bidder, price, channel,
               CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
                    WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
                    ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
        FROM bid
        WHERE regexp_matches(url, '(&|^)channel_id=([^&]*)')
           OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
    "q22": """
        SELECT auction, bidder, price, channel, string_split(url, '/')[4] AS dir1,
               string_split(url, '/')[5] AS dir2, string_split(url, '/')[6] AS dir3 FROM bid""",
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
        elif pd.api.types.is_string_dtype(frame[column]) or frame[column].dtype == object:
            values = frame[column].astype(object)  # one form for text, whatever missing values look like
            frame[column] = values.where(values.notna(), None)
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
