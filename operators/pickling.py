"""pickling.py: say which object of a dataflow cannot be sent to the workers, and where it is referred to.

A dataflow travels to its hosts pickled (cloudpickle): every user function,
with what it refers to (closure variables, globals, default arguments), goes
along. When something in there cannot be pickled (a lock, an open file, a
client connection), the serialiser's own error prints the whole plan; this
module finds the operator and the object instead.

Example:
    >>> import threading
    >>> lock = threading.Lock()
    >>> path, obj, _ = find_unpicklable(lambda b: (lock, b))
    >>> path, type(obj).__name__
    ("closure variable 'lock'", 'lock')
"""

from __future__ import annotations

import types
from typing import Any

import cloudpickle

from .errors import ChirayError
from .graph import LogicalGraph

__all__ = ["find_unpicklable", "UnpicklableError", "check_picklable"]

_MAX_DEPTH = 6


class UnpicklableError(ChirayError, TypeError):
    """Part of a dataflow cannot be pickled, so it cannot reach the workers."""


def _pickles(obj: Any) -> Exception | None:
    try:
        cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - any failure of the serialiser is the answer
        return exc
    return None


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """What ``obj`` refers to that a pickle of it carries, each with a name for messages."""
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        parts = [(f"closure variable {name!r}", cell.cell_contents)
                 for name, cell in zip(code.co_freevars, obj.__closure__ or ()) if _filled(cell)]
        parts += [(f"global {name!r}", obj.__globals__[name]) for name in _global_names(code)
                  if name in obj.__globals__ and not isinstance(obj.__globals__[name], types.ModuleType)]
        parts += [(f"default argument {i}", value) for i, value in enumerate(obj.__defaults__ or ())]
        return parts
    if isinstance(obj, types.MethodType):
        return [("the object of method " + obj.__func__.__name__, obj.__self__)]
    if isinstance(obj, dict):
        return [(f"item {key!r}", value) for key, value in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"item {i}", value) for i, value in enumerate(obj)]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return [(f"attribute {name!r}", value) for name, value in state.items()]
    slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())]
    return [(f"attribute {s!r}", getattr(obj, s)) for s in slots if hasattr(obj, s)]


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return list(dict.fromkeys(names))


def find_unpicklable(obj: Any) -> tuple[str, Any, Exception] | None:
    """The innermost part of ``obj`` that does not pickle: ``(path, part, error)``, or ``None`` if all pickles.

    The path names the closure variables, globals, attributes and items that lead to it.
    """
    error = _pickles(obj)
    if error is None:
        return None
    path: list[str] = []
    current, depth = obj, 0
    seen = {id(obj)}
    while depth < _MAX_DEPTH:
        for name, part in _parts(current):
            if id(part) in seen:
                continue
            part_error = _pickles(part)
            if part_error is not None:
                seen.add(id(part))
                path.append(name)
                current, error = part, part_error
                break
        else:
            break
        depth += 1
    return " -> ".join(path) or "the object itself", current, error


def check_picklable(graph: LogicalGraph) -> None:
    """Refuse a dataflow with a part that cannot be pickled, naming the operator and the object first.

    Raises:
        UnpicklableError: for the first operator whose function, source or sink does not pickle.
    """
    for node in graph.nodes.values():
        for what, obj in (("source", node.source), ("sink", node.sink), ("function", node.make_logic)):
            if obj is None:
                continue
            found = find_unpicklable(obj)
            if found is None:
                continue
            path, part, error = found
            origin = f" ({node.origin})" if node.origin else ""
            # the runtime's own wrapper (make_logic's lambda) leads to the user's function: name from there on
            steps = [s for s in path.split(" -> ") if s not in ("closure variable 'fn'", "closure variable 'make'")]
            where = " -> ".join(steps) or f"its {what}"
            raise UnpicklableError(
                f"operator {node.name!r}{origin}: its {what} refers to {where}, a {type(part).__module__}."
                f"{type(part).__qualname__}, which cannot be pickled to reach the workers ({error}). "
                f"Create it inside the function, or in the open() of a source or sink, instead of capturing it")
