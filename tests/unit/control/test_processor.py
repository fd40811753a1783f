"""The control processor of one instance (``processor.py``), driven directly with hand-made messages.

The oracle for each test is the contract in ``op.py`` / ``processor.py``:
handler order begin -> next* -> complete -> dispose, completion on the last
expected input, completions released in global sequence order, attachments
per target with ``attach_all`` as the default.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from chiray.control.message import CONTROLLER, Configs, ControlMessage
from chiray.control.op import ControlOp, InstanceHandler
from chiray.control.processor import Completion, ControlProcessor, extra_input

ME = ("op", 0)


class FakeContext:
    """The little of an ``InstanceContext`` the handlers here use."""

    instance = ME

    def __init__(self) -> None:
        self.marker = "ctx-attribute"


class Logged(ControlOp):
    """Records (tag, event, detail) in a shared list; ``on_complete`` follows ``self.plan``."""

    def __init__(self, log: list, tag: str, blocking: bool = True, plan: Any = None):
        super().__init__()
        self.log = log
        self.tag = tag
        self.blocking = blocking
        self.plan = plan or {}

    class Instance(InstanceHandler):
        def on_begin(self, ctx: Any) -> None:
            self.op.log.append((self.op.tag, "begin", self.config))

        def on_next(self, ctx: Any, payload: Any, sender: Any) -> None:
            if self.op.plan.get("raise_on_next"):
                raise KeyError("handler failed")
            self.op.log.append((self.op.tag, "next", (sender, payload)))

        def on_complete(self, ctx: Any) -> Any:
            plan = self.op.plan
            self.op.log.append((self.op.tag, "complete", ctx.marker))
            for target, payload in plan.get("attach", {}).items():
                ctx.attach(target, payload)
            if "attach_all" in plan:
                ctx.attach_all(plan["attach_all"])
            return plan.get("returns")

        def on_dispose(self, ctx: Any) -> None:
            self.op.log.append((self.op.tag, "dispose", None))


_ids = itertools.count()


def message(op: ControlOp, seq: int, *, extra: tuple = (), sender: Any = CONTROLLER, payload: Any = None,
            configs: Configs | None = None) -> ControlMessage:
    op_id = f"op-{getattr(op, 'tag', next(_ids))}"
    return ControlMessage(op_id, op.kind, bool(op.blocking), seq, "controller", op, configs or Configs(),
                          extra, sender, payload)


def events(log: list, tag: str) -> list[str]:
    return [e for t, e, _ in log if t == tag]


# --------------------------------------------------------------------------- one op


@pytest.mark.parametrize("blocking", [True, False])
def test_handler_order_and_completion_on_the_last_input(blocking):
    log: list = []
    op = Logged(log, "A", blocking)
    proc = ControlProcessor(ME, [10, 11, 12], is_source=False)
    ctx = FakeContext()
    arrived = []
    for i, ch in enumerate([11, 10, 12]):
        m = message(op, 0, sender=("up", ch), payload=f"p{ch}")
        done = proc.arrive(m, ch, ctx)
        arrived.append(ch)
        if i < 2:
            assert done == []
            assert proc.blocked() == (frozenset(arrived) if blocking else frozenset())
            assert proc.pending_ops == [m.op_id]
    assert len(done) == 1 and isinstance(done[0], Completion)
    assert done[0].message.op_id == "op-A"
    assert proc.blocked() == frozenset() and proc.pending_ops == [] and proc.completed == 1
    assert events(log, "A") == ["begin", "next", "next", "next", "complete", "dispose"]
    nexts = [d for t, e, d in log if e == "next"]
    assert nexts == [(("up", 11), "p11"), (("up", 10), "p10"), (("up", 12), "p12")]
    assert ("A", "complete", "ctx-attribute") in log, "on_complete sees the runtime's context"


def test_each_instance_gets_its_own_config_and_others_the_default():
    log: list = []
    configs = Configs({ME: {"mine": 1}, ("op", 1): {"theirs": 2}}, default="default")
    proc = ControlProcessor(ME, [], is_source=True)
    proc.arrive(message(Logged(log, "A"), 0, configs=configs), CONTROLLER, FakeContext())
    other = ControlProcessor(("elsewhere", 0), [], is_source=True)
    other.arrive(message(Logged(log, "B"), 0, configs=configs), CONTROLLER, FakeContext())
    assert ("A", "begin", {"mine": 1}) in log and ("B", "begin", "default") in log


def test_a_source_expects_only_the_controller():
    proc = ControlProcessor(ME, [], is_source=True)
    m = message(Logged([], "A"), 0)
    assert proc.expected(m) == {CONTROLLER}
    assert len(proc.arrive(m, CONTROLLER, FakeContext())) == 1


def test_extra_edges_into_this_instance_are_expected_inputs():
    log: list = []
    op = Logged(log, "A")
    extra = ((("old", 0), ME), (("old", 1), ("op", 1)), (("old", 2), ME))
    proc = ControlProcessor(ME, [5], is_source=False)
    m = message(op, 0, extra=extra, sender=("up", 0))
    assert proc.expected(m) == {5, extra_input(("old", 0)), extra_input(("old", 2))}
    ctx = FakeContext()
    assert proc.arrive(m, 5, ctx) == []
    assert proc.arrive(m.hop(("old", 2), "state-2"), extra_input(("old", 2)), ctx) == []
    assert proc.blocked() == {5, extra_input(("old", 2))}
    done = proc.arrive(m.hop(("old", 0), "state-0"), extra_input(("old", 0)), ctx)
    assert len(done) == 1
    assert [d for _, e, d in log if e == "next"] == [(("up", 0), None), (("old", 2), "state-2"),
                                                    (("old", 0), "state-0")]


def test_arriving_twice_on_one_input_is_a_bug():
    proc = ControlProcessor(ME, [1, 2], is_source=False)
    m = message(Logged([], "A"), 0)
    proc.arrive(m, 1, FakeContext())
    with pytest.raises(RuntimeError, match="arrived twice"):
        proc.arrive(m, 1, FakeContext())


def test_handler_exceptions_propagate():
    proc = ControlProcessor(ME, [1], is_source=False)
    with pytest.raises(KeyError, match="handler failed"):
        proc.arrive(message(Logged([], "A", plan={"raise_on_next": True}), 0), 1, FakeContext())


# --------------------------------------------------------------------------- attachments


def test_attach_per_target_and_attach_all_as_default():
    plan = {"attach": {("down", 0): "for-0", CONTROLLER: "for-controller"}, "attach_all": "everyone",
            "returns": "ignored: attach_all was called"}
    proc = ControlProcessor(ME, [], is_source=True)
    (done,) = proc.arrive(message(Logged([], "A", plan=plan), 0), CONTROLLER, FakeContext())
    assert done.attachments == {("down", 0): "for-0", CONTROLLER: "for-controller"}
    assert done.default == "everyone"
    assert done.payload_for(("down", 0)) == "for-0"
    assert done.payload_for(CONTROLLER) == "for-controller"
    assert done.payload_for(("down", 1)) == "everyone"


def test_return_value_is_the_default_attachment():
    proc = ControlProcessor(ME, [], is_source=True)
    (done,) = proc.arrive(message(Logged([], "A", plan={"returns": 42, "attach": {("d", 1): 7}}), 0),
                          CONTROLLER, FakeContext())
    assert done.payload_for(("d", 0)) == 42 and done.payload_for(("d", 1)) == 7


def test_nothing_attached_means_none_for_everyone():
    proc = ControlProcessor(ME, [], is_source=True)
    (done,) = proc.arrive(message(Logged([], "A"), 0), CONTROLLER, FakeContext())
    assert done.attachments == {} and done.payload_for(("d", 0)) is None


# --------------------------------------------------------------------------- several ops


def test_completions_are_released_in_global_sequence_order():
    """Op 1 aligns first, but op 0 (earlier in the global order) completes first, then both go out."""
    log: list = []
    a, b = Logged(log, "A", blocking=False), Logged(log, "B", blocking=False)
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    ma, mb = message(a, 0), message(b, 1)
    assert proc.arrive(ma, 0, ctx) == []
    assert proc.arrive(mb, 0, ctx) == []
    assert proc.arrive(mb, 1, ctx) == [], "op B aligned, but op A precedes it in the global order"
    assert ("B", "complete", "ctx-attribute") not in log
    assert proc.pending_ops == [ma.op_id, mb.op_id]
    done = proc.arrive(ma, 1, ctx)
    assert [c.message.op_id for c in done] == [ma.op_id, mb.op_id]
    completes = [t for t, e, _ in log if e == "complete"]
    assert completes == ["A", "B"]
    assert proc.completed == 2


def test_pending_ops_are_listed_in_sequence_order():
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    for seq in (3, 1, 2):
        proc.arrive(message(Logged([], f"s{seq}", blocking=False), seq), 0, ctx)
    assert proc.pending_ops == ["op-s1", "op-s2", "op-s3"]


def test_blocked_is_the_union_over_pending_blocking_ops():
    proc = ControlProcessor(ME, [0, 1, 2], is_source=False)
    ctx = FakeContext()
    proc.arrive(message(Logged([], "nb", blocking=False), 0), 0, ctx)
    assert proc.blocked() == frozenset()
    proc.arrive(message(Logged([], "nb", blocking=False), 0), 1, ctx)
    proc.arrive(message(Logged([], "b"), 1), 0, ctx)
    assert proc.blocked() == {0}


def test_an_aligned_blocking_op_held_back_keeps_its_inputs_blocked():
    """Regression: op B aligned behind op A (waiting on an extra edge) holds its inputs until it completes."""
    log: list = []
    first = Logged(log, "A", blocking=False)
    second = Logged(log, "B", blocking=True)
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    ma = message(first, 0, extra=((("u", 0), ME),))
    mb = message(second, 1)
    proc.arrive(ma, 0, ctx)
    proc.arrive(ma, 1, ctx)
    proc.arrive(mb, 0, ctx)
    assert proc.blocked() == {0}
    assert proc.arrive(mb, 1, ctx) == []  # B aligned, held behind A (waits for the extra edge)
    assert ("B", "complete", "ctx-attribute") not in log
    assert proc.blocked() == {0, 1}, "B's on_complete has not run: its inputs must stay blocked"
    done = proc.arrive(ma.hop(("u", 0), None), extra_input(("u", 0)), ctx)
    assert [c.message.op_id for c in done] == [ma.op_id, mb.op_id]
    assert proc.blocked() == frozenset()


# --------------------------------------------------------------------------- ended inputs


def test_input_ended_releases_an_op_waiting_only_on_it():
    log: list = []
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    m = message(Logged(log, "A"), 0)
    assert proc.arrive(m, 0, ctx) == []
    assert proc.blocked() == {0}
    done = proc.input_ended(1, ctx)
    assert [c.message.op_id for c in done] == [m.op_id]
    assert events(log, "A") == ["begin", "next", "complete", "dispose"]
    assert proc.blocked() == frozenset()


def test_an_ended_input_is_not_expected_by_later_ops():
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    assert proc.input_ended(1, ctx) == []
    m = message(Logged([], "A"), 0)
    assert proc.expected(m) == {0}
    assert len(proc.arrive(m, 0, ctx)) == 1


def test_input_ended_releases_several_in_order():
    log: list = []
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    ma, mb = message(Logged(log, "A", blocking=False), 0), message(Logged(log, "B"), 1)
    proc.arrive(ma, 0, ctx)
    proc.arrive(mb, 0, ctx)
    done = proc.input_ended(1, ctx)
    assert [c.message.op_id for c in done] == [ma.op_id, mb.op_id]
    assert [t for t, e, _ in log if e == "complete"] == ["A", "B"]


def test_an_earlier_op_arriving_after_a_joining_op_does_not_expect_the_joined_inputs():
    """A rescale's op (seq 1) activates inputs 7 and 8 here. It can come over them before an op
    injected just before it (seq 0, a checkpoint) comes over the old input 0: the earlier op is never
    sent on 7 or 8, so it completes on input 0 alone, and the joining op after it."""
    log: list = []
    proc = ControlProcessor(ME, [0], is_source=False)
    ctx = FakeContext()
    checkpoint = message(Logged(log, "checkpoint"), 0)
    rescale = message(Logged(log, "rescale", blocking=False), 1)
    proc.join(rescale.op_id, [7, 8])
    assert proc.arrive(rescale, 7, ctx) == []
    assert proc.arrive(rescale, 8, ctx) == []
    assert proc.expected(checkpoint) == {0}
    assert proc.expected(rescale) == {0, 7, 8}
    done = proc.arrive(checkpoint, 0, ctx)
    assert [c.message.op_id for c in done] == [checkpoint.op_id]
    done = proc.arrive(rescale, 0, ctx)
    assert [c.message.op_id for c in done] == [rescale.op_id]
    later = message(Logged(log, "later"), 2)
    assert proc.expected(later) == {0, 7, 8}, "ops after the joining one expect the new inputs"
    assert [t for t, e, _ in log if e == "complete"] == ["checkpoint", "rescale"]


def test_an_op_arriving_before_the_joining_one_keeps_its_expected_inputs():
    proc = ControlProcessor(ME, [0], is_source=False)
    ctx = FakeContext()
    checkpoint = message(Logged([], "checkpoint"), 0)
    rescale = message(Logged([], "rescale", blocking=False), 1)
    proc.join(rescale.op_id, [7])
    assert proc.arrive(checkpoint, 0, ctx) and proc.arrive(rescale, 7, ctx) == []
    assert [c.message.op_id for c in proc.arrive(rescale, 0, ctx)] == [rescale.op_id]


class HoldsNothingHere(Logged):
    """A blocking op whose handler leaves this instance's inputs free."""

    class Instance(Logged.Instance):
        holds_inputs = False


def test_a_blocking_op_may_leave_an_instances_inputs_free():
    log: list = []
    op = HoldsNothingHere(log, "free", blocking=True)
    proc = ControlProcessor(ME, [0, 1], is_source=False)
    ctx = FakeContext()
    m = message(op, 0)
    assert proc.arrive(m, 0, ctx) == []
    assert proc.blocked() == frozenset(), "its inputs are not held"
    done = proc.arrive(m, 1, ctx)
    assert [c.message.op_id for c in done] == [m.op_id], "it still completes on the last expected input"
    assert proc.blocked() == frozenset()


class KeepsApartHere(Logged):
    """A blocking op that holds no input here and keeps apart what comes after it (a checkpoint at a sink)."""

    class Instance(Logged.Instance):
        def on_begin(self, ctx: Any) -> None:
            super().on_begin(ctx)
            self.holds_inputs = False
            self.keeps_input_apart = True


class KeepingContext(FakeContext):
    """Logs each ``take_in_kept`` with the ops that completed before it."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def take_in_kept(self) -> None:
        self.log.append(("ctx", "take_in_kept", None))


@pytest.mark.parametrize("many", [False, True])
def test_ops_that_keep_input_apart_count_how_many_each_input_came_after(many):
    """``apart(input)`` is how many pending keeping ops have arrived on it; the oldest one's completion hands
    the kept data over right after its ``on_complete`` and before any later op's."""
    log: list = []
    proc = ControlProcessor(ME, [0, 1, 2], is_source=False)
    ctx = KeepingContext(log)
    first, second = KeepsApartHere(log, "a"), KeepsApartHere(log, "b")
    m1, m2 = message(first, 0), message(second, 1)
    if many:
        assert proc.arrive_many(m1, [0, 1], [CONTROLLER, CONTROLLER], ctx) == []
    else:
        assert proc.arrive(m1, 0, ctx) == [] and proc.arrive(m1, 1, ctx) == []
    assert proc.arrive(m2, 0, ctx) == []
    assert proc.blocked() == frozenset(), "no input is held"
    assert [proc.apart(i) for i in (0, 1, 2)] == [2, 1, 0]
    assert proc.kept_apart() == frozenset({0, 1})
    done = proc.arrive(m1, 2, ctx)
    assert [c.message.op_id for c in done] == [m1.op_id]
    assert [proc.apart(i) for i in (0, 1, 2)] == [1, 0, 0]
    assert [(t, e) for t, e, _ in log if e in ("complete", "take_in_kept")] == [("a", "complete"),
                                                                                 ("ctx", "take_in_kept")]
    done = proc.arrive(m2, 1, ctx) + proc.arrive(m2, 2, ctx)
    assert [c.message.op_id for c in done] == [m2.op_id]
    assert proc.kept_apart() == frozenset() and [proc.apart(i) for i in (0, 1, 2)] == [0, 0, 0]
    assert [(t, e) for t, e, _ in log if e in ("complete", "take_in_kept")][2:] == [("b", "complete"),
                                                                                     ("ctx", "take_in_kept")]


def test_an_op_that_completes_on_its_only_input_hands_nothing_over():
    log: list = []
    proc = ControlProcessor(ME, [0], is_source=False)
    done = proc.arrive(message(KeepsApartHere(log, "alone"), 0), 0, KeepingContext(log))
    assert len(done) == 1 and ("ctx", "take_in_kept", None) not in log


# --------------------------------------------------------------------------- ops that handle nothing here


class _Unreadable:
    """A configuration that fails when unpickled (so a test sees whether it was read)."""

    def __reduce__(self) -> tuple:
        return (_refuse, ())


def _refuse() -> None:
    raise AssertionError("the configuration was unpickled")


def test_handles_nothing_only_for_the_base_handlers():
    from chiray.control.op import handles_nothing
    from chiray.control.ops import NoOp

    assert handles_nothing(NoOp.Instance) and handles_nothing(InstanceHandler)
    assert not handles_nothing(Logged.Instance)

    class OnlyInit(InstanceHandler):
        def __init__(self, op: Any, config: Any) -> None:
            super().__init__(op, config)

    assert not handles_nothing(OnlyInit)


@pytest.mark.parametrize("blocking", [True, False])
def test_an_op_that_handles_nothing_aligns_without_reading_its_config(blocking):
    from chiray.control.ops import NoOp

    proc = ControlProcessor(ME, [1, 2], is_source=False)
    configs = Configs({("elsewhere", 0): "theirs"}, default=_Unreadable())  # non-empty: ``message`` keeps it
    m = message(NoOp(blocking=blocking), 0, configs=configs)
    assert proc.arrive(m, 2, FakeContext()) == []
    assert proc.blocked() == (frozenset({2}) if blocking else frozenset())
    (done,) = proc.arrive(m.hop(("up", 1), None), 1, FakeContext())
    assert done.attachments == {} and done.payload_for(("d", 0)) is None
    assert proc.blocked() == frozenset() and proc.completed == 1
    source = ControlProcessor(ME, [], is_source=True)
    assert len(source.arrive(m, CONTROLLER, FakeContext())) == 1
    assert source.take_block_changes() == [] and source.pending_ops == []


# --------------------------------------------------------------------------- many arrivals in one step


def _trace(proc: ControlProcessor, completions: list[Completion], log: list) -> tuple:
    """What an observer sees of a processor: completions, blocked inputs, pending ops, handler events."""
    return ([(c.message.op_id, c.attachments, c.default) for c in completions], sorted(proc.blocked()),
            proc.pending_ops, proc.completed, [(e, d) for _, e, d in log], proc.take_block_changes())


@pytest.mark.parametrize("seed", range(12))
def test_arrive_many_is_arrive_on_each_in_turn(seed):
    """Counting a batch of copies in one step leaves the processor exactly as one arrival each:
    completions, blocked inputs, pending ops and (for an op with handlers) every on_next, in order."""
    import random

    from chiray.control.ops import NoOp

    rng = random.Random(seed)
    inputs = list(range(rng.randint(2, 40)))
    log_a: list = []
    log_b: list = []
    handled = rng.random() < 0.5
    blocking = rng.random() < 0.5
    op_a = Logged(log_a, "x", blocking=blocking) if handled else NoOp(blocking=blocking)
    op_b = Logged(log_b, "x", blocking=blocking) if handled else NoOp(blocking=blocking)
    earlier = rng.random() < 0.5  # an earlier blocking op still waits here: completions are held back
    first = ControlMessage("first", "NoOp", True, 0, "controller", NoOp(blocking=True), Configs())
    one, many = ControlProcessor(ME, inputs, False), ControlProcessor(ME, inputs, False)
    if earlier:
        for proc in (one, many):
            proc.arrive(first.hop(("up", 0), None), inputs[0], FakeContext())
    order = inputs[:]
    rng.shuffle(order)
    cuts = sorted(rng.sample(range(1, len(order)), k=min(3, len(order) - 1)))
    ma, mb = (ControlMessage("x", op.kind, blocking, 1, "controller", op, Configs()) for op in (op_a, op_b))
    done_one: list = []
    done_many: list = []
    for part in (order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)])):
        senders = [("up", i) for i in part]
        for source, sender in zip(part, senders):
            done_one += one.arrive(ma.hop(sender, None), source, FakeContext())
        done_many += many.arrive_many(mb.hop(senders[0], None), part, senders, FakeContext())
        assert _trace(one, done_one, log_a) == _trace(many, done_many, log_b)
    if earlier:  # the earlier op's last input releases both, in sequence order
        for proc, done in ((one, done_one), (many, done_many)):
            for source in inputs[1:]:
                done += proc.arrive(first.hop(("up", source), None), source, FakeContext())
        assert _trace(one, done_one, log_a) == _trace(many, done_many, log_b)
    assert len(done_many) == 1 + earlier and many.pending_ops == [] and many.blocked() == frozenset()


def test_arrive_many_twice_on_an_input_is_a_bug():
    from chiray.control.ops import NoOp

    proc = ControlProcessor(ME, [1, 2, 3], False)
    m = message(NoOp(blocking=True), 0)
    with pytest.raises(RuntimeError, match="arrived twice on 2"):
        proc.arrive_many(m, [1, 2, 2], [("u", 1), ("u", 2), ("u", 2)], FakeContext())
    with pytest.raises(RuntimeError, match="unexpected input 9"):
        ControlProcessor(ME, [1, 2, 3], False).arrive_many(m, [1, 9], [("u", 1), ("u", 9)], FakeContext())
