"""Every error class chiray defines is a ``ChirayError``, and keeps the built-in base callers catch it by."""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pickle

import pytest

import chiray
from chiray.operators.errors import ChirayError

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["operators", "control", "actors", "spark_bridge"]
OPTIONAL = {"chiray.spark_bridge.demo"}  # needs a Spark session at import


def _modules() -> list[str]:
    names = ["chiray", "chiray.cli", "chiray.cli_jobs"]
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            names.append(".".join(("chiray", *parts)))
    return [n for n in names if n not in OPTIONAL]


def _error_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name):
                found[f"{name}.{attr}"] = value
    return found


def test_every_error_class_in_the_packages_is_a_chiray_error():
    classes = _error_classes()
    assert len(classes) >= 15, sorted(classes)  # the walk found the packages' errors
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, ChirayError))
    assert not outside, f"not ChirayError subclasses: {outside}"


def test_the_facade_and_the_runtime_export_one_chiray_error():
    from chiray.actors.errors import ChirayError as from_actors

    assert chiray.ChirayError is from_actors is ChirayError


@pytest.mark.parametrize("cls, builtin", [
    (chiray.OpTimeoutError, TimeoutError), (chiray.OpFailedError, RuntimeError),
    (chiray.CheckpointError, RuntimeError), (chiray.RescaleError, RuntimeError),
    (chiray.JobNotFoundError, LookupError)])
def test_errors_keep_their_builtin_base_and_pickle(cls, builtin):
    error = cls("job 'wc': it went wrong")
    assert isinstance(error, ChirayError) and isinstance(error, builtin)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls and str(again) == str(error)
