"""Command-line progress: redrawn in place on a terminal, one line per state elsewhere."""

from __future__ import annotations

import io

from chiray.progress import Progress


def _run(progress: Progress) -> None:
    for i in range(100):
        progress.update(f"bar {i}%", "RUNNING" if i < 90 else "COMMITTING")
    progress.end("bar 100%", "DONE")


def test_a_terminal_gets_the_bar_redrawn_on_one_line():
    out = io.StringIO()
    _run(Progress(out, tty=True))
    text = out.getvalue()
    assert text.count("\r") == 101 and text.count("\n") == 1 and text.endswith("\rbar 100%\n")


def test_a_log_gets_one_line_per_state():
    out = io.StringIO()  # not a terminal: isatty() is False
    _run(Progress(out))
    assert out.getvalue().splitlines() == ["bar 0%", "bar 90%", "bar 100%"]
