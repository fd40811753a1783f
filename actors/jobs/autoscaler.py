"""autoscaler.py: the closed loop: Monitor cuts -> rates -> DS2 -> a strategy for the budget -> rescale.

``Job.autoscale(...)`` starts an :class:`Autoscaler` thread beside the job's
supervisor. Every ``interval_s`` it takes a ``Monitor`` cut (in-band, so
every instance's counters are read at one consistent point of the stream),
computes each operator's rates since the previous cut
(``control.rates``), asks the DS2 policy (``control.ds2``) for the
parallelism each scaled operator needs, and, for an operator that should
change, picks the migration strategy and knobs that keep record latency
within the job's budget (``control.strategychoice``) and runs the rescale,
waiting for it before the next decision. When an operator's load is skewed
(one instance at the target utilisation or above, the others under half of
it) it rebalances bins among the same instances, hottest first, instead of
adding instances or taking some away.

Every decision is kept as an event with its inputs (rates, targets, the
chosen strategy and its predicted duration and latency) and, once the
rescale ends, its outcome, so a person can see why the job changed.

The thread touches the job only through its public verbs (``metrics``,
``rescale``, ``status``); the decisions are pure code in ``control/``.
Lifecycle: ``start() -> running -> stop()`` (idempotent); it also stops when
the job ends. A decision that fails (the job is recovering, a rescale found
no room) never ends the loop: the next one comes after a back-off (doubling
up to ``MAX_BACKOFF_S``, with jitter), and the job's events say when the
autoscaler pauses, resumes and stops.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypedDict

from chiray.control.ds2 import Action, Ds2Config, Ds2Policy, OperatorDecision
from chiray.control.rates import Cut, rates_between, skewed
from chiray.control.ops.monitor import MonitorResult
from chiray.control.strategychoice import MigrationModel, StrategyChoice, choose_strategy
from chiray.operators.errors import ChirayError
from chiray.operators.graph import OperatorKind, PhysicalPlan

if TYPE_CHECKING:
    from .handle import RescaleControl
    from .jobstatus import JobStatus

__all__ = ["Autoscaler", "AutoscaleEvent", "AutoscaleOptions", "ScaledJob", "start_autoscale"]

log = logging.getLogger(__name__)

#: What an event keeps of a rescale's result.
OUTCOME_FIELDS = ("state", "parallelism", "steps", "bins_moved", "bytes_moved", "bytes_replicated", "elapsed_s")


@dataclasses.dataclass(frozen=True, slots=True)
class AutoscaleEvent:
    """One decision that changed (or tried to change) an operator.

    Attributes:
        at: wall-clock seconds.
        decision: the policy's decision and its inputs.
        strategy: the migration strategy chosen and its knobs.
        predicted_duration_s / predicted_max_latency_ms: what the cost model expected.
        outcome: the rescale's result (``elapsed_s``, ``bytes_moved``, ...) or ``{"error": ...}``.
    """

    at: float
    decision: OperatorDecision
    strategy: str
    knobs: dict[str, object]
    predicted_duration_s: float
    predicted_max_latency_ms: float
    outcome: dict[str, Any]

    def describe(self) -> str:
        d = self.decision
        return (f"autoscale {d.operator}: {d.current} -> {d.target} ({d.action.value}; {d.reason}); "
                f"{self.strategy} {self.knobs}, predicted {self.predicted_duration_s:.2f} s / "
                f"{self.predicted_max_latency_ms:.0f} ms; outcome {self.outcome}")


class ScaledJob(Protocol):
    """What the autoscaler asks of a job: its public verbs (the driver's ``Job`` is one), and the ``autoscaler``
    attribute it keeps the running one in."""

    name: str
    plan: PhysicalPlan
    autoscaler: Autoscaler | None

    def metrics(self, timeout: float | None = 60.0) -> MonitorResult: ...

    def rescale(self, operator: str, parallelism: int, strategy: str = "all_at_once", planner: str = "ssm",
                **knobs: object) -> RescaleControl: ...

    def status(self) -> JobStatus: ...

    def note_event(self, text: str) -> None: ...


class AutoscaleOptions(TypedDict, total=False):
    """The knobs of ``start_autoscale`` (what ``Autoscaler.options`` keeps, to start it again)."""

    operators: list[str] | None
    policy: str
    min_parallelism: int
    max_parallelism: int
    latency_budget_ms: float
    target_utilisation: float
    interval_s: float
    scale_down_stable_s: float
    cooldown_s: float
    catch_up_s: float | None
    model: MigrationModel


def upstream_of(plan: PhysicalPlan) -> dict[str, list[str]]:
    """Each operator of a physical plan's graph -> its upstream operators."""
    return {name: [e.upstream for e in node.inputs] for name, node in plan.graph.nodes.items()}


MAX_BACKOFF_S = 60.0
"""The longest pause after failed decisions in a row."""


class Autoscaler(threading.Thread):
    """The autoscaling loop of one job.

    Args:
        job: the job (``metrics()``, ``rescale()``, ``migrate()``, ``status()``).
        operators: the keyed operators to scale.
        config: the DS2 knobs (bounds, utilisation, stable interval).
        latency_budget_ms: the record-latency budget the strategy chooser keeps to.
        interval_s: seconds between two cuts.
        model: the migration cost model.
        clock: wall-clock seconds (injectable for tests).
        wait: ``wait(seconds)`` returning True when stopped (injectable for tests).
    """

    def __init__(self, job: ScaledJob, operators: list[str], config: Ds2Config, latency_budget_ms: float,
                 interval_s: float = 2.0, model: MigrationModel = MigrationModel(),
                 clock: Callable[[], float] = time.time, wait: Callable[[float], bool] | None = None):
        super().__init__(name=f"chiray-autoscaler-{getattr(job, 'name', '')}", daemon=True)
        if interval_s <= 0:
            raise ValueError(f"autoscale: interval_s must be > 0, got {interval_s}")
        if latency_budget_ms <= 0:
            raise ValueError(f"autoscale: latency_budget_ms must be > 0, got {latency_budget_ms}")
        self.job = job
        self.policy = Ds2Policy(upstream_of(job.plan), operators, config)
        self.operators = list(operators)
        self.latency_budget_ms = latency_budget_ms
        self.interval_s = interval_s
        self.model = model
        self.clock = clock
        self._stopped = threading.Event()
        self._wait = wait or self._stopped.wait
        self.events: list[AutoscaleEvent] = []  # appended by this thread only; read a copy
        self.decisions = 0
        self.error: BaseException | None = None
        self._previous: Cut | None = None
        self.options: AutoscaleOptions = {}  # what start_autoscale was given (to start it again)

    def stop(self) -> None:
        """Stop after the current decision (idempotent)."""
        self._stopped.set()

    def run(self) -> None:
        failures = 0
        try:
            while not self._stopped.is_set() and not self._job_ended():
                try:
                    failed = [e.outcome["error"] for e in self.tick() if "error" in e.outcome]
                except Exception as exc:  # metrics refused while the job recovers, say
                    if self._job_ended():
                        break
                    failed = [f"{type(exc).__name__}: {exc}"]
                    self._previous = None  # measure afresh once it runs again
                if failed:
                    failures += 1
                    self.error = RuntimeError(failed[-1])
                    pause = min(MAX_BACKOFF_S, self.interval_s * 2 ** failures) * random.uniform(0.8, 1.2)
                    self._note(f"autoscale paused for {pause:.1f} s after {failures} failed decision(s) in a row: "
                               f"{failed[-1]}")
                elif failures:
                    failures, self.error = 0, None
                    self._note("autoscale resumed")
                if self._wait(pause if failed else self.interval_s):
                    break
        except BaseException as exc:  # a bug: reported through status and the job's events, never lost
            self.error = exc
            log.warning("autoscaler of job %r stopped: %s", getattr(self.job, "name", "?"), exc)
            self._note(f"autoscale stopped: {type(exc).__name__}: {exc}")

    def _job_ended(self) -> bool:
        try:
            return bool(self.job.status().state.terminal)
        except TimeoutError:  # the controller did not answer (JobUnresponsiveError): ask again later
            return False
        except ChirayError:  # forgotten: it has ended
            return True
        except Exception:  # the controller is being replaced: ask again after the pause
            return False

    def _note(self, text: str) -> None:
        """An event in the job's history (``status().events``); logged if the job cannot take it."""
        log.info("job %r: %s", getattr(self.job, "name", "?"), text)
        try:
            self.job.note_event(text)
        except Exception:  # the controller is being replaced: the log line stays
            pass

    def tick(self) -> list[AutoscaleEvent]:
        """One cut and, when the rates say so, rescales; returns the events it added."""
        result = self.job.metrics()
        cut = Cut.of(result)
        previous, self._previous = self._previous, cut
        if previous is None:
            return []
        rates = rates_between(previous, cut)
        current = {op: rates[op].parallelism if op in rates else 1 for op in self.operators}
        added = []
        for decision in self.policy.decide(self.clock(), rates, current):
            self.decisions += 1
            if decision.action is not Action.UP and self._skewed(decision.operator, cut, previous):
                added.append(self._rebalance(decision, result))  # before fewer instances: spread the hot bins
            elif decision.action is not Action.HOLD:
                added.append(self._rescale(decision, result))
        if added:
            self._previous = None  # the rescale restarted counters: measure afresh
        return added

    def _skewed(self, operator: str, cut: Cut, previous: Cut) -> bool:
        interval = cut.taken_at - previous.taken_at
        busy = {i: (float(m.get("busy_s", 0)) - float(previous.instances.get((op, i), {}).get("busy_s", 0)))
                / interval for (op, i), m in cut.instances.items() if op == operator}
        hot = self.policy.config.target_utilisation
        return skewed(busy, hot=hot, idle=hot / 2)

    def _choose(self, decision: OperatorDecision, result: MonitorResult, target: int) -> StrategyChoice:
        stats = result.operators.get(decision.operator, {})
        load = min(0.99, decision.target_rate / max(1e-9, (decision.true_rate_per_instance or 1) * decision.current))
        loads = result.bin_loads.get(decision.operator)
        num_bins = len(loads) if loads is not None else 1024
        return choose_strategy(float(stats.get("state_bytes", 0)), num_bins, decision.current, target, load,
                               self.latency_budget_ms, self.model, None if loads is None else list(loads))

    def _rescale(self, decision: OperatorDecision, result: MonitorResult) -> AutoscaleEvent:
        choice = self._choose(decision, result, decision.target)
        outcome = self._carry_out(lambda: self.job.rescale(decision.operator, decision.target, choice.strategy,
                                                           **choice.knobs))
        self.policy.rescaled(decision.operator, self.clock())
        return self._record(decision, choice, outcome)

    def _rebalance(self, decision: OperatorDecision, result: MonitorResult) -> AutoscaleEvent:
        rebalance = dataclasses.replace(decision, action=Action.HOLD, target=decision.current,
                                        reason=decision.reason + "; one instance hot, the others idle: "
                                        "rebalance bins hottest first")
        choice = self._choose(rebalance, result, decision.current)
        knobs = {**choice.knobs, "priority": "hot_first"}
        strategy = choice.strategy
        outcome = self._carry_out(lambda: self.job.rescale(decision.operator, decision.current, strategy, **knobs))
        self.policy.rescaled(decision.operator, self.clock())
        return self._record(rebalance, dataclasses.replace(choice, knobs=knobs), outcome)

    def _carry_out(self, start: Callable[[], RescaleControl]) -> dict[str, Any]:
        try:
            result = start().result(timeout=None)
            return {k: result[k] for k in OUTCOME_FIELDS if k in result}
        except Exception as exc:  # the decision and its failure are both events
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _record(self, decision: OperatorDecision, choice: StrategyChoice, outcome: dict[str, Any]) -> AutoscaleEvent:
        event = AutoscaleEvent(self.clock(), decision, choice.strategy, dict(choice.knobs),
                               choice.predicted_duration_s, choice.predicted_max_latency_ms, outcome)
        self.events.append(event)
        log.info("%s", event.describe())
        return event


def start_autoscale(job: ScaledJob, enabled: bool = True, *, operators: list[str] | None = None, policy: str = "ds2",
                    min_parallelism: int = 1, max_parallelism: int = 16, latency_budget_ms: float = 500.0,
                    target_utilisation: float = 0.8, interval_s: float = 2.0, scale_down_stable_s: float = 10.0,
                    cooldown_s: float = 5.0, catch_up_s: float | None = 30.0,
                    model: MigrationModel = MigrationModel()) -> Autoscaler | None:
    """Switch ``job``'s autoscaler on (replacing a running one) or off; ``Job.autoscale`` calls this.

    Returns:
        The running autoscaler, or ``None`` when switched off.

    Raises:
        ValueError: an unknown policy or operator, or a knob out of range.
    """
    if policy != "ds2":
        raise ValueError(f"autoscale: unknown policy {policy!r}; policies: ['ds2']")
    previous = getattr(job, "autoscaler", None)
    if previous is not None:
        previous.stop()
        job.autoscaler = None
    if not enabled:
        return None
    keyed = [name for name, node in job.plan.graph.nodes.items() if node.kind is OperatorKind.KEYED]
    chosen = keyed if operators is None else list(operators)
    unknown = sorted(set(chosen) - set(keyed))
    if unknown:
        raise ValueError(f"autoscale: {unknown} are not keyed operators of job {job.name!r}; keyed: {keyed}")
    config = Ds2Config(target_utilisation=target_utilisation, min_parallelism=min_parallelism,
                       max_parallelism=max_parallelism, catch_up_s=catch_up_s,
                       scale_down_stable_s=scale_down_stable_s, cooldown_s=cooldown_s)
    scaler = Autoscaler(job, chosen, config, latency_budget_ms, interval_s, model)
    scaler.options = AutoscaleOptions(operators=operators, policy=policy, min_parallelism=min_parallelism,
                                      max_parallelism=max_parallelism, latency_budget_ms=latency_budget_ms,
                                      target_utilisation=target_utilisation, interval_s=interval_s,
                                      scale_down_stable_s=scale_down_stable_s, cooldown_s=cooldown_s,
                                      catch_up_s=catch_up_s, model=model)
    job.autoscaler = scaler
    scaler.start()
    return scaler
