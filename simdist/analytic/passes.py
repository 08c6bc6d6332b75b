"""Pass times: an op list (:mod:`simdist.analytic.ops`) on one GPU, timed by the cost model, with
its TP/CP communication exposed at op granularity.

A collective hides behind the GEMM it may overlap with: ring attention's KV exchange behind the
attention compute it feeds, the backward data-grad all-reduce beside the weight-grad GEMM
(Megatron's async TP all-reduce), and every TP collective next to a GEMM with
``tp_comm_overlap`` (Megatron-Core / Transformer Engine userbuffers). A calibration profile may
add framework seconds per op and waits at the per-layer sync points (DTensor TP, FSDP2).
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
from simdist.frozen import frozen
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import on_cpu
from simdist.spec.scenario import Scenario
from simdist.spec.software_layers import HOOK_LAYERS, profile_layers, sync_points, wait_keys


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
        self.op_extra = _extras(sc, cost)
        self.recompute_extra = _extras(sc, cost, recompute=True)
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


def software_layers(sc: Scenario) -> tuple[str, ...]:
    """The software layers a calibration profile fits separately that this plan runs through
    ("tp", "zero3", ...: :func:`simdist.spec.software_layers.profile_layers`)."""
    return profile_layers(sc.plan)


def framework_overhead(sc: Scenario, cost: CostModel, recompute: bool = False, dtensor: bool = False) -> float:
    """Extra framework seconds per compute op that a calibration profile measured for the
    software layers this plan runs through; 0 otherwise. ``recompute``: per op of the forward
    that backward runs again, which does not pay the layers whose cost is in hooks around a
    module's forward (:data:`simdist.spec.profile.HOOK_LAYERS`). Tensor parallelism's term
    (:data:`DTENSOR_LAYER`) is paid only by ops on DTensors (``dtensor``), once for each DTensor op
    the executor runs for them (:func:`dtensor_ops`)."""
    over = cost.profile.framework_overheads_s if cost.profile else {}
    extra = sum(over.get(k, 0.0) for k in software_layers(sc) if k != SPLIT_LAYER
                and not (recompute and k in HOOK_LAYERS) and (dtensor or k != DTENSOR_LAYER))
    return max(extra, -cost.kernel_overhead)  # a layer cheaper per op than plain DDP, an op never below zero


def _extras(sc: Scenario, cost: CostModel, recompute: bool = False) -> tuple[float, float]:
    """:func:`framework_overhead` per op, and what each DTensor op adds to it (:func:`dtensor_ops`)."""
    plain = framework_overhead(sc, cost, recompute)
    return plain, framework_overhead(sc, cost, recompute, dtensor=True) - plain


# The layer whose per-op cost is DTensor's dispatch (torch.distributed.tensor: sharding propagation,
# and the redistributes a split linear's hooks make, in Python and C++ around each op on DTensors:
# hundreds of microseconds on a CPU). The ops the executor's layout (executor.parallelize.
# tensor_parallel_plan, Megatron's split as DTensor styles) runs on DTensors pay it, once per
# DTensor op (:func:`dtensor_ops`); the attention, the activations and the residual adds run on
# each rank's local tensors and do not. Priced per op of every kind, the GPT's layer came out as
# dear with sequence parallelism as without and the plain GPT's TP plans 11-21% slow in five of six
# calibrations; priced per op on DTensors, -16 to +8% (benchmarks/README.md, 2026-11-29).
#
# The executor's model (executor/model.py, executor/moe.py) runs what the op lists fuse as separate
# linears, each its own DTensor op: "qkv" as the q, k and v projections, SwiGLU's "fc1" as its gate
# and up projections. Counted so, DTensor's cost per op is one figure for both models: measured on
# this project's 2-core Intel guest (benchmarks/dtensor_layer.py, 2026-12-07, torch 2.13, 2 ranks;
# training-thread CPU per layer and micro-batch, forward and backward, less its ops at a calibrated
# profile's prices), at one and four sequences, with and without sequence parallelism, the tiny
# GPT's layer (6 linears) cost 213-245 us per DTensor op and the tiny Llama's (7) 211-239 us; per
# fused GEMM they were 307-341 and 365-411 us, so one term fitted on a GPT and a Llama plan priced
# every GPT layer dear and every Llama layer cheap. The larger GPT of local-tp-fit (4x the hidden
# size, 4-16x the tokens) costs 254-370 us per DTensor op: the per-op term is not all fixed.
DTENSOR_LAYER = "tp"


def dtensor_ops(op: Compute, m: ModelSpec, plan: ParallelPlan) -> int:
    """How many ops a tensor-parallel plan's executor runs on DTensors for ``op``: one per split
    linear its GEMM stands for (q, k, v, attention out, fc1/fc2 or gate/up/down, the LM head;
    forward and both gradients), one for the vocabulary-parallel embedding, with sequence
    parallelism one per norm on sequence shards, and without a pipeline two for each pass of the
    loss: the executor computes it vocabulary-parallel there (executor/train.py, DTensor's
    ``loss_parallel``: its log-softmax and NLL handlers, the forward's with three all-reduces on
    the training thread), where a pipeline's last stage gathers the logits and computes it on
    local tensors. 0 for the rest (the attention, the activations and the residual adds run on
    each rank's local tensors, the router on replicated weights).

    The loss on DTensors costs the training thread 1.2-1.9 ms more per micro-batch than on the
    gathered logits (this project's 2-core Intel guest, 2026-12-07, 2 ranks: the tiny GPT, the
    tiny Llama, local-tp-fit's GPT), about four DTensor ops' worth."""
    if plan.tp == 1:
        return 0
    if op.kind == "gemm":
        if op.name.startswith("router"):
            return 0
        if op.name in ("qkv (k part)", "fc1 (w3 part)"):  # one linear of a fused op (ops._unsaved_matmuls)
            return 1
        linear = op.name.split(" ", 1)[0]  # "qkv wgrad" -> "qkv"
        return 3 if linear == "qkv" else 2 if linear == "fc1" and m.mlp == "swiglu" else 1
    if op.name.startswith("cross entropy"):
        return 2 if plan.pp == 1 else 0
    return int(op.name.startswith("embedding") or (plan.sequence_parallel and op.name.startswith(("norm", "final norm"))))


SPLIT_LAYER = "split_backward"  # its per-op term is paid in the weight pass only: split_weight_pass_s


def split_weight_pass_s(sc: Scenario, cost: CostModel) -> float:
    """Host seconds that zero-bubble's split backward adds per backward compute op of a chunk
    past virtual stage 0, in its weight pass (a profile's ``framework_overheads_s
    ["split_backward"]``, at least 0; 0 without a profile or a split backward).

    torch.distributed.pipelining splits a chunk's backward in Python (torch 2.13,
    distributed/pipelining/_backward.py): the input pass walks the chunk's autograd graph to
    group its weights by the intermediate nodes they hang from (``construct_reverse_graph``,
    ``get_param_groups``) and hooks those nodes; the weight pass runs one autograd traversal per
    group (``stage_backward_weight``). Virtual stage 0 has no input gradient: its backward runs
    whole in the weight pass (``_PipelineStageBase.backward_one_chunk``), at no extra cost. So
    the cost follows the chunk's graph, not the micro-batch: on this project's 2-core guest the
    tiny GPT's last stage (35 weights in 18 groups) took 0.6 ms for a plain backward of one
    micro-batch and 1.6 ms split, 0.8 and 2.0 ms at twice the micro-batch."""
    if not sc.plan.split_backward or cost.profile is None:
        return 0.0
    return max(0.0, cost.profile.framework_overheads_s.get(SPLIT_LAYER, 0.0))


def sync_wait_part(plan: ParallelPlan) -> str:
    """The breakdown part the sync-point waits belong to: the TP/CP collectives that are the
    sync points, or (ZeRO-3 without them) the parameter gathers."""
    return "tp_comm" if plan.tp * plan.cp > 1 else "dp_comm"


def sync_wait_fraction(sc: Scenario, cost: CostModel) -> float:
    """Wait at the per-layer sync points of this plan per second of compute (profile's
    ``sync_wait_fractions`` of its software layers); 0 otherwise."""
    fr = cost.profile.sync_wait_fractions if cost.profile else {}
    return sum(fr.get(k, 0.0) for k in wait_keys(sc.plan))


def sync_call_wait(sc: Scenario, cost: CostModel) -> float:
    """Fixed wait per collective call of a layer's op lists (TP, CP and expert-parallel; a ring's
    send/receive counts twice, as simdist.analytic.cpu_syncs counts sync points) that a
    calibration profile measured for this plan's software layers (``sync_point_waits_s``; the
    pipeline's layers' are per pipeline transfer, :func:`transfer_wait`, FSDP2's per collective
    of its own, :func:`gather_wait`); 0 otherwise."""
    return _point_waits(sc, cost, "call")


def transfer_wait(sc: Scenario, cost: CostModel) -> float:
    """Fixed wait per pipeline transfer (activation or gradient between stages) that a
    calibration profile measured for this plan's pipeline layers (``sync_point_waits_s`` of
    :data:`simdist.spec.profile.TRANSFER_TERMS`: the pipeline's, and the multi-chunk schedules'
    on top): on gloo the receiving rank sleeps in the transfer and is woken when it completes, a
    cost of each transfer whatever the micro-batch's compute, which a share of compute would
    price wrongly at other sizes; 0 without a profile."""
    return _point_waits(sc, cost, "transfer")


def gather_wait(sc: Scenario, cost: CostModel) -> float:
    """Fixed wait per FSDP2 collective (a module's all-gather before its forward and before its
    backward, its gradients' reduce-scatter after it) that a calibration profile measured for
    the plan's FSDP2 layers (``sync_point_waits_s`` of :data:`HOOK_LAYERS`): on gloo the rank
    sleeps in each until gloo's thread wakes it, whatever the module's compute, which a share of
    compute priced wrongly at other sizes (a tiny ZeRO-3 plan's waits 27% of its compute, and
    the large one's far less); 0 without a profile."""
    return _point_waits(sc, cost, "gather")


def _point_waits(sc: Scenario, cost: CostModel, where: str) -> float:
    """The profile's ``sync_point_waits_s`` of this plan's layers whose sync points are ``where``:
    pipeline transfers ("transfer"), FSDP2's collectives ("gather") or the collective calls of
    the layers' op lists ("call")."""
    per_point = cost.profile.sync_point_waits_s if cost.profile else {}
    return sum(per_point.get(k, 0.0) for k in wait_keys(sc.plan) if sync_points(k) == where)
