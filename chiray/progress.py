"""progress.py: progress on the command line: a bar redrawn in place on a terminal, else one line per state.

On a terminal a bar is redrawn on one line (``\\r``) at each poll. Written to a
file, a pipe or a CI log, the same redraws would be hundreds of lines, so
there a line is printed only when the state changes (as pip, cargo and docker
do), and the last one when it ends.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> progress = Progress(out)
    >>> for state in ("PLANNING", "MIGRATING", "MIGRATING", "MIGRATING"):
    ...     progress.update(f"[#...] {state}", state)
    >>> progress.end("[####] DONE", "DONE")
    >>> out.getvalue().splitlines()
    ['[#...] PLANNING', '[#...] MIGRATING', '[####] DONE']
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Progress output to ``stream`` (default ``sys.stdout``): in place on a terminal, else per state.

    Args:
        stream: where to write.
        tty: whether it is a terminal (default: ``stream.isatty()``).
    """

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty()) if tty is None and isatty is not None else bool(tty)
        self._state: str | None = None

    def update(self, text: str, state: str) -> None:
        """Show ``text``: redrawn in place on a terminal; elsewhere a line only if ``state`` changed."""
        if self.tty:
            self.stream.write(f"\r{text}")
        elif state != self._state:
            self.stream.write(f"{text}\n")
        self._state = state
        self.stream.flush()

    def end(self, text: str, state: str) -> None:
        """The last ``text``: ends the line on a terminal; elsewhere a line unless it repeats the last one."""
        if self.tty:
            self.stream.write(f"\r{text}\n")
        elif state != self._state:
            self.stream.write(f"{text}\n")
        self._state = state
        self.stream.flush()
