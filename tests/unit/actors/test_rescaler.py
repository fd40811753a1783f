"""Live rescales in one process (``LocalRun.rescale`` runs the steps a job on Ray runs): every strategy
scales out and in exactly, seeded random rescales and migrations keep every key whole and in order, and an
input that ends mid-migration loses nothing.

The job: two keyed operators fed by gated sources (``SeqSource``: the test says how many rows each split
may emit so far, and when the input ends): ``count``, a built-in count of ``value`` over two splits, and
``seqs``, a process that keeps each key's list of ``seq`` in arrival order over one split and emits each
record's position in it. Oracles, plain Python over the rows the sources emitted: the count of each value
(a dict), and each key's seqs in source order (one split: arrival order is seq order), so any record lost,
counted twice or applied out of order shows. Deliveries between hosts are shuffled and duplicated
(``seed``), and the clock counts (``counting_clock``), so each seed is one fixed run.
"""

from __future__ import annotations

import collections
import functools
import random
from typing import Any, Callable

import pytest

from chiray.actors.config import JobConfig
from chiray.actors.jobs.harness import LocalRun, counting_clock
from chiray.actors.jobs.jobvalues import RescaleState
from chiray.actors.jobs.rescaler import RescaleError
from chiray.control.ops.migrate import MigrateBins
from chiray.operators import Dataflow
from tests.oracles import assert_counts_equal, assert_in_order, output_counts, track_positions

from ..control.support import SeqSource, run_until

BINS = 16
STRATEGIES = [
    ("all_at_once", {}),
    ("batched", {"chunk_bins": 4}),
    ("batched", {"chunk_bins": 4, "pace": True}),
    ("fluid", {}),
    ("non_disruptive", {"chunk_bins": 4}),
    ("non_disruptive", {"chunk_bins": 4, "replicate": True}),
]
KEYED = ("count", "seqs")


class Driven(LocalRun):
    """A ``LocalRun`` that calls each of its ``hooks`` with the round's number before each round (the
    test's input trickles in, ends, or a host stalls, at given rounds), and each of its ``op_hooks`` with
    each control op it starts."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.rounds = 0
        self.hooks: list[Callable[[int], None]] = []
        self.op_hooks: list[Callable[[Any], None]] = []

    def step_all(self) -> bool:
        self.rounds += 1
        for hook in self.hooks:
            hook(self.rounds)
        return super().step_all()

    def run_control(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        for hook in self.op_hooks:
            hook(op)
        return super().run_control(op, *args, **kwargs)


class Job:
    """The two keyed operators of the module docstring in one ``Driven`` run. Their sources trickle:
    every ``every`` rounds each split may emit one more batch, up to what :meth:`feed` allowed, so that
    records are in flight during every step of a rescale. With ``stalls``, the host of one of a step's
    old owners stalls for a while, now and then, as the step starts (as a host busy with a long step
    would): the new owner takes the step's op and records of its bins long before their state."""

    def __init__(self, seed: int, rows: int = 90, batch: int = 5, every: int = 4, capacity: int = 2,
                 num_hosts: int | None = None, stalls: random.Random | None = None):
        self.counted = SeqSource([rows, rows], batch_size=batch, seed=seed, limit=0, hold_end=True,
                                 name="counted")
        self.ordered = SeqSource([rows], batch_size=batch, seed=seed, limit=0, hold_end=True, name="ordered",
                                 first_split=2)
        self.sources = (self.counted, self.ordered)
        self.allowed, self.rows, self.batch, self.every = 0, rows, batch, every
        flow = Dataflow("rescaled", num_bins=BINS)
        flow.source(self.counted, parallelism=2, name="src").key_by("value").count(
            parallelism=2, name="count", emit="final").collect(name="counts")
        flow.source(self.ordered, parallelism=1, name="src1").key_by("value").process(
            track_positions, parallelism=2, name="seqs").collect(name="positions")
        self.local = Driven(flow, JobConfig(channel_capacity=capacity, num_hosts=num_hosts), seed=seed,
                            clock=counting_clock())
        self.local.hooks.append(self._trickle)
        if stalls is not None:
            until: dict[int, int] = {}
            self.local.hooks.append(functools.partial(self._unstall, until))
            self.local.op_hooks.append(functools.partial(self._stall, stalls, until))

    def _trickle(self, round_: int) -> None:
        if round_ % self.every == 0:
            for source in self.sources:
                if source.limit is not None:
                    source.limit = min(source.limit + self.batch, self.allowed)

    def _stall(self, rng: random.Random, until: dict[int, int], op: Any) -> None:
        if isinstance(op, MigrateBins) and op.moves and rng.random() < 0.5:
            old = rng.choice(sorted({o for o, _ in op.moves.values()}))
            host = self.local.placement[(op.operator, old)]
            self.local.stalled.add(host)
            until[host] = self.local.rounds + rng.randint(5, 40)

    def _unstall(self, until: dict[int, int], round_: int) -> None:
        for host, last in list(until.items()):
            if round_ >= last:
                self.local.stalled.discard(host)
                del until[host]

    def feed(self, rows: int, rounds: int = 0) -> None:
        """Let each split trickle ``rows`` more in, and the job run ``rounds`` rounds."""
        self.allowed = min(self.allowed + rows, self.rows)
        for _ in range(rounds):
            self.local.step_all()

    def end(self, round_: int | None = None) -> None:
        """The input ends (each split emits the rest of its rows)."""
        for source in self.sources:
            source.limit, source.hold_end = None, False

    def check_exact(self) -> None:
        """Run to the end; the outputs equal the oracles."""
        self.end()
        out = self.local.run()
        counted = self.counted
        expected = collections.Counter(r["value"] for s in counted.split_numbers for r in counted.rows(s))
        assert_counts_equal(output_counts(out["counts"], key="value"), expected)
        order: dict[int, list[int]] = collections.defaultdict(list)  # one split: arrival order is seq order
        for r in self.ordered.rows(2):
            order[r["value"]].append(r["seq"])
        assert_in_order(out["positions"], order)

    def live(self, operator: str) -> list[int]:
        """The indexes of ``operator``'s instances that still run."""
        return sorted(inst.info.index for host in self.local.hosts for inst in host.instances
                      if inst.info.operator == operator and not inst.finished)

    def check_instances(self, operator: str, parallelism: int) -> None:
        """``operator`` has instances ``0..parallelism-1`` (once the retired ones drained), each on a live
        host."""
        indexes = list(range(parallelism))
        run_until(self.local, lambda: self.live(operator) == indexes, max_rounds=2000)
        assert sorted(i for name, i in self.local.plan.instances if name == operator) == indexes
        assert set(self.local.placement.values()) == {host.host_id for host in self.local.hosts}


def check_progress(progress: Any, operator: str, parallelism: int, knobs: dict[str, Any]) -> None:
    assert progress.state is RescaleState.DONE and progress.parallelism == parallelism, progress
    assert progress.bins_moved == progress.bins and progress.steps_done == progress.steps, progress
    migrations = [e for e in progress.step_log if isinstance(e["step"], int)]
    drains = [e for e in progress.step_log if e["step"] == "drain"]
    if knobs.get("pace"):  # each step waited for the backlog it left before the next
        assert len(drains) == len(migrations) - 1 and not any("error" in e for e in drains), progress.step_log
    else:
        assert not drains
    if knobs.get("replicate"):  # every bin was copied ahead, and a count's rebuilt from its copy
        copies = [e for e in progress.step_log if e["step"] == "replicate"]
        assert sum(e["bins"] for e in copies) == progress.bins, progress
        assert (progress.bytes_replicated > 0) == (progress.bins > 0), progress
        if operator == "count":
            assert progress.bins_reloaded == progress.bins, progress


@pytest.mark.parametrize("strategy,knobs", STRATEGIES, ids=[f"{s}{'-' + '-'.join(k) if k else ''}"
                                                            for s, k in STRATEGIES])
def test_every_strategy_scales_out_and_in_exactly(strategy, knobs):
    """Both keyed operators 2 -> 3 -> 1 -> 2 while records flow: two old owners give a new one bins,
    two instances retire at once, one old owner gives bins to a new one."""
    job = Job(seed=len(knobs) + len(strategy), stalls=random.Random(len(strategy)))
    job.feed(0, rounds=60)
    for p in (3, 1, 2):
        for op in KEYED:
            job.feed(15)
            progress = job.local.rescale(op, p, strategy, **knobs)
            check_progress(progress, op, p, knobs)
            assert progress.bins > 0
            job.check_instances(op, p)
    job.check_exact()


def random_rescale(rng: random.Random, job: Job) -> dict[str, Any]:
    """A random rescale or migration of a random keyed operator (``LocalRun.rescale``'s arguments)."""
    strategy = rng.choice(["all_at_once", "batched", "fluid", "non_disruptive"])
    knobs: dict[str, Any] = {"priority": rng.choice(["hot_first", "arrival", "random"]),
                             "seed": rng.randrange(9)}
    if strategy in ("batched", "non_disruptive"):
        knobs.update(rng.choice([{}, {"chunk_bins": rng.randint(1, 8)}, {"chunks": rng.randint(1, 4)}]))
    if strategy in ("batched", "fluid"):
        knobs["pace"] = rng.random() < 0.3
    if strategy == "non_disruptive":
        knobs["replicate"] = rng.random() < 0.4
    if rng.random() < 0.2:
        knobs["gap_s"] = 0.01
    call = {"operator": rng.choice(KEYED), "parallelism": rng.randint(1, 4), "strategy": strategy, **knobs}
    if rng.random() < 0.3:  # a migration: a random table
        call["assignment"] = [rng.randrange(call["parallelism"]) for _ in range(BINS)]
    else:
        call["planner"] = rng.choice(["ssm", "round_robin", "consistent_hash"])
        call["theta"] = 1.0  # loads of a few hundred records: ssm's default bound may have no answer
    return call


@pytest.mark.parametrize("seed", range(24))
def test_random_rescales_and_migrations_keep_every_key_whole_and_in_order(seed):
    """Three random rescales or migrations (any strategy, knobs, planner, parallelism 1-4), each after a
    random stretch of input, on random channel capacities and host counts."""
    rng = random.Random(seed)
    job = Job(seed, rows=rng.randint(40, 90), batch=rng.randint(3, 8), capacity=rng.randint(1, 4),
              num_hosts=rng.choice([None, 1, 2]), stalls=rng)
    for _ in range(3):  # records in flight during the steps
        job.feed(rng.randint(5, 30), rounds=rng.randint(0, 10))
        call = random_rescale(rng, job)
        before = list(job.local.plan.bin_tables[call["operator"]])
        progress = job.local.rescale(**call)
        after = job.local.plan.bin_tables[call["operator"]]
        check_progress(progress, call["operator"], call["parallelism"], call)
        assert progress.bins == sum(a != b for a, b in zip(before, after)), (before, after, progress)
        assert after == call.get("assignment", after) and max(after) < call["parallelism"]
        job.check_instances(call["operator"], call["parallelism"])
    job.check_exact()


def test_an_input_that_ends_mid_migration_loses_nothing():
    """For 30 seeds, the input ends at a random round of a random rescale: it completes, or it says the job
    ended before it did (a job on Ray then finishes with the last completed step's topology), or, where a
    step was being prepared as the last source finished, it says so and gives the step up (a job on Ray
    rolls back to its last checkpoint). Every job that was not rolled back ends exact."""
    outcomes: collections.Counter[str] = collections.Counter()
    for seed in range(30):
        rng = random.Random(seed)
        job = Job(seed, rows=rng.randint(20, 60))
        job.feed(job.rows, rounds=30)
        end_at = job.local.rounds + rng.randint(1, 100)
        job.local.hooks.append(lambda round_: job.end() if round_ == end_at else None)
        local = job.local
        try:
            local.rescale(**random_rescale(rng, job))
            outcomes["done"] += 1
        except RescaleError as exc:
            said = str(exc)
            assert "the job ended (FINISHED)" in said or "already finished (its input ended)" in said, \
                (seed, said)
            outcomes["abandoned" if local.abandoned else "ended"] += 1
            if local.abandoned:
                continue
        try:
            job.check_exact()
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
    assert outcomes["done"] > 0 and outcomes["ended"] > 0, f"a case never happened: {outcomes}"


def test_an_input_end_that_overtakes_the_bin_state_waits_for_it():
    """A non-disruptive scale-out whose input ends right behind its op, while the old owner's host is
    busy: the new owner (on a new host) gets the op and the end of every input long before the old owner
    ships the bins' state. Finishing without that state would drop those keys' counts."""
    counted = SeqSource([400], batch_size=10, seed=6, limit=370, hold_end=True, name="counted")
    flow = Dataflow("end-overtakes", num_bins=BINS)
    flow.source(counted, name="src").key_by("value").count(name="count", emit="final").collect(name="counts")
    local = Driven(flow, JobConfig(num_hosts=2, placement={"src": [1], "count": [0], "counts": [1]}), seed=6,
                   clock=counting_clock())
    local.run(until=lambda: local.instance(("count", 0)).records_in >= 370)
    # No Monitor before the step (round_robin, arrival): the first op is the step's, and the input ends
    # behind it, in fewer batches than a channel holds (the old owner's channel, which it does not empty,
    # takes them).
    end_at, stall_rounds = local.rounds + 1, 200

    def end_and_stall(round_: int) -> None:
        if round_ == end_at:
            counted.limit, counted.hold_end = None, False
            local.stalled.add(0)  # count[0]'s host
        elif round_ == end_at + stall_rounds:
            local.stalled.clear()

    local.hooks.append(end_and_stall)
    progress = local.rescale("count", 2, "non_disruptive", planner="round_robin", priority="arrival",
                             chunk_bins=BINS)
    assert progress.state is RescaleState.DONE and progress.bins_moved == progress.bins > 0
    assert local.rounds > end_at + stall_rounds, "the old owner's host stalled until the step's end"
    expected = collections.Counter(r["value"] for r in counted.rows(0))
    assert_counts_equal(output_counts(local.run()["counts"], key="value"), expected)


def test_a_stateless_operator_rescales_all_at_once():
    source = SeqSource([200, 200], batch_size=5, seed=2, limit=40, hold_end=True, name="counted")
    flow = Dataflow("stateless", num_bins=BINS)
    flow.source(source, parallelism=2, name="src").map(lambda b: b, name="pass").key_by("value").count(
        name="count", emit="final").collect(name="counts")
    local = LocalRun(flow, seed=2, clock=counting_clock())
    for p in (3, 1):
        source.limit += 40
        progress = local.rescale("pass", p)
        assert progress.state is RescaleState.DONE and (progress.steps, progress.bins) == (1, 0)
        assert sorted(i for name, i in local.plan.instances if name == "pass") == list(range(p))
    source.limit, source.hold_end = None, False
    expected = collections.Counter(r["value"] for s in (0, 1) for r in source.rows(s))
    assert_counts_equal(output_counts(local.run()["counts"], key="value"), expected)
