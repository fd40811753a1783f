"""The packages type-check with mypy and have no unused or undefined names (ruff's F rules)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["actors", "operators", "control", "spark_bridge"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def package_tree() -> pathlib.Path:
    """The folder that holds the package as installed, for mypy: ``.mypy_cache/src/chiray``, whose sub-packages
    link to the source folders.

    mypy cannot follow the editable install's import hook. The tree and mypy's caches stay at one place in
    the checkout (ignored by git), so a second run checks only what changed.
    """
    src = ROOT / ".mypy_cache" / "src"
    root = src / "chiray"
    root.mkdir(parents=True, exist_ok=True)
    links = {item.name: item for item in (ROOT / "chiray").iterdir() if item.suffix in (".py", ".typed")}
    links.update({package: ROOT / package for package in PACKAGES})
    for stale in root.iterdir():
        if stale.name not in links:
            stale.unlink(missing_ok=True)
    for name, target in links.items():
        link = root / name
        if not (link.is_symlink() and link.resolve() == target.resolve()):
            link.unlink(missing_ok=True)
            try:
                link.symlink_to(target, target_is_directory=target.is_dir())
            except FileExistsError:  # a test in another worker laid it out meanwhile
                pass
    return src


def test_mypy_is_clean():
    src = package_tree()
    done = subprocess.run([sys.executable, "-m", "mypy", "-p", "chiray", "--ignore-missing-imports",
                           "--no-error-summary", "--cache-dir", str(src.parent / "cache")],
                          cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_no_unused_or_undefined_names():
    done = run("ruff", "check", *PACKAGES, "chiray", "benchmarks", "tests", "--select", "F,E9", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_library_logs_instead_of_printing():
    """Only the command-line entry points print; everything a running job says goes to ``logging``."""
    import ast

    talkers = {"spark_bridge/demo.py",  # the demo command's own output
               "operators/callsinks.py"}  # the print sink (Stream.print()): printing is its job
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in talkers:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    found.append(f"{rel}:{node.lineno}")
    assert not found, f"print() in library code (use logging): {found}"
