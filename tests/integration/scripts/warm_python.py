"""One Python process, connected once to the Ray cluster at RAY_ADDRESS, that runs what a test would otherwise
start as many short processes: ``python -m MODULE ARGS``, ``python SCRIPT ARGS`` and ``python -c CODE``.

Usage: python warm_python.py, then one JSON request a line on stdin, ``{"argv": ["-m", "chiray", "list"]}``
(or ``["path/to/script.py", ...]``, ``["-c", "code"]``); for each it answers one JSON line on stdout,
``{"returncode": N, "stdout": "...", "stderr": "..."}``: what the request printed, and its exit code as Python
gives it (``sys.exit``'s code, 1 for an uncaught exception, with its traceback on stderr). The first line it
answers is ``{"ready": true}``, once connected. It exits at the end of its input.

Each request runs as ``__main__`` in this process, with its own ``sys.argv`` and ``sys.path`` (as Python sets
them for such a command; what the request adds to ``sys.path`` goes with it): the modules it imports stay
imported and Ray stays connected (``chiray.actors.jobs.client.connect``, as ``chiray``'s verbs connect), so a
script's ``ray.init`` is skipped where Ray is connected already. Ray's own output (its C++ core, its logging
handlers) goes to this process's stderr, not into a request's answer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback


def run(argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_path = sys.argv, list(sys.path)
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if argv[0] == "-m":
                sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()  # runpy puts its path in argv[0]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            elif argv[0] == "-c":
                sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # as Python reports an uncaught exception, and exits 1
            traceback.print_exc()
            code = 1
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, exit code 1
        err.write(f"{code}\n")
        code = 1
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else written to fd 1 (Ray's core, a stray print) goes to stderr, not to the answers
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)

    from chiray.actors.jobs.client import connect

    connect()
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if line.strip():
            answers.write(json.dumps(run(json.loads(line)["argv"])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
