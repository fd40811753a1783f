"""test_docs.py: the documentation site builds with warnings as errors (``mkdocs build --strict``).

A page that links to a missing page or anchor, an API reference block
(``::: chiray...``) naming something that no longer exists, a cross-reference
that resolves to nothing, or a docstring whose arguments do not match its
signature fails the build, and so this test.
"""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None
                    or importlib.util.find_spec("mkdocstrings_handlers") is None,
                    reason="mkdocs and mkdocstrings[python] are not installed (pip install -e '.[docs]')")
def test_docs_build_strict(tmp_path: pathlib.Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )
    problems = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    detail = "\n".join(problems) or done.stderr[-4000:]
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{detail}"
    assert (site / "index.html").is_file()
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "chiray rescale" in cli, "the CLI reference was not generated from the parser"
