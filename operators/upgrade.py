"""upgrade.py: an operator's code replaced while it runs: the new code as a value, its checks, state migration and
the canary trial.

Pure: the runtime (``actors/``) swaps the code at an instance when the upgrade's control op
(``control.ops.upgrade``) completes there, so every record is processed wholly by the old or wholly by the new
code. What can be upgraded: the function of ``map``, ``filter``, ``flat_map`` (batch and record level) and keyed
``process`` (and its ``on_timer``); built-in aggregations, windows and joins have no user code to replace.

A :class:`CodeChange` is the new code and its identity (a hash of the pickled functions, and their qualified
name); a checkpoint records the identity and the pickled change per instance, so a recovery or a restore builds
the upgraded operator. A :class:`CanaryTrial` runs new code on one instance first, holding its output until it
has processed ``batches`` batches, and gives the old code and state back, replaying the records it saw, if the
new code raises, changes the output schema or emits at a rate far from the old code's.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Sequence

import cloudpickle
import pyarrow as pa

from .errors import ChirayError
from .hashing import bins_of
from .logic import OperatorLogic
from .valuettl import Touched

__all__ = ["UpgradeError", "CodeChange", "CanaryTrial", "TrialVerdict", "FunctionRef", "check_upgrade",
           "migrate_values", "upgradable"]


class UpgradeError(ChirayError, ValueError):
    """An upgrade refused before its cut (bad code, a failed check) or rolled back by its canary."""


@dataclasses.dataclass(frozen=True, slots=True)
class CodeChange:
    """New code for one operator.

    Attributes:
        operator: the operator.
        fn: its new function.
        on_timer: a keyed process's new ``on_timer`` (None: keep the current one).
        schema: the output schema the new code declares (None: it must keep the current one).
        identity: a hash of the pickled functions (16 hex digits).
        qualname: the new function's qualified name.
    """

    operator: str
    fn: Callable[..., Any]
    on_timer: Callable[..., Any] | None = None
    schema: pa.Schema | None = None
    identity: str = ""
    qualname: str = ""

    @classmethod
    def of(cls, operator: str, fn: Any, on_timer: Any = None, schema: Any = None) -> "CodeChange":
        """The change, checked: callables, a schema, and functions that pickle (they travel to every host).

        Raises:
            UpgradeError: naming the operator and what is wrong.
        """
        where = f"upgrade of operator {operator!r}"
        for name, value in (("fn", fn), ("on_timer", on_timer)):
            if value is not None and not callable(value):
                raise UpgradeError(f"{where}: {name} must be callable, got {type(value).__name__}")
        if fn is None:
            raise UpgradeError(f"{where}: fn= is required (the new function)")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise UpgradeError(f"{where}: schema must be a pyarrow.Schema, got {type(schema).__name__}")
        try:
            blob = cloudpickle.dumps((fn, on_timer))
        except Exception as exc:
            raise UpgradeError(f"{where}: the new code does not pickle ({type(exc).__name__}: {exc}); it must "
                               "travel to every host") from exc
        qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
        return cls(operator, fn, on_timer, schema, hashlib.sha256(blob).hexdigest()[:16], qualname)

    def describe(self) -> str:
        """``qualname@identity``."""
        return f"{self.qualname}@{self.identity}"

    def dumps(self) -> bytes:
        return cloudpickle.dumps(self)


class FunctionRef:
    """A function named ``"module:name"``, imported where it is first called (in the job's runtime environment):
    what ``chiray upgrade --function`` sends when no file is shipped with the call.

    Raises (when called):
        UpgradeError: the module or the name does not import there.
    """

    def __init__(self, ref: str):
        module, _, name = ref.partition(":")
        if not module or not name:
            raise UpgradeError(f"a function is named module:name (e.g. mypkg.udfs:enrich), got {ref!r}")
        self.ref = ref
        self.__qualname__ = ref
        self._fn: Any = None

    def __getstate__(self) -> str:
        return self.ref

    def __setstate__(self, ref: str) -> None:
        self.__init__(ref)  # type: ignore[misc]

    def resolve(self) -> Callable[..., Any]:
        if self._fn is None:
            import importlib

            module, _, name = self.ref.partition(":")
            try:
                self._fn = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as exc:
                raise UpgradeError(f"function {self.ref!r} does not import here: {exc}") from exc
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


def upgradable(logic: Any) -> bool:
    """Whether ``logic`` runs user code that an upgrade can replace."""
    return callable(getattr(logic, "replace_code", None))


def _outputs(logic: OperatorLogic, sample: Sequence[tuple[pa.RecordBatch, int]]) -> list[pa.RecordBatch]:
    out: list[pa.RecordBatch] = []
    for batch, index in sample:
        out.extend(b for b in logic.process(batch, index) if b.num_rows)
    return out


def check_upgrade(make_logic: Callable[[], OperatorLogic], current: CodeChange | None, change: CodeChange,
                  sample: Sequence[tuple[pa.RecordBatch, int]]) -> pa.Schema | None:
    """Run the old and the new code on ``sample`` (recent input of the operator, with empty state); returns the
    output schema the new code must keep (None where the sample gave no output).

    Raises:
        UpgradeError: the operator cannot be upgraded, the new code raised on the sample, or its output schema is
            not the declared one (``change.schema``), or, with none declared, not the old code's.
    """
    where = f"upgrade of operator {change.operator!r}"
    old, new = make_logic(), make_logic()
    if not upgradable(new):
        raise UpgradeError(f"{where}: a {type(new).__name__} runs no user code that can be upgraded (map, filter, "
                           "flat_map and keyed process can)")
    if current is not None:
        old.replace_code(current.fn, current.on_timer, current.schema)  # type: ignore[attr-defined]
        new.replace_code(current.fn, current.on_timer, current.schema)  # type: ignore[attr-defined]
    new.replace_code(change.fn, change.on_timer, change.schema)  # type: ignore[attr-defined]
    rows = sum(b.num_rows for b, _ in sample)
    try:
        before = _outputs(old, sample)
    except Exception:
        before = []  # the old code fails on this sample too: nothing to compare with
    try:
        after = _outputs(new, sample)
    except Exception as exc:
        raise UpgradeError(f"{where}: the new code {change.describe()} raised on a sample of {rows} recent input "
                           f"records: {type(exc).__name__}: {exc}") from exc
    expected = change.schema if change.schema is not None else (before[0].schema if before else None)
    for batch in after:
        if expected is not None and not batch.schema.equals(expected):
            what = "the declared schema=" if change.schema is not None else "the old code's output schema"
            raise UpgradeError(f"{where}: the new code {change.describe()} returns {batch.schema.names} "
                               f"({', '.join(str(t) for t in batch.schema.types)}) on a sample of recent input; "
                               f"{what} is {expected.names} ({', '.join(str(t) for t in expected.types)}); "
                               "declare the new output with schema=")
    return expected if expected is not None else (after[0].schema if after else None)


def migrate_values(state: Any, fn: Callable[[Any, Any], Any]) -> int:
    """Map every key's value of a keyed process's ``state`` through ``fn(key, old) -> new`` (``None`` deletes the
    key); returns the number of keys migrated. Keys' bins are computed at once over all keys.

    Raises:
        UpgradeError: the state holds no per-key values (a built-in aggregation's columns).
    """
    values = getattr(state, "values", state)  # a timer process keeps its values beside its timers
    if not (callable(getattr(values, "items", None)) and callable(getattr(values, "put", None))):
        raise UpgradeError(f"migrate_state needs per-key values (keyed process); this state is a "
                           f"{type(state).__name__}")
    entries = list(values.items())
    if not entries:
        return 0
    keys = [k for k, _ in entries]
    bins = bins_of(pa.array(keys), values.num_bins).tolist()
    for (key, value), b in zip(entries, bins):
        touched = type(value) is Touched  # a value under a TTL keeps its touch: fn sees the value only
        new = fn(key, value.value if touched else value)
        if new is None:
            values.delete(key, b)
        else:
            values.put(key, b, Touched(new, value.touch) if touched else new)
    return len(entries)


@dataclasses.dataclass(frozen=True, slots=True)
class TrialVerdict:
    """How a canary trial ended.

    Attributes:
        passed: the new code stays; otherwise the old code and state came back at the cut.
        batches: batches the new code processed in the trial.
        reason: why it was rolled back, or why it ended before its batches (None: it ran them all and passed).
        ratio: records out per record in of the new code in the trial.
        reference: the same ratio of the old code before the cut (None: unknown).
    """

    passed: bool
    batches: int
    reason: str | None = None
    ratio: float | None = None
    reference: float | None = None


class CanaryTrial:
    """New code on one instance for ``batches`` batches, its output held; the old code back if it fails.

    The instance that owns ``logic`` hands each input batch to :meth:`process` (its output is what the
    instance emits) and calls :meth:`settle` before anything else must see the instance's state or output (a
    control op, end of input). Lifecycle: ``RUNNING -> PASSED | ROLLED_BACK`` (``verdict`` set); only the owning
    instance touches it.

    Args:
        logic: the instance's logic; upgraded in place now, given its old code and state back on rollback.
        change: the new code.
        migrate: ``migrate_state`` (or None).
        batches: the trial's length.
        schema: the output schema the new code must keep (None: any).
        reference: records out per record in of the old code (None: no rate check).
        bound: the rate check's bound: the trial fails when ``|new - old| > bound * max(new, old)``.
        report: called once with the :class:`TrialVerdict`.
    """

    def __init__(self, logic: Any, change: CodeChange, migrate: Callable[[Any, Any], Any] | None, batches: int,
                 schema: pa.Schema | None, reference: float | None, bound: float,
                 report: Callable[[TrialVerdict], None]):
        self.logic, self.change, self.batches = logic, change, batches
        self.schema, self.reference, self.bound, self._report = schema, reference, bound, report
        state = logic.state
        self._saved = state.snapshot_bins(state.bins()) if state is not None else None
        self._old = logic.replace_code(change.fn, change.on_timer, change.schema)
        if migrate is not None:
            migrate_values(state, migrate)
        self._inputs: list[tuple[pa.RecordBatch, int]] = []
        self._held: list[Any] = []
        self._rows_in = self._rows_out = 0
        self.verdict: TrialVerdict | None = None

    def process(self, batch: pa.RecordBatch, input_index: int) -> list[Any]:
        """One input batch: processed by the new code, its output held; returns what to emit now."""
        if self.verdict is not None:
            return list(self.logic.process(batch, input_index))
        self._inputs.append((batch, input_index))
        try:
            out = [b for b in self.logic.process(batch, input_index) if _rows(b)]
        except Exception as exc:
            return self._roll_back(f"the new code raised {type(exc).__name__}: {exc}")
        for b in out:
            schema = getattr(b, "schema", None)
            if self.schema is not None and schema is not None and not schema.equals(self.schema):
                return self._roll_back(f"the new code changed the output schema from {self.schema.names} "
                                       f"({', '.join(map(str, self.schema.types))}) to {schema.names} "
                                       f"({', '.join(map(str, schema.types))})")
        self._held.extend(out)
        self._rows_in += batch.num_rows
        self._rows_out += sum(_rows(b) for b in out)
        return self.settle(None) if len(self._inputs) >= self.batches else []

    def settle(self, interrupted_by: str | None) -> list[Any]:
        """End the trial now (``interrupted_by``: why before its batches); returns what to emit."""
        if self.verdict is not None:
            return []
        ratio = self._rows_out / self._rows_in if self._rows_in else None
        if ratio is not None and self.reference is not None:
            gap = abs(ratio - self.reference)
            if gap > self.bound * max(ratio, self.reference):
                return self._roll_back(f"its output rate departs from the old code's: {ratio:.3g} records out per "
                                       f"record in, the old code {self.reference:.3g} (bound {self.bound:g})")
        reason = None if interrupted_by is None else (f"ended after {len(self._inputs)} of {self.batches} batches: "
                                                      f"{interrupted_by}")
        return self._end(TrialVerdict(True, len(self._inputs), reason, ratio, self.reference), self._held)

    def _roll_back(self, reason: str) -> list[Any]:
        fn, on_timer, schema = self._old
        self.logic.replace_code(fn, on_timer, schema)
        state = self.logic.state
        if state is not None and self._saved is not None:
            state.extract_bins(state.bins())
            state.install_bins(self._saved)
        replayed: list[Any] = []
        for batch, index in self._inputs:  # the records the trial saw, now by the old code
            replayed.extend(self.logic.process(batch, index))
        ratio = self._rows_out / self._rows_in if self._rows_in else None
        return self._end(TrialVerdict(False, len(self._inputs), reason, ratio, self.reference), replayed)

    def _end(self, verdict: TrialVerdict, out: list[Any]) -> list[Any]:
        self.verdict = verdict
        self._inputs, self._held, self._saved = [], [], None
        self._report(verdict)
        return out


def _rows(batch: Any) -> int:
    inner = getattr(batch, "batch", batch)  # a SideOutput carries its batch
    return int(inner.num_rows)
