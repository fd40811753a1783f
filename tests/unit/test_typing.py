"""The types a user's IDE and type checker see: user code type-checks with ``mypy --strict``.

``typing_cases/streams.py`` is typical user code (a word count, windows then ``map``/``top``/``sink``, a
window join, ``agg`` with 3-tuples, ``submit`` and its handle, ``process``/``on_timer`` callbacks with typed
state, the Spark names), with ``assert_type`` where a verb's result type matters; it and ``examples/`` must
pass. ``typing_cases/bad.py`` is misuse: it must fail with exactly the errors its lines mark, so that the
check cannot pass by checking nothing.
"""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import subprocess
import sys

from tests.unit.test_static import ROOT, package_tree

CASES = pathlib.Path(__file__).resolve().parent / "typing_cases"
EXAMPLES = ROOT / "examples"
ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<message>.*?)\s+\[(?P<code>[a-z-]+)\]$")
MARK = re.compile(r"#\s*error:\s*(?P<code>[a-z-]+)")


def mypy_strict(files: list[pathlib.Path]) -> subprocess.CompletedProcess[str]:
    """``mypy --strict`` over ``files``, importing the package as installed (its own modules are not checked
    strictly: only how the files use them), with a cache of its own beside ``test_static``'s."""
    src = package_tree()
    env = dict(os.environ, MYPYPATH=str(src))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--ignore-missing-imports",
         "--python-version", "3.10", "--no-error-summary", "--show-error-codes", "--hide-error-context",
         "--cache-dir", str(src.parent / "strict-cache"), *map(str, files)],
        cwd=src, env=env, capture_output=True, text=True, timeout=300)


def errors_by_file(output: str) -> dict[str, set[tuple[int, str]]]:
    found: dict[str, set[tuple[int, str]]] = {}
    for line in output.splitlines():
        match = ERROR.match(line)
        if match:
            found.setdefault(pathlib.Path(match["file"]).name, set()).add((int(match["line"]), match["code"]))
    return found


def marked_errors(path: pathlib.Path) -> set[tuple[int, str]]:
    return {(number, match["code"]) for number, text in enumerate(path.read_text().splitlines(), 1)
            if (match := MARK.search(text))}


def test_user_code_type_checks_strictly_and_misuse_does_not() -> None:
    good = [CASES / "streams.py", *sorted(EXAMPLES.glob("*.py"))]
    bad = CASES / "bad.py"
    done = mypy_strict([*good, bad])
    assert not done.stderr.strip(), done.stderr
    found = errors_by_file(done.stdout)
    unparsed = [line for line in done.stdout.splitlines() if ": error: " in line and not ERROR.match(line)]
    assert not unparsed, "\n".join(unparsed)
    clean = {path.name: sorted(found[path.name]) for path in good if path.name in found}
    assert not clean, f"mypy --strict finds errors in user code:\n{done.stdout}"
    expected = marked_errors(bad)
    assert len(expected) >= 10, "bad.py lost its marks"
    assert found.get(bad.name, set()) == expected, (
        f"bad.py: expected errors {sorted(expected)}, mypy found {sorted(found.get(bad.name, set()))}:\n"
        f"{done.stdout}")


def test_the_handle_of_flow_submit_has_every_verb_of_job_handle() -> None:
    """``Dataflow.submit`` returns ``operators.handles.JobLike``, the job handle as the operators layer can name
    it: the verbs of ``chiray.JobHandle`` with the same parameters (a new verb goes into both)."""
    from chiray.actors.jobs.handle import VERBS, JobHandle
    from chiray.operators.handles import JobLike

    mine = [name for name, value in vars(JobLike).items() if callable(value) and not name.startswith("_")]
    assert mine == list(VERBS)
    for verb in VERBS:
        assert (list(inspect.signature(getattr(JobLike, verb)).parameters.values())
                == list(inspect.signature(getattr(JobHandle, verb)).parameters.values())), verb
