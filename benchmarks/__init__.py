"""benchmarks: runnable measurements; each ends with one JSON line."""
