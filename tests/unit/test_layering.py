"""The layering rule, enforced: imports only go down, by name or by string, and the import graph has no cycle.

``chiray.operators`` <- ``chiray.control`` <- ``chiray.actors``; ``chiray.spark_bridge`` -> ``chiray.operators``;
only the ``chiray`` facade (``chiray/``) sits above them all. ``TYPE_CHECKING`` imports count.
"""

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
STRING_IMPORTERS = {"import_module", "__import__"}


def _module_name(path: pathlib.Path) -> str:
    """``actors/jobs/job.py`` -> ``chiray.actors.jobs.job``; ``chiray/cli.py`` -> ``chiray.cli``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "chiray" else ["chiray", *parts])


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute names of the modules a file imports: statements, ``importlib.import_module`` and ``__import__``."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # "from pkg import module"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in STRING_IMPORTERS and node.args and isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
    return found


def layer_of(name: str) -> str | None:
    """The layer of an absolute module name (``chiray.actors.jobs.job`` -> ``actors``), ``None`` outside chiray.

    A bare ``actors``/``operators``/... (the pre-``chiray`` names) counts as that layer too, so it is caught.
    """
    parts = name.split(".")
    if parts[0] == "chiray":
        return parts[1] if len(parts) > 1 and parts[1] in OURS else "chiray"
    return parts[0] if parts[0] in OURS else None


def modules():
    for package in sorted(ALLOWED):
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


@pytest.mark.parametrize("package,path", list(modules()), ids=lambda v: str(v).split("main")[-1])
def test_no_upward_import(package, path):
    imported = imported_modules(path)
    layers = {layer_of(name) for name in imported} - {None}
    upward = layers - ALLOWED[package]
    assert not upward, f"{path.relative_to(ROOT)} ({package}) imports {sorted(upward)}: upward import"
    bare = sorted(n for n in imported if n.split(".")[0] in OURS)
    assert not bare, f"{path.relative_to(ROOT)} imports {bare}: say chiray.{bare[0]}"
    if package in NO_RAY:
        assert not any(n == "ray" or n.startswith("ray.") for n in imported), \
            f"{path.relative_to(ROOT)}: {package} must not import ray"


def _graph() -> dict[str, set[str]]:
    files = [p for _, p in modules()] + sorted((ROOT / "chiray").rglob("*.py"))
    names = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for imported in imported_modules(path):
            # "from chiray.actors import job" names either a module or an attribute: keep it if it is a module
            while imported and imported not in names:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of nodes (first == last), or ``None``."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in colour and (cycle := visit(nxt)):
                return cycle
        colour[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in colour and (cycle := visit(node)):
            return cycle
    return None


def _is_package_init_edge(a: str, b: str) -> bool:
    """``pkg/__init__`` re-exporting its own submodule ``pkg.mod`` is not a cycle of the design."""
    return b.startswith(a + ".")


def test_import_graph_has_no_cycle():
    graph = {a: {b for b in targets if not _is_package_init_edge(a, b) and not _is_package_init_edge(b, a)}
             for a, targets in _graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_checker_catches_an_upward_import_by_name_or_string(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from chiray.actors.jobs.job import submit\nimport ray\nimport importlib\n"
                   "importlib.import_module('chiray.spark_bridge.demo')\n__import__('actors')\n")
    layers = {layer_of(n) for n in imported_modules_outside(bad)} - {None}
    assert layers == {"actors", "spark_bridge"}


def imported_modules_outside(path: pathlib.Path) -> set[str]:
    """``imported_modules`` for a file outside the tree (absolute imports only)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) in STRING_IMPORTERS:
                found.add(str(node.args[0].value))
    return found


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_runtime_never_imports_the_jobs_that_operate_it():
    """``chiray.actors.runtime`` (hosts, instances, channels) is below ``chiray.actors.jobs``: no module of the
    runtime imports one of jobs, by name, by string or under ``TYPE_CHECKING``."""
    runtime = ROOT / "actors" / "runtime"
    assert sorted(runtime.glob("*.py")), "actors/runtime is missing"
    for path in sorted(runtime.rglob("*.py")):
        upward = sorted(n for n in imported_modules(path) if n.startswith("chiray.actors.jobs"))
        assert not upward, f"{path.relative_to(ROOT)} imports {upward}: the runtime must not import jobs"
    top = [p for p in (ROOT / "actors").glob("*.py") if p.name != "__init__.py"]
    for path in top:  # the shared vocabulary at actors/ (config, errors) imports neither subpackage
        inner = sorted(n for n in imported_modules(path) if n.startswith(("chiray.actors.jobs", "chiray.actors.runtime")))
        assert not inner, f"{path.relative_to(ROOT)} imports {inner}: actors/{path.name} is below both subpackages"


@pytest.mark.parametrize("module", ["chiray", "chiray.operators", "chiray.control"])
def test_importing_the_description_layers_loads_no_ray(module):
    """A dataflow can be described (and its operators unit-tested) without Ray or pyspark installed or loaded."""
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted(m for m in ('ray', 'pyspark') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"import {module} loaded {out.strip()}"
