"""Pass times: an op list (:mod:`simdist.analytic.ops`) on one GPU, timed by the cost model, with
its TP/CP communication exposed at op granularity.

A collective hides behind the GEMM it may overlap with: ring attention's KV exchange behind the
attention compute it feeds, the backward data-grad all-reduce beside the weight-grad GEMM
(Megatron's async TP all-reduce), and every TP collective next to a GEMM with
``tp_comm_overlap`` (Megatron-Core / Transformer Engine userbuffers). A calibration profile may
add framework seconds per op and waits at the per-layer sync points (DTensor TP, FSDP2).
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.analytic.collectives import GroupLayout, Network, collective_time, layout_for_axis
from simdist.analytic.cost import CostModel
from simdist.analytic.ops import Comm, Compute, Op
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import profile_layers
from simdist.spec.scenario import Scenario


@dataclass(frozen=True, slots=True)
class PassTime:
    """One pass (forward, backward or recompute) of some layers for one micro-batch on one GPU."""

    compute: float = 0.0
    tp_exposed: float = 0.0
    cp_exposed: float = 0.0
    weight_grad: float = 0.0  # the W part of backward (zero-bubble)
    sync_wait: float = 0.0  # waits at per-layer sync points for the slowest rank (sync_wait_fraction)

    def __add__(self, o: PassTime) -> PassTime:
        return PassTime(self.compute + o.compute, self.tp_exposed + o.tp_exposed,
                        self.cp_exposed + o.cp_exposed, self.weight_grad + o.weight_grad,
                        self.sync_wait + o.sync_wait)

    def __mul__(self, k: float) -> PassTime:
        return PassTime(self.compute * k, self.tp_exposed * k, self.cp_exposed * k, self.weight_grad * k,
                        self.sync_wait * k)

    @property
    def total(self) -> float:
        return self.compute + self.tp_exposed + self.cp_exposed + self.sync_wait

    @property
    def comm_exposed(self) -> float:
        """Exposed TP and CP communication."""
        return self.tp_exposed + self.cp_exposed


ZERO_PASS = PassTime()


class OpTimer:
    """Times op lists of one scenario with one cost model and network (memoised per op list:
    every stage times the same layer)."""

    def __init__(self, sc: Scenario, cost: CostModel, net: Network):
        self.sc, self.cost, self.net = sc, cost, net
        self._layouts: dict[str, GroupLayout] = {}
        self._passes: dict[tuple[Op, ...], PassTime] = {}
        self.op_extra = framework_overhead(sc, cost)
        self.sync_wait = sync_wait_fraction(sc, cost)

    def comm(self, op: Comm) -> float:
        """A TP/CP collective alone on the links its group crosses."""
        g = self._layouts.get(op.axis)
        if g is None:
            g = self._layouts[op.axis] = layout_for_axis(self.sc.cluster, self.sc.plan, op.axis)
        return collective_time(op.collective, op.bytes, g, self.net)

    def passes(self, ops: tuple[Op, ...]) -> PassTime:
        """Sum an op list; a comm hides behind the GEMM it may overlap with."""
        cached = self._passes.get(ops)
        if cached is None:
            cached = self._passes[ops] = self._sum(ops)
        return cached

    def _sum(self, ops: tuple[Op, ...]) -> PassTime:
        plan = self.sc.plan
        compute = tp = cp = w = 0.0
        prev: Compute | None = None
        for i, op in enumerate(ops):
            if isinstance(op, Compute):
                t = self.cost.time(op) + self.op_extra
                compute += t
                if op.name.endswith("wgrad"):
                    w += t
                prev = op
                continue
            t = self.comm(op)
            hide = 0.0
            nxt = ops[i + 1] if i + 1 < len(ops) and isinstance(ops[i + 1], Compute) else None
            if op.axis == "cp" and nxt is not None:
                hide = self.cost.time(nxt)  # ring attention overlaps KV exchange with compute
            elif prev is not None and prev.name.endswith("wgrad"):
                hide = self.cost.time(prev)  # async data-grad all-reduce beside the wgrad GEMM
            elif plan.tp_comm_overlap and nxt is not None and nxt.kind == "gemm":
                hide = self.cost.time(nxt)
            elif plan.tp_comm_overlap and prev is not None and prev.kind == "gemm":
                hide = self.cost.time(prev)
            exposed = max(0.0, t - hide)
            if op.axis == "cp":
                cp += exposed
            else:
                tp += exposed
        return PassTime(compute, tp, cp, w, compute * self.sync_wait)


def software_layers(sc: Scenario) -> tuple[str, ...]:
    """The software layers a calibration profile fits separately that this plan runs through
    ("tp", "zero3", ...: :func:`simdist.spec.profile.profile_layers`)."""
    return profile_layers(sc.plan)


def framework_overhead(sc: Scenario, cost: CostModel) -> float:
    """Extra framework seconds per compute op that a calibration profile measured for the
    software layers this plan runs through; 0 otherwise."""
    over = cost.profile.framework_overheads_s if cost.profile else {}
    return sum(over.get(k, 0.0) for k in software_layers(sc))


def sync_wait_part(plan: ParallelPlan) -> str:
    """The breakdown part the sync-point waits belong to: the TP/CP collectives that are the
    sync points, or (ZeRO-3 without them) the parameter gathers."""
    return "tp_comm" if plan.tp * plan.cp > 1 else "dp_comm"


def sync_wait_fraction(sc: Scenario, cost: CostModel) -> float:
    """Wait at the per-layer sync points of this plan per second of compute (profile's
    ``sync_wait_fractions`` of its software layers); 0 otherwise."""
    fr = cost.profile.sync_wait_fractions if cost.profile else {}
    return sum(fr.get(k, 0.0) for k in software_layers(sc))
