"""The layering rule, enforced: imports only go down (operators <- control <- actors; spark_bridge -> operators)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
OURS = {"actors", "operators", "control", "spark_bridge"}
ALLOWED = {
    "operators": {"operators"},
    "control": {"control", "operators"},
    "actors": {"actors", "control", "operators"},
    "spark_bridge": {"spark_bridge", "operators"},
}
NO_RAY = {"operators", "control"}


def imports_of(path: pathlib.Path, package: str) -> set[str]:
    """Top-level names imported by a module, relative imports resolved to ``package``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add(package if node.level else (node.module or "").split(".")[0])
    return found


def modules():
    for package in sorted(ALLOWED):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


@pytest.mark.parametrize("package,path", list(modules()), ids=lambda v: str(v).split("chiray")[-1])
def test_no_upward_import(package, path):
    imported = imports_of(path, package)
    upward = (imported & OURS) - ALLOWED[package]
    assert not upward, f"{path.relative_to(ROOT)} ({package}) imports {sorted(upward)}: upward import"
    if package in NO_RAY:
        assert "ray" not in imported, f"{path.relative_to(ROOT)}: {package} must not import ray"


def test_checker_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from actors.job import submit\nimport ray\n")
    assert imports_of(bad, "operators") & OURS - ALLOWED["operators"] == {"actors"}
