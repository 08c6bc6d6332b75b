"""Pass times: an op list (:mod:`simdist.analytic.ops`) on one GPU, timed by the cost model, with
its TP/CP communication exposed at op granularity.

A collective hides behind the GEMM it may overlap with: ring attention's KV exchange behind the
attention compute it feeds, the backward data-grad all-reduce beside the weight-grad GEMM
(Megatron's async TP all-reduce), and every TP collective next to a GEMM with
``tp_comm_overlap`` (Megatron-Core / Transformer Engine userbuffers). A calibration profile may
add framework seconds per op and waits at the per-layer sync points (DTensor TP, FSDP2):
:mod:`simdist.analytic.profile_terms`.
"""

from __future__ import annotations

from simdist.analytic import fabric, host, overlap
from simdist.analytic.collectives import (
    GroupLayout,
    Network,
    collective_choice,
    collective_time,
    layout_for_axis,
)
from simdist.analytic.cost import CostModel
from simdist.analytic.fsdp2 import copy_ops, runs_fsdp2
from simdist.analytic.moe import (
    TOKEN_COUNTS,
    dispatch_overlapped,
    overlap_stretch,
    paired_hidden,
    wire_factor,
)
from simdist.analytic.ops import Comm, Compute, Op
from simdist.analytic.profile_terms import (
    dtensor_ops,
    extras,
    gather_wait,
    split_weight_pass_s,
    sync_call_wait,
    sync_wait_fraction,
)
from simdist.frozen import frozen
from simdist.spec.profile import on_cpu
from simdist.spec.scenario import Scenario


@frozen(slots=True)
class PassTime:
    """One pass (forward, backward or recompute) of some layers for one micro-batch on one GPU.

    ``ep`` is the expert all-to-all time alone (dispatch and combine, simdist.analytic.moe) and
    ``ep_hide`` the compute that may hide it (with ``ep_comm_overlap`` or a DualPipe schedule:
    another micro-batch's pass runs beside it); only what it cannot hide is exposed, counted over
    the layers added together. The hidden part costs compute time: the compute beside the
    dispatcher's kernels runs slower (simdist.analytic.moe.overlap_stretch)."""

    compute: float = 0.0
    tp_exposed: float = 0.0
    cp_exposed: float = 0.0
    weight_grad: float = 0.0  # the W part of backward (zero-bubble)
    sync_wait: float = 0.0  # waits at per-layer sync points for the slowest rank (sync_wait_fraction)
    ep: float = 0.0
    ep_hide: float = 0.0

    def __add__(self, o: PassTime) -> PassTime:
        return PassTime(self.compute + o.compute, self.tp_exposed + o.tp_exposed,
                        self.cp_exposed + o.cp_exposed, self.weight_grad + o.weight_grad,
                        self.sync_wait + o.sync_wait, self.ep + o.ep, self.ep_hide + o.ep_hide)

    def __mul__(self, k: float) -> PassTime:
        return PassTime(self.compute * k, self.tp_exposed * k, self.cp_exposed * k, self.weight_grad * k,
                        self.sync_wait * k, self.ep * k, self.ep_hide * k)

    @property
    def ep_exposed(self) -> float:
        return max(0.0, self.ep - self.ep_hide)

    @property
    def total(self) -> float:
        return self.compute + self.tp_exposed + self.cp_exposed + self.sync_wait + self.ep_exposed

    @property
    def comm_exposed(self) -> float:
        """Exposed TP, CP and expert-parallel communication."""
        return self.tp_exposed + self.cp_exposed + self.ep_exposed


ZERO_PASS = PassTime()


# SMs a Transformer Engine userbuffers kernel holds while it overlaps a TP collective with a GEMM
# (Megatron's --tp-comm-overlap; NeMo's H100 userbuffers configs): an all-gather as a ring
# exchange of peer copies (num_sm 1), a reduce-scatter as a chunked "pipeline" kernel (num_sm
# 24), a collective beside the wgrad/dgrad GEMM as a "bulk" copy (num_sm 2). The GEMM beside it
# runs on the other SMs.
USERBUFFERS_SMS = {"allgather": 1, "reducescatter": 24, "bulk": 2}


class OpTimer:
    """Times op lists of one scenario with one cost model and network (memoised per op list:
    every stage times the same layer)."""

    def __init__(self, sc: Scenario, cost: CostModel, net: Network):
        self.sc, self.cost, self.net = sc, cost, net
        self.contention = overlap.compute_slowdown(cost.profile)
        self._layouts: dict[str, GroupLayout] = {}
        self._passes: dict[tuple[Op, ...], PassTime] = {}
        # per op list with expert all-to-alls: compute (with exposed TP/CP) between them, and their times
        self._ep_parts: dict[tuple[Op, ...], tuple[tuple[float, ...], tuple[float, ...]]] = {}
        # framework seconds: (per op, per DTensor op the executor runs for it: dtensor_ops)
        self.op_extra = extras(sc, cost)
        self.recompute_extra = extras(sc, cost, recompute=True)
        self.split_op = split_weight_pass_s(sc, cost)
        self.sync_wait = sync_wait_fraction(sc, cost)
        self.call_wait = sync_call_wait(sc, cost)
        self.gather_wait = gather_wait(sc, cost)
        self.fsdp2 = runs_fsdp2(sc.plan, cost.profile)

    def fsdp2_copies(self, params: int) -> tuple[PassTime, PassTime]:
        """What an FSDP2 module of ``params`` parameters (on this rank, before sharding) adds
        to the forward and the backward of a micro-batch where it computes (simdist.analytic.
        fsdp2: the copy-out on a GPU, every copy on a CPU); nothing for other plans, nor in a
        pipeline, which gathers and reduces a module once a step (simdist.analytic.data_parallel)."""
        plan = self.sc.plan
        if not self.fsdp2 or params <= 0 or plan.pp > 1:
            return ZERO_PASS, ZERO_PASS
        fwd, bwd = copy_ops(plan, params, on_cpu=on_cpu(self.cost.profile))
        # the waits at its collectives: the gather before each pass (ZeRO-3: backward too), the
        # reduce-scatter after backward
        return (self.passes(fwd) + PassTime(sync_wait=self.gather_wait),
                self.passes(bwd) + PassTime(sync_wait=(1 + plan.shards_params) * self.gather_wait))

    def _slowdown(self, userbuffers: str | None) -> float:
        """How much slower a kernel runs beside a collective it hides: NCCL's share
        (:attr:`contention`), or, beside a TP collective that Transformer Engine's userbuffers
        kernel ``userbuffers`` overlaps, the SMs that kernel holds (:data:`USERBUFFERS_SMS`)."""
        if userbuffers is None or not self.contention:
            return self.contention
        return min(1.0, USERBUFFERS_SMS.get(userbuffers, 0) / self.sc.cluster.gpu.sms)

    def comm(self, op: Comm) -> float:
        """A TP/CP/EP collective on the links its group crosses, the other groups of the stage
        running theirs at the same time (simdist.analytic.fabric); the flex dispatcher's all-to-all
        sends each token once per node (simdist.analytic.moe.wire_factor)."""
        g = self._layouts.get(op.axis)
        if g is None:
            g = self._layouts[op.axis] = layout_for_axis(self.sc.cluster, self.sc.plan, op.axis)
        nbytes = op.bytes * wire_factor(self.sc.model, self.sc.plan, g) if op.axis == "ep" else op.bytes
        if g.intra_only or op.collective == "sendrecv":
            return collective_time(op.collective, nbytes, g, self.net)
        c = collective_choice(op.collective, nbytes, g, self.net)
        return c.latency_s + c.transfer_s * fabric.slowdown(self.sc.cluster, self.sc.plan, self.net, op.axis)

    def passes(self, ops: tuple[Op, ...]) -> PassTime:
        """Sum an op list; a comm hides behind the GEMM it may overlap with."""
        cached = self._passes.get(ops)
        if cached is None:
            cached = self._passes[ops] = self._sum(ops)
        return cached

    def recompute(self, ops: tuple[Op, ...]) -> PassTime:
        """:meth:`passes` of the forward that backward runs again (its ops' framework cost without
        the hook layers', :func:`framework_overhead`)."""
        if self.recompute_extra == self.op_extra:
            return self.passes(ops)
        return self._sum(ops, recompute=True)

    def split_weight(self, bwd_ops: tuple[Op, ...]) -> PassTime:
        """What zero-bubble's split backward adds to the weight pass of ``bwd_ops`` in a chunk
        past virtual stage 0: :func:`split_weight_pass_s` per compute op."""
        t = self.split_op * sum(1 for op in bwd_ops if isinstance(op, Compute) and op.kind != "sync")
        return PassTime(t, weight_grad=t, sync_wait=t * self.sync_wait) if t else ZERO_PASS

    def pair(self, fwd_ops: tuple[Op, ...], bwd_ops: tuple[Op, ...]) -> tuple[PassTime, PassTime]:
        """A layer's forward and backward. With the all-to-all overlapped (``ep_comm_overlap``,
        DualPipe), each micro-batch's forward runs paired with another's backward, node by node
        (simdist.analytic.moe.paired_hidden): an all-to-all hides only behind the compute node it
        is paired with, and what it cannot hide is exposed. The compute beside the hidden part
        loses simdist.analytic.moe.overlap_stretch seconds per second hidden (the dispatcher's
        SMs and HBM traffic, measured end to end)."""
        fwd, bwd = self.passes(fwd_ops), self.passes(bwd_ops)
        parts_f, parts_b = self._ep_parts.get(fwd_ops), self._ep_parts.get(bwd_ops)
        if (not dispatch_overlapped(self.sc.plan) or parts_f is None or parts_b is None
                or len(parts_f[1]) != 2 or len(parts_b[1]) != 2):
            return fwd, bwd
        hidden = paired_hidden(parts_f[0], parts_f[1], parts_b[0], parts_b[1])  # type: ignore[arg-type]
        slow = overlap_stretch(self.sc.plan, self.sc.cluster, self.cost.profile)
        out = []
        for p, (segs, _) in ((fwd, parts_f), (bwd, parts_b)):
            h = hidden * p.ep / (fwd.ep + bwd.ep) if fwd.ep + bwd.ep > 0 else 0.0
            compute = sum(segs) - p.tp_exposed - p.cp_exposed + h * slow
            out.append(PassTime(compute, p.tp_exposed, p.cp_exposed, p.weight_grad,
                                p.sync_wait + (compute - p.compute) * self.sync_wait, p.ep, h))
        return out[0], out[1]

    def _sum(self, ops: tuple[Op, ...], recompute: bool = False) -> PassTime:
        plan = self.sc.plan
        op_extra, dtensor_extra = self.recompute_extra if recompute else self.op_extra
        compute = tp = cp = w = ep = 0.0
        prev: Compute | None = None
        segments: list[float] = []  # compute-stream time before each expert all-to-all
        comms: list[float] = []
        for i, op in enumerate(ops):
            if isinstance(op, Compute) and op.kind == "sync":
                compute += (self.cost.time(op) + host.refill_idle(self._kernels(ops[i + 1:]))
                            + host.drain_gap(dispatch_overlapped(plan), self.cost.profile))
                continue
            if isinstance(op, Compute):
                t = self.cost.time(op) + op_extra + dtensor_ops(op, self.sc.model, plan) * dtensor_extra
                compute += t
                if op.name.endswith("wgrad"):
                    w += t
                if not _is_cast(op):
                    prev = op
                continue
            t = self.comm(op)
            if op.name == TOKEN_COUNTS:  # the host waits for it: exposed, not a dispatch to pair
                ep += t
                continue
            if op.axis == "ep":  # expert all-to-all: exposed unless another micro-batch hides it
                ep += t
                segments.append(compute + tp + cp - sum(segments))
                comms.append(t)
                continue
            hide, userbuffers = 0.0, None  # the userbuffers kernel that overlaps it, if any
            nxt = _next_compute(ops, i)
            if op.axis == "cp" and (op.collective == "sendrecv" or op.overlaps_next) and nxt is not None:
                hide = self.cost.time(nxt)  # ring attention overlaps KV exchange with compute
            elif prev is not None and prev.name.endswith("wgrad"):
                hide = self.cost.time(prev)  # async data-grad all-reduce beside the wgrad GEMM
                userbuffers = "bulk" if plan.tp_comm_overlap and op.axis == "tp" else None
            elif plan.tp_comm_overlap and nxt is not None and nxt.kind == "gemm":
                hide, userbuffers = self.cost.time(nxt), op.collective
            elif plan.tp_comm_overlap and prev is not None and prev.kind == "gemm":
                hide, userbuffers = self.cost.time(prev), op.collective
            exposed = max(0.0, t - hide)
            # the kernel that hides it runs slower beside it (NCCL takes SMs: Lee et al. 2025;
            # Transformer Engine's userbuffers the few SMs of their kernels; not gloo on a CPU)
            compute += self._slowdown(userbuffers) * min(t, hide)
            if op.axis == "cp":
                cp += exposed
            else:
                tp += exposed
        if comms and not recompute:  # pair()'s forward and backward
            self._ep_parts[ops] = ((*segments, compute + tp + cp - sum(segments)), tuple(comms))
        # on its own stream, beside everything the compute stream does (another micro-batch's
        # pass); a layer's forward and backward paired node by node: pair()
        hide_ep = compute + tp + cp if dispatch_overlapped(plan) and ep > 0.0 else 0.0
        if hide_ep > 0.0 and ep > 0.0:
            # the compute beside the dispatch and combine runs on the SMs and the HBM their
            # kernels leave it: it loses overlap_stretch seconds per second hidden
            slow = min(ep, hide_ep) * overlap_stretch(plan, self.sc.cluster, self.cost.profile)
            compute += slow
            hide_ep += slow
        calls = sum(2 if op.collective == "sendrecv" else 1 for op in ops if isinstance(op, Comm))
        return PassTime(compute, tp, cp, w, compute * self.sync_wait + calls * self.call_wait, ep, hide_ep)


    def _kernels(self, ops: tuple[Op, ...]) -> list[float]:
        """GPU durations of the kernels ``ops`` launch, in order: a grouped GEMM or cast of the
        experts one kernel per expert (``batch``: Transformer Engine's GroupedLinear issues one
        cuBLAS GEMM per local expert), a collective one kernel, anything else one."""
        out: list[float] = []
        for op in ops:
            if isinstance(op, Comm):
                out.append(self.comm(op))
                continue
            n = op.batch if op.name.startswith(("experts", "fp8 cast experts")) else 1
            out += [self.cost.time(op) / n] * n
        return out


def _is_cast(op: Compute) -> bool:
    """An FP8 quantization kernel: it sits between a collective and the GEMM the collective
    overlaps with, and hides nothing itself."""
    return op.kind == "memory" and op.name.startswith("fp8 cast")


def _next_compute(ops: tuple[Op, ...], i: int) -> Compute | None:
    """The compute op right after ops[i], past any FP8 casts (None when a collective comes first)."""
    for op in ops[i + 1:]:
        if not isinstance(op, Compute):
            return None
        if not _is_cast(op):
            return op
    return None
