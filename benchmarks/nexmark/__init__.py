"""NEXMark on chiray: the generator, its source, the queries and their DuckDB oracles."""
