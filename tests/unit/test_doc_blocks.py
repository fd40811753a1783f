"""Every Python code block of README.md and the tutorial runs somewhere, and the commands shown parse.

A ```python block of ``README.md`` or ``docs/tutorial/*.md`` is one of:

* an include of an example, the one line ``--8<-- "examples/NAME.py"`` (or
  ``"examples/NAME.py:SECTION"``, a part marked ``# --8<-- [start:SECTION]``
  ... ``[end:SECTION]`` in the file): MkDocs shows the file
  (``pymdownx.snippets``), and ``tests/integration/test_examples.py`` runs it
  and checks its output;
* a fragment, whose first line is ``# fragment: ...`` (what it leaves out):
  compiled here, not run;
* a block this file runs: the README's quick start, on the in-process
  ``LocalRun`` harness instead of Ray.

A new block of any other kind fails ``test_every_python_block_is_included_run_or_a_fragment``.
"""

from __future__ import annotations

import collections
import contextlib
import io
import pathlib
import re
import shlex
from typing import Any

import pytest

import chiray
from chiray.actors.jobs.harness import LocalRun
from chiray.cli import build_parser
from chiray.operators import dataflow

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "tutorial").glob("*.md"))]
INCLUDE = re.compile(r'^--8<-- "(examples/[\w-]+\.py)(?::([\w-]+))?"$')
FRAGMENT = "# fragment:"
RUN_HERE = {("README.md", "import pyarrow as pa")}
"""The blocks this file runs, by page and first line."""


def blocks(page: pathlib.Path, language: str) -> list[tuple[int, str]]:
    """The fenced ``language`` blocks of ``page``: (line number of the fence, text)."""
    found, current, start = [], None, 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if current is None and line.strip() == f"```{language}":
            current, start = [], number
        elif current is not None and line.strip() == "```":
            found.append((start, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return found


def python_blocks() -> list[tuple[str, int, str]]:
    return [(page.relative_to(ROOT).as_posix(), line, text) for page in PAGES for line, text in blocks(page, "python")]


def test_every_python_block_is_included_run_or_a_fragment() -> None:
    stray = [f"{page}:{line}" for page, line, text in python_blocks()
             if not INCLUDE.match(text.strip()) and not text.startswith(FRAGMENT)
             and (page, text.splitlines()[0]) not in RUN_HERE]
    assert not stray, (f"python blocks that no test runs: {stray}; include an example (--8<-- \"examples/...\"), "
                       f"run the block in a test, or mark a fragment with a first line '{FRAGMENT} ...'")
    assert len([b for b in python_blocks() if (b[0], b[2].splitlines()[0]) in RUN_HERE]) == len(RUN_HERE)


def test_includes_name_existing_examples_and_sections() -> None:
    included = 0
    for page, line, text in python_blocks():
        match = INCLUDE.match(text.strip())
        if not match:
            continue
        path, section = ROOT / match.group(1), match.group(2)
        assert path.is_file(), f"{page}:{line}: {match.group(1)} does not exist"
        if section:
            source = path.read_text()
            for end in ("start", "end"):
                assert f"# --8<-- [{end}:{section}]" in source, f"{page}:{line}: no [{end}:{section}] in {path.name}"
        included += 1
    assert included >= 6


def test_fragments_compile() -> None:
    fragments = [(page, line, text) for page, line, text in python_blocks() if text.startswith(FRAGMENT)]
    for page, line, text in fragments:
        compile(text, f"{page}:{line}", "exec")
    assert len(fragments) <= 3, "keep fragments few: include an example or run the block instead"


class _LocalJob:
    """A job run to its end by the ``LocalRun`` harness in this process: ``wait`` and ``result`` as a ``Job``'s."""

    def __init__(self, flow: chiray.Dataflow) -> None:
        self.results = LocalRun(flow).run()

    def wait(self, timeout: float | None = None) -> None:
        pass

    def result(self, sink: str | None = None) -> Any:
        return self.results[sink] if sink is not None else next(iter(self.results.values()))


def test_readme_quick_start_prints_each_words_count(monkeypatch: pytest.MonkeyPatch) -> None:
    (text,) = [text for page, _, text in python_blocks() if (page, text.splitlines()[0]) in RUN_HERE]
    monkeypatch.setattr(dataflow, "_RUNTIME", lambda flow, **options: _LocalJob(flow))
    monkeypatch.setattr(chiray, "submit", lambda flow, **options: _LocalJob(flow))
    namespace: dict[str, Any] = {"__name__": "quick_start"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(text, "README.md quick start", "exec"), namespace)
    expected = collections.Counter(word for row in namespace["lines"] for word in row["line"].split(" "))
    printed = [line.split() for line in out.getvalue().strip().splitlines()]
    assert printed[0] == ["word", "count"]
    assert printed[1:] == [[w, str(n)] for w, n in sorted(expected.items(), key=lambda item: (-item[1], item[0]))]


def test_commands_shown_in_the_tutorial_parse() -> None:
    """Every ``$ chiray ...`` line of a tutorial page is a command the ``chiray`` parser accepts."""
    commands = [(page.name, line[2:]) for page in PAGES for _, text in blocks(page, "text") + blocks(page, "bash")
                for line in text.splitlines() if line.startswith("$ chiray ")]
    assert commands
    for page, command in commands:
        argv = shlex.split(command)[1:]
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: `{command}` does not parse")
