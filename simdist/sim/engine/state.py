"""The shared state of one simulation: the environment, the network backend, the simulated
slices and what they tally and leave as spans."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from simdist.analytic.collectives import Network
from simdist.sim import kernel
from simdist.sim.network import NetworkBackend
from simdist.sim.work import Lowered, PsSpec
from simdist.spec.plan import RankCoord, rank_of
from simdist.spec.scenario import Scenario

Proc = Generator[kernel.Event, Any, Any]
BackendFactory = Callable[[kernel.Environment, Scenario, Network, bool], NetworkBackend]


@dataclass
class Tally:
    """What one slice's compute stream did in one step (one cycle, asynchronously), in seconds."""

    compute: float = 0.0
    recompute: float = 0.0
    compression: float = 0.0
    tp: float = 0.0
    cp: float = 0.0  # exposed context-parallel communication
    ep: float = 0.0  # waits for the expert all-to-all
    pp: float = 0.0  # blocking sends + the exposed part of waits for a transfer
    dp: float = 0.0  # waits for ZeRO-3 parameters and gradient reductions before the flush
    offload: float = 0.0  # waits for parameter uploads and gradient copies before the flush
    start: float = 0.0
    flush_end: float = 0.0
    end: float = 0.0
    post: list[tuple[float, float, str]] = field(default_factory=list)  # after the flush: waits, work

    @property
    def busy(self) -> float:
        return self.compute + self.recompute + self.compression + self.tp + self.pp + self.cp + self.ep

    @property
    def work(self) -> float:
        """GPU work a slower GPU stretches (what a straggler factor multiplies)."""
        return self.compute + self.recompute + self.compression


@dataclass
class Slice:
    """The tensor- and context-parallel group of one pipeline stage of one data-parallel replica,
    driven by one process (its ranks run in lock-step)."""

    replica: int
    stage: int
    ranks: tuple[int, ...]  # ranks that get spans (the representative, or the whole slice)
    factor: float  # compute slow-down (the slowest rank of the slice)
    tally: Tally = field(default_factory=Tally)
    tails: dict[str, kernel.Event] = field(default_factory=dict)  # stream -> last submitted item
    seq: dict[str, int] = field(default_factory=dict)  # stream -> items submitted
    cycle: int = 0
    history: list[Tally] = field(default_factory=list)  # finished cycles (asynchronous mode)
    version: int = 0  # parameter version of its last pull (asynchronous mode)
    record: list[tuple[float, ...]] | None = None  # per action start: the clock and the tally (periodic)


@dataclass(frozen=True, slots=True)
class Pull:
    """The pull that follows a parameter-server push, once the servers applied it."""

    spec: PsSpec


class Run:
    """One simulation's environment, network backend, slices and spans."""

    def __init__(self, sc: Scenario, lowered: Lowered, net: Network, full: bool, keep_spans: bool,
                 stragglers: dict[int, float], notes: list[str], backend: BackendFactory,
                 microbatches: int | None = None, record: bool = False):
        self.sc, self.plan, self.lowered = sc, sc.plan, lowered
        # micro-batches per pipeline simulated (fewer than the plan's in a shortened step)
        self.microbatches = sc.plan.num_microbatches if microbatches is None else microbatches
        self.extended = 0.0  # simulated seconds the periodic extension added (engine.periodic)
        self.full, self.keep_spans, self.notes = full, keep_spans, notes
        self.env = kernel.Environment()
        self.network = backend(self.env, sc, net, not full)  # replicas alike unless all are simulated
        self.spans: list[tuple] = []
        self.stragglers = stragglers
        replicas = range(self.plan.dp) if full else range(1)
        self.slices = [self._slice(d, s) for d in replicas for s in range(self.plan.pp)]
        if record:
            for sl in self.slices:
                sl.record = []

    def _slice(self, replica: int, stage: int) -> Slice:
        plan, gpn = self.plan, self.sc.cluster.gpus_per_node
        ranks = tuple(rank_of(RankCoord(replica, stage, c, t), plan)
                      for c in range(plan.cp) for t in range(plan.tp))
        factor = max(max(self.stragglers.get(r, 1.0), self.stragglers.get(-(r // gpn) - 1, 1.0)) for r in ranks)
        return Slice(replica, stage, ranks if self.full else ranks[:1], factor)

    def span(self, sl: Slice, stream: str, name: str, start: float, end: float, category: str) -> None:
        if self.keep_spans and end > start:
            for r in sl.ranks:
                self.spans.append((r, stream, name, start, end, category))

    def group(self, replica: int, axis: str) -> tuple[int, ...]:
        """Simulated replicas in ``replica``'s group along a data-parallel axis."""
        if not self.full:
            return (0,)
        plan = self.plan
        if axis == "dp_shard":
            base = replica // plan.dp_shard * plan.dp_shard
            return tuple(range(base, base + plan.dp_shard))
        if axis == "dp_replica":
            return tuple(range(replica % plan.dp_shard, plan.dp, plan.dp_shard))
        return tuple(range(plan.dp))
