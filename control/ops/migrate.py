"""migrate.py: ``MigrateBins``, one step of a live rescale or migration: move some key bins.

The op travels over the meta-topology G' (the data graph plus an extra edge
from each old owner to each new owner of a moving bin; Chi's Algorithm 1):

* every instance with a hash edge into the operator switches that edge's
  bin table to the new one in ``on_complete``, just before it forwards the
  message, so on each channel the records before the message follow the old
  table and those after it the new one;
* an old owner, once the message has arrived on all its inputs (no record of
  a moving bin can reach it any more), splits the moving bins off its state
  and attaches them for their new owners along the extra edges;
* a new owner installs the bins it receives in its own ``on_complete``, so it
  applies the move in the global order of ops too: a checkpoint earlier than
  the step is cut at both owners before the bins move, however early the bins
  reach the new owner along the extra edge.

Blocking (``all_at_once``, ``batched``, ``fluid``): the new owner's inputs are
held from the message's arrival until the bins are installed, like any
blocking op. ``all_at_once`` aligns every instance of G' (Chi's Algorithm 1);
a step of ``batched`` or ``fluid`` (Megaphone) holds only the inputs of the
old and new owners of its bins, so a small step never stalls the rest of the
job (downstream operators, and the instances it does not concern).
Non-blocking (``non_disruptive``, Spacker's protocol): nothing is held; the
new owner buffers only the records of the bins it is waiting for and replays
them, in arrival order, the moment their state is installed (once the op has
arrived on all its inputs); records of every other bin never wait.

A step may also change the operator's instance set (scale-out, scale-in): the
runtime registers channel changes under the op's id before injecting it, and
applies them at each instance when the op passes (``actors/runtime/topology.py``).

Replication (Spacker's third knob): an old owner that replicated a bin to the
new owner ahead of time (``ReplicateBins``) sends only a marker when the bin
has not changed since (its version is the replica's); the new owner reloads
the replica instead. Where the state tracks writes per key
(``BinnedState.extract_changes``), a bin written since its replica sends only
the keys written since, which the new owner applies over the replica; other
state sends such a bin whole.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, Sequence

from ..message import InstanceId
from ..op import ControlOp, InstanceHandler

__all__ = ["MigrateBins", "ReplicateBins", "bins_payload_size"]


def owner_pairs(moves: Mapping[int, tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
    """(old owner, new owner) -> the bins that move between them, ascending."""
    pairs: dict[tuple[int, int], list[int]] = {}
    for b, (old, new) in sorted(moves.items()):
        pairs.setdefault((old, new), []).append(b)
    return pairs


def bins_payload_size(bins: Mapping[int, Any]) -> int:
    return sum(len(v) for v in bins.values() if isinstance(v, (bytes, bytearray)))


RESERVE_BELOW = 4
"""A new owner makes room for its incoming keys at once only while it holds under 1/4 of them."""
RESERVE_SPARE = 8
"""...and for an eighth more: keys first seen while the bins move (the count is the planner's, from
before). Room short by 0.2 % doubled a new owner's columns in its last install: 160 ms at 2.4M keys."""


class MigrateBins(ControlOp):
    """Move ``moves`` (bin -> (old instance index, new instance index)) of keyed ``operator``.

    Args:
        operator: the keyed operator.
        table: the bin table after this step.
        moves: the bins this step moves.
        blocking: aligned (True) or Spacker's non-disruptive protocol (False).
        key: the operator's key column (for buffering at new owners), or one per input.
        replicas: (bin -> version) of replicas the new owners' hosts hold, from ``ReplicateBins``.
        timeout_s: the op's timeout.
        everywhere: a blocking op holds the inputs of every instance (True), or
            only those of the old and new owners of its bins (False).
        reserve: new owner's index -> keys the whole rescale brings it (the first step carries it):
            a new owner whose state is small makes room for them at once (``BinnedState.reserve``),
            before the bins arrive, rather than growing in stalls while they do.
        retiring: indexes of old owners that give away every bin in the whole rescale (a
            scale-in): their states are told so (``BinnedState.retire``) before bins leave.

    Its result: {"bins": bins moved, "bytes": bytes moved, "reloaded": bins reloaded from replicas}.
    """

    acks: dict[InstanceId, Any]  # filled at the controller as old owners acknowledge

    def __init__(self, operator: str, table: list[int] | None, moves: Mapping[int, tuple[int, int]],
                 blocking: bool = True, key: str | Sequence[str] | None = None,
                 replicas: Mapping[int, int] | None = None, timeout_s: float | None = 120.0,
                 everywhere: bool = True, reserve: Mapping[int, int] | None = None,
                 retiring: Sequence[int] = ()):
        super().__init__()
        self.everywhere = everywhere
        self.retiring = frozenset(int(i) for i in retiring)
        self.reserve = {int(i): int(n) for i, n in (reserve or {}).items()}
        self.operator = operator
        self.table = list(table) if table is not None else None
        self.moves = {int(b): (int(o), int(n)) for b, (o, n) in moves.items()}
        self.blocking = blocking
        self.key = key
        self.replicas = dict(replicas or {})
        self.timeout_s = timeout_s
        self.started = time.monotonic()

    @property
    def kind(self) -> str:
        return "MigrateBins" if self.blocking else "MigrateBinsNonBlocking"

    def _pairs(self) -> dict[tuple[int, int], list[int]]:
        return owner_pairs(self.moves)

    def on_init(self, ctx: Any) -> dict[InstanceId, Any]:
        if self.operator not in ctx.operators:
            raise ValueError(f"MigrateBins: unknown operator {self.operator!r}")
        configs: dict[InstanceId, Any] = {}
        for (old, new), bins in self._pairs().items():
            send = configs.setdefault((self.operator, old), {"send": {}, "receive": []})
            send["send"].setdefault((self.operator, new), []).extend(bins)
            receive = configs.setdefault((self.operator, new), {"send": {}, "receive": []})
            receive["receive"].extend(bins)
        return configs

    def extra_edges(self, ctx: Any) -> Iterable[tuple[InstanceId, InstanceId]]:
        return [((self.operator, old), (self.operator, new)) for old, new in self._pairs()]

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return {(self.operator, old) for old, _ in self._pairs()}

    class Instance(InstanceHandler):
        def __init__(self, op: "MigrateBins", config: Any):
            super().__init__(op, config)
            self.holds_inputs = op.everywhere or bool(config)  # configs name the owners concerned
            self.received: list[dict[str, Any]] = []  # the old owners' payloads, until on_complete

        def on_begin(self, ctx: Any) -> None:
            op: MigrateBins = self.op  # type: ignore[assignment]
            incoming = op.reserve.get(ctx.instance[1], 0) if ctx.instance[0] == op.operator else 0
            state = ctx.state if incoming else None
            if state is not None and len(state) * RESERVE_BELOW <= incoming:  # room at the cost of a copy
                state.reserve(len(state) + incoming + incoming // RESERVE_SPARE)  # of a state that is small
            if not op.blocking and self.config and self.config["receive"]:
                ctx.hold_bins(self.config["receive"], op.key)
            if not op.blocking and self.config and self.config["send"]:
                # Event time stops here until the bins leave: the watermarks that come meanwhile on
                # inputs the op has passed belong to records routed to the new owner already.
                ctx.pause_event_time()

        def on_next(self, ctx: Any, payload: Any, sender: Any) -> None:
            if isinstance(payload, dict) and "bins" in payload and self.config:
                self.received.append(payload)  # installed in on_complete, never before (see _install)

        def _install(self, ctx: Any) -> None:
            """Install the bins the old owners sent (a new owner; in ``on_complete`` only).

            Not on arrival: the bins may reach this instance along the extra edge before an earlier op
            (a checkpoint, by the global order) has completed here, or even arrived over its slower
            data channels. The old owner cut that checkpoint before it let the bins go; were they
            installed at once, this instance's snapshot would hold them too, ahead of the cut (a bin in
            two snapshots, a restore that replays records into state that saw them). ``on_complete``
            runs in global order after every earlier op, each of which arrives on every data channel
            ahead of this one, so both owners apply the checkpoint and the move in one order. The
            records of the moving bins lose nothing by it: they follow this op on each channel, held
            there by a blocking step, or buffered (``hold_bins``) by a non-blocking one.
            """
            op: MigrateBins = self.op  # type: ignore[assignment]
            for payload in self.received:
                bins = dict(payload["bins"])
                reloaded = [b for b, v in bins.items() if v is None]
                if reloaded:
                    bins.update(ctx.take_replicas(op.operator, reloaded, {b: op.replicas[b] for b in reloaded}))
                ctx.state.install_bins(bins)
                if payload.get("changes"):
                    ctx.state.apply_changes(payload["changes"])
                if not op.blocking:
                    ctx.release_bins(list(bins))
            if self.received:  # a window the install fired goes downstream before the op (and any later cut)
                ctx.send_installed_output()

        def on_complete(self, ctx: Any) -> None:
            op: MigrateBins = self.op  # type: ignore[assignment]
            self._install(ctx)
            if op.table is not None:
                ctx.set_bin_table(op.operator, op.table)
            if not self.config or not self.config["send"]:
                return
            state = ctx.state
            if ctx.instance[1] in op.retiring:  # it gives every bin away in this rescale: nothing to compact
                state.retire()
            sent = nbytes = reloaded = 0
            started = time.perf_counter()
            for target, bins in self.config["send"].items():
                replicated = {b: op.replicas[b] for b in bins if b in op.replicas}
                changes = state.extract_changes(replicated) if replicated else None
                if changes is None:  # whole bins, but for those unchanged since their replica
                    replicated = {b: v for b, v in replicated.items() if v == state.version(b)}
                    payload = state.extract_bins(bins)
                else:  # the replicas, and the keys written since
                    payload = state.extract_bins([b for b in bins if b not in replicated])
                for b in replicated:  # the new owner holds this bin's replica: a marker only
                    payload[b] = None
                ctx.attach(target, {"bins": payload, "changes": changes or {}})
                sent += len(bins)
                reloaded += len(replicated)
                nbytes += bins_payload_size(payload) + bins_payload_size(changes or {})
            ctx.ack({"bins": sent, "bytes": nbytes, "reloaded": reloaded,
                     "extract_s": time.perf_counter() - started})
            if not op.blocking:
                ctx.resume_event_time()

    def on_complete(self, ctx: Any) -> dict[str, int]:
        acks = [a for a in self.acks.values() if a]
        return {"bins": sum(a["bins"] for a in acks), "bytes": sum(a["bytes"] for a in acks),
                "reloaded": sum(a["reloaded"] for a in acks),
                "extract_s": max((a.get("extract_s", 0.0) for a in acks), default=0.0)}


class ReplicateBins(ControlOp):
    """Copy bins ahead of a migration to the hosts of their likely new owners (non-blocking).

    Each old owner snapshots the named bins in ``on_complete`` and attaches the
    copies, with their versions, for the new owner, which keeps them as
    replicas. The result: ``{"versions": bin -> replicated version}`` (for
    ``MigrateBins.replicas``) and ``"bytes"``, the bytes copied.
    """

    blocking = False
    acks: dict[InstanceId, Any]

    def __init__(self, operator: str, moves: Mapping[int, tuple[int, int]], timeout_s: float | None = 120.0):
        super().__init__()
        self.operator = operator
        self.moves = {int(b): (int(o), int(n)) for b, (o, n) in moves.items()}
        self.timeout_s = timeout_s

    def _pairs(self) -> dict[tuple[int, int], list[int]]:
        return owner_pairs(self.moves)

    def on_init(self, ctx: Any) -> dict[InstanceId, Any]:
        configs: dict[InstanceId, Any] = {}
        for (old, new), bins in self._pairs().items():
            configs.setdefault((self.operator, old), {}).setdefault((self.operator, new), []).extend(bins)
        return configs

    def extra_edges(self, ctx: Any) -> Iterable[tuple[InstanceId, InstanceId]]:
        return [((self.operator, old), (self.operator, new)) for old, new in self._pairs()]

    def expected_acks(self, ctx: Any) -> set[InstanceId]:
        return {(self.operator, new) for _, new in self._pairs()}

    class Instance(InstanceHandler):
        received: dict[int, int] | None = None
        nbytes = 0

        def on_next(self, ctx: Any, payload: Any, sender: Any) -> None:
            if isinstance(payload, dict) and "replicas" in payload:
                op: ReplicateBins = self.op  # type: ignore[assignment]
                ctx.keep_replicas(op.operator, payload["replicas"])
                self.received = {**(self.received or {}), **{b: v for b, (v, _) in payload["replicas"].items()}}
                self.nbytes += sum(len(data) for _, data in payload["replicas"].values())

        def on_complete(self, ctx: Any) -> None:
            if self.received is not None:
                ctx.ack({"versions": self.received, "bytes": self.nbytes})
            if not self.config:
                return
            state = ctx.state
            for target, bins in self.config.items():
                ctx.attach(target, {"replicas": {b: (state.version(b), data)
                                                 for b, data in state.snapshot_bins(bins).items()}})

    def on_complete(self, ctx: Any) -> dict[str, Any]:
        versions: dict[int, int] = {}
        for ack in self.acks.values():
            versions.update((ack or {}).get("versions", {}))
        return {"versions": versions, "bytes": sum((ack or {}).get("bytes", 0) for ack in self.acks.values())}
