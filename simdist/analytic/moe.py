"""Mixture-of-experts layers: their parameters, and what one GPU runs for one MoE FFN block.

The block (Megatron-Core's MoELayer with the alltoall token dispatcher, core/transformer/moe/;
Fedus et al. 2022 for top-k routing; DeepSeek-V3 sec 2.1.2 for shared experts):

1. router: a (hidden x experts) GEMM on the rank's tokens, a softmax or sigmoid and a top-k;
2. permute: each token copied once per chosen expert, grouped by destination;
3. dispatch: an all-to-all over the expert-parallel group (``moe_dispatcher: alltoall``), or an
   all-gather of every token of the group (``allgather``); with expert tensor parallelism an
   all-gather of the received tokens over ``etp``;
   With dropless routing the host reads the tokens per expert here (:mod:`simdist.analytic.host`:
   the split sizes of the all-to-all and of the grouped GEMM), which drains the GPU's queue;
4. the local experts (num_experts / ep of them) as grouped GEMMs, each FFN split over ``etp``
   (in FP8 under precision fp8, with the recipe's casts, like every transformer linear);
5. the way back: a reduce-scatter over ``etp``, the combine all-to-all (or a reduce-scatter for
   the all-gather dispatcher), and the unpermute that sums each token's k expert outputs
   weighted by its gates;
6. shared experts: a dense FFN of num_shared_experts x moe_ffn_hidden_size on every token,
   tensor-parallel like a dense FFN.

Dispatchers: ``alltoall`` sends every token copy to its expert's rank (Megatron-Core's
alltoall dispatcher over NCCL); ``flex`` (Megatron-Core's flex dispatcher with DeepEP or
HybridEP, DeepSeek-V3 sec 3.2.2) sends a token once to each other node that holds one of its
experts, over the NIC of the rank's rail, and forwards it inside that node over NVLink, so the
bytes that cross nodes shrink to the distinct destination nodes (:func:`wire_factor`);
``allgather`` gathers every token of the group.

Tokens: with tp > 1 Megatron-Core needs sequence parallelism for MoE, so each rank routes its
s/(cp*tp) sequence shard; without it, its s/cp tokens. Each rank sends T*k token copies and,
balanced, receives as many. Load imbalance (``moe_load_imbalance`` = the busiest expert's tokens
over the mean) makes the rank holding the busiest expert receive (x + n - 1)/n times the mean,
with n local experts and x the busiest expert's factor, capped by the capacity factor when
tokens are dropped (Fedus et al. 2022 sec 2.2); its experts and its all-to-all set the pace.
"""

from __future__ import annotations

import math

from simdist.analytic import fp8, host
from simdist.analytic.collectives import GroupLayout
from simdist.analytic.ops import Comm, Compute, Op, memory_op
from simdist.analytic.runtime_memory import nccl_channels
from simdist.spec.cluster import ClusterSpec
from simdist.spec.frameworks import expert_bias
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import CalibrationProfile, on_cpu


def active_ffn_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of one MoE FFN block per token: router, the k routed and the shared
    experts (the active parameters, as frameworks count them)."""
    n_in = 2 if m.mlp == "swiglu" else 1
    matrices = (n_in + 1) * m.hidden_size * m.moe_ffn_hidden_size
    return 2.0 * (matrices * (m.experts_per_token + m.num_shared_experts) + m.hidden_size * m.num_experts)


# --- what one rank runs ---------------------------------------------------------------------


def routed_tokens(m: ModelSpec, plan: ParallelPlan) -> int:
    """Tokens one rank routes per micro-batch (its sequence shard)."""
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    return tokens // plan.tp if plan.sequence_parallel and plan.tp > 1 else tokens


def local_experts(m: ModelSpec, plan: ParallelPlan) -> int:
    return max(1, m.num_experts // plan.ep)


def busiest_expert_factor(m: ModelSpec) -> float:
    """Tokens on the busiest expert over the mean, after capacity dropping."""
    x = m.moe_load_imbalance
    return min(x, m.moe_capacity_factor) if m.moe_capacity_factor is not None else x


def rank_load_factor(m: ModelSpec, plan: ParallelPlan) -> float:
    """Token copies the busiest rank's experts receive over the mean (see the module docstring)."""
    n = local_experts(m, plan)
    return (busiest_expert_factor(m) + n - 1) / n


DEEPEP_SMS = 20  # DeepSeek-V3 sec 3.2.2: 20 of H800's 132 SMs saturate IB and NVLink; DeepEP's default


def dispatch_overlapped(plan: ParallelPlan) -> bool:
    """Whether the dispatch and combine all-to-alls run beside another micro-batch's compute
    (``ep_comm_overlap``, or a DualPipe schedule's paired forward and backward)."""
    return plan.ep > 1 and (plan.ep_comm_overlap or plan.dualpipe)


def paired_hidden(fwd: tuple[float, float, float], fwd_comm: tuple[float, float],
                  bwd: tuple[float, float, float], bwd_comm: tuple[float, float]) -> float:
    """All-to-all seconds that one MoE layer's forward (one micro-batch) and backward (another)
    hide behind each other's compute when they run paired, as Megatron-Core's combined 1F1B
    schedule runs them (``--overlap-moe-expert-parallel-comm``; TransformerLayerSchedulePlan.run
    in megatron/core/models/common/model_chunk_schedule_plan.py). A layer is split into nodes:
    attention (through the router and the permute), dispatch, experts (mlp), combine; the
    backward layer's nodes run in reverse. One pair runs in three phases, the compute stream
    and the communication stream each in order, the streams joined at every phase's end::

        comm:    combine bwd | dispatch fwd -> dispatch bwd | combine fwd
        compute: attn fwd    | mlp bwd      -> mlp fwd      | attn bwd

    inside the middle phase the forward experts wait for the forward dispatch and the backward
    dispatch for the backward experts. Each all-to-all hides only behind the compute node it is
    paired with (DeepSeek-V3 sec 3.2.1, Fig. 4 splits a chunk the same way for DualPipe; PyTorch's
    DualPipeV overlap runs the forward and backward in lock-step at the same dispatch and combine
    boundaries, pytorch/torchtitan#1721).

    ``fwd`` / ``bwd``: compute seconds of the pass around its two all-to-alls, in the pass's own
    order: (before the first, between them, after the second), i.e. forward (attention, experts,
    unpermute and shared experts) and backward (their backward in reverse); what follows the
    last all-to-all of a layer runs on the compute stream with the next layer's first node.
    ``fwd_comm`` = (dispatch, combine), ``bwd_comm`` = (combine bwd, dispatch bwd)."""
    attn_f, mlp_f = fwd[0] + fwd[2], fwd[1]
    attn_b, mlp_b = bwd[0] + bwd[2], bwd[1]
    (d_f, c_f), (c_b, d_b) = fwd_comm, bwd_comm
    phase1 = max(c_b, attn_f)
    phase2 = max(max(mlp_b, d_f) + mlp_f, max(d_f, mlp_b) + d_b)
    phase3 = max(c_f, attn_b)
    exposed = phase1 + phase2 + phase3 - (attn_f + mlp_f + attn_b + mlp_b)
    return max(0.0, d_f + c_f + c_b + d_b - max(0.0, exposed))


def dispatcher_sms(plan: ParallelPlan, cluster: ClusterSpec) -> int:
    """SMs the dispatch and combine kernels occupy while they run: DeepEP's (and HybridEP's)
    communication kernels for the ``flex`` dispatcher (:data:`DEEPEP_SMS`), one CTA per NCCL
    channel for the all-to-all and all-gather dispatchers (NCCL runs a channel per thread
    block; :func:`simdist.analytic.runtime_memory.nccl_channels`). Compute that runs beside
    them (``ep_comm_overlap``, DualPipe) has the other SMs: simdist.analytic.passes."""
    if plan.moe_dispatcher == "flex":
        return DEEPEP_SMS
    return nccl_channels(cluster)


# Megatron-Bridge's Nsight comparison of Qwen3-30B-A3B pre-training on 16 H100 with and without
# the all-to-all overlap (skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md, "HybridEP
# Production-Shape Benchmark", 2026-07-25; BF16, TP1 PP1 EP16, micro-batch 1, HybridEP, the same
# 463,348 kernels per step in both runs): with the overlap, 3,959 ms of communication ran beside
# GEMMs and attention, and the GPU's active time fell by only 22.821 - 21.221 = 1,600 ms.
OVERLAP_CONCURRENT_S, OVERLAP_SAVED_S = 3.959, 22.821 - 21.221
OVERLAP_STRETCH = 1.0 - OVERLAP_SAVED_S / OVERLAP_CONCURRENT_S  # 0.596


def overlap_stretch(plan: ParallelPlan, cluster: ClusterSpec, profile: CalibrationProfile | None = None) -> float:
    """Seconds the compute stream loses per second of all-to-all hidden beside it.

    The dispatcher's kernels hold SMs (:func:`dispatcher_sms`: the compute beside them takes
    sms / (sms - c) times as long, c / (sms - c) lost per second), but that is not all they
    take: their copies load HBM and NVLink, and they run longer themselves beside compute (the
    profile above: communication kernels 8.25 s without the overlap, 10.83 s with it). Measured
    end to end, one second of communication beside GEMMs and attention saved 0.404 s of GPU time
    (:data:`OVERLAP_STRETCH` = 0.596 lost), three times what the SMs alone cost (DeepEP's 20 of
    132: 0.18). The same figure carries over to the other published overlapped steps: Megatron-
    MoE-ModelZoo's Qwen3-235B with DeepEP on 256 H100 (17.6 s, predicted -4%; -17% with the SM
    share alone) and Megatron-Bridge's Qwen3-30B SFT with the NCCL alltoall dispatcher (31.31 s,
    same skill page; predicted -6%, was -19%). It is Megatron-Core's combined 1F1B
    (``ep_comm_overlap``) that was measured; a DualPipe schedule alone keeps the SM share, as
    DeepSeek-V3 reports its all-to-all fully hidden with DeepEP's 20 SMs (sec 3.2.1-3.2.2). On
    CPUs under a gloo profile only the SM share applies (no HBM is shared)."""
    c = dispatcher_sms(plan, cluster)
    share = c / max(1, cluster.gpu.sms - c)
    if on_cpu(profile) or not plan.ep_comm_overlap:
        return share
    return max(share, OVERLAP_STRETCH)


def dispatch_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """The dispatch all-to-all's buffer on one rank (nccl-tests' S): T*k token copies."""
    return routed_tokens(m, plan) * m.experts_per_token * m.hidden_size * plan.element_bytes


def wire_factor(m: ModelSpec, plan: ParallelPlan, g: GroupLayout) -> float:
    """Bytes the ``flex`` dispatcher moves over the all-to-all's per byte the plain one moves:
    each token goes once to every other node holding one of its k experts, against k(n - g)/n
    copies leaving the node without it. A node receives it with probability 1 - P(none of its
    experts chosen) (:func:`node_missed`); the experts are spread evenly over the N nodes."""
    if plan.moe_dispatcher != "flex" or g.nodes <= 1 or not m.is_moe:
        return 1.0
    distinct = (g.nodes - 1) * (1.0 - node_missed(m, g.nodes))
    copies = m.experts_per_token * (g.size - g.ranks_per_node) / g.size
    return min(1.0, distinct / copies) if copies > 0 else 1.0


def _none_of(pool: float, avoid: float, k: int) -> float:
    """P(k experts drawn uniformly without replacement from ``pool`` miss ``avoid`` of them):
    C(pool - avoid, k) / C(pool, k)."""
    p = 1.0
    for i in range(k):
        p *= max(0.0, (pool - avoid - i) / (pool - i))
    return p


def node_missed(m: ModelSpec, nodes: int) -> float:
    """P(a token has none of its k experts on a given node), E experts evenly over ``nodes``.

    Uniform routing (what force-balanced benchmarks run): C(E - E/N, k) / C(E, k). Group-limited
    routing (DeepSeek-V3 sec 2.1.2, node-limited routing: each token's experts come from at most
    ``moe_router_group_topk`` of ``moe_router_groups`` expert groups, M = 4 of 8 so that a token
    reaches at most 4 nodes; Megatron-Core ``moe_router_num_groups`` / ``moe_router_group_topk``):
    the token picks T groups of G, then k experts among those T*E/G. A node holding q = G/N whole
    groups has i of the T chosen with the hypergeometric probability C(q,i) C(G-q,T-i) / C(G,T);
    a group spread over N/G nodes is chosen with probability T/G."""
    e, k = m.num_experts, m.experts_per_token
    groups, top = m.moe_router_groups, m.moe_router_group_topk
    per_node = e / nodes
    if groups <= 1 or top >= groups or (groups % nodes and nodes % groups):
        return _none_of(e, per_node, k)
    per_group = e / groups
    pool = top * per_group
    if groups >= nodes:
        q = groups // nodes
        total = math.comb(groups, top)
        return sum(math.comb(q, i) * math.comb(groups - q, top - i) / total * _none_of(pool, i * per_group, k)
                   for i in range(min(q, top) + 1))
    chosen = top / groups
    return (1.0 - chosen) + chosen * _none_of(pool, per_node, k)


# Transformer Engine's GroupedLinear (Megatron-Core's TEGroupedMLP) runs a grouped GEMM as one
# cuBLAS GEMM per expert, issued round-robin over a pool of compute streams (NVIDIA/
# TransformerEngine#853, "Grouped GEMM via multi-stream cuBLAS"; nvte_multi_stream_cublas_gemm in
# common/gemm/cublaslt_gemm.cu); the pool holds get_num_compute_streams() = 4 streams
# (common/util/multi_stream.cpp). The CUTLASS grouped kernel (NVTE_USE_CUTLASS_GROUPED_GEMM) is
# opt-in, BF16 only, and not what the published recipes set.
TE_GEMM_STREAMS = 4
MULTI_STREAM_FRAMEWORKS = ("megatron", "nemo")  # the TEGroupedMLP users among simdist's frameworks


def concurrent_experts(experts: int, plan: ParallelPlan | None) -> int:
    """Expert GEMMs that run side by side and share the SMs' waves: Transformer Engine's
    :data:`TE_GEMM_STREAMS` for Megatron-Core / NeMo, so the local experts run in rounds of that
    many GEMMs, each with its own M = the expert's tokens; a single grouped kernel over all of
    them otherwise (torch's grouped_mm under torchtitan, and simdist's default).

    Measured by Transformer Engine on H100 (NVIDIA/TransformerEngine#2045, BF16,
    general_grouped_gemm of TE 2.7, multi-stream cuBLAS): 8 experts x 4096 tokens (n 768, k 2048)
    628 TFLOP/s, 16 experts x 2048 tokens 554 TFLOP/s, the same FLOPs 12% slower when split over
    twice the experts. The shape model priced as rounds of four gives 0.92 (as one grouped kernel,
    1.0); the CUTLASS grouped kernel in the same PR loses 2%."""
    if plan is None or plan.framework not in MULTI_STREAM_FRAMEWORKS:
        return experts
    return min(experts, TE_GEMM_STREAMS)


def _rounds(experts: int, plan: ParallelPlan | None) -> list[int]:
    """The expert GEMMs of each round (:func:`concurrent_experts`): e.g. 16 -> [4, 4, 4, 4]."""
    per = max(1, concurrent_experts(experts, plan))
    full, rest = divmod(experts, per)
    return [per] * full + ([rest] if rest else [])


def _grouped(name: str, rows: float, n: int, k: int, experts: int, bwd: bool,
             plan: ParallelPlan | None = None, fp8_plan: bool = True) -> list[Op]:
    """A grouped GEMM: ``experts`` GEMMs of ``rows`` x k by k x n (fractional rows: a mean), in
    rounds of GEMMs that run at once (:func:`_rounds`; one op per round, ``batch`` = its GEMMs).
    With ``plan`` in FP8 the experts run in FP8 like every other transformer linear (Transformer
    Engine's GroupedLinear takes the FP8 recipe of the layer, Megatron-Core's TEGroupedMLP), with
    the recipe's casts of the routed tokens (or their gradients) and of the weights
    (:mod:`simdist.analytic.fp8`); the router stays in BF16 (``fp8_plan`` False)."""
    r = max(1, round(rows))
    fp8_on = fp8_plan and plan is not None and plan.precision == "fp8"
    rounds = _rounds(experts, plan)
    if not bwd:
        gemms: list[Op] = [Compute(name, "gemm", 2.0 * rows * n * k * b, m=r, n=n, k=k, batch=b, fp8=fp8_on,
                                   weight=float(n * k * b)) for b in rounds]
    else:
        gemms = [Compute(f"{name} wgrad", "gemm", 2.0 * rows * n * k * b, m=k, n=n, k=r, batch=b, fp8=fp8_on,
                         weight=float(n * k * b)) for b in rounds]
        gemms += [Compute(f"{name} dgrad", "gemm", 2.0 * rows * n * k * b, m=r, n=k, k=n, batch=b, fp8=fp8_on,
                          weight=float(n * k * b)) for b in rounds]
    if not fp8_on:
        return gemms
    cb = fp8.cast_bytes(plan)
    # batch: the kernels (each pays its launch gap, analytic.cost; and its host issue, analytic.host):
    # the routed tokens are quantized expert by expert under Transformer Engine (fp8.quantize_kernels);
    # the weights: Transformer Engine once per step (their launches amortised over the micro-batches:
    # counted as one kernel), torchao every micro-batch as one 3-D tensor of all experts (one kernel)
    weight = Compute(f"fp8 cast {name} weight", "memory",
                     bytes=cb * k * n * experts * fp8.weight_casts_per_microbatch(plan) / 2)
    operand = Compute(f"fp8 cast {name} {'grad' if bwd else 'input'}", "memory",
                      bytes=cb * rows * experts * (n if bwd else k), batch=fp8.quantize_kernels(plan, experts))
    # backward lists are reversed by the caller: the casts then run before their GEMMs
    return [*gemms, weight, operand] if bwd else [operand, weight, *gemms]


# Megatron-Core's TEGroupedMLP (core/transformer/moe/experts.py) builds the experts' fc2 with
# skip_bias_add and adds its bias in ``_apply_bias`` (since "Enable bias in expert mlp [gpt-oss
# 5/5]", NVIDIA/Megatron-LM a329dd6, September 2025; in every release core_v0.15 .. core_v0.19,
# December 2025 to August 2026, so in the NeMo 25.11 .. 26.04 containers), in eager PyTorch, one
# local expert at a time:
# ``torch.cat([t + b * p for t, b, p in zip(split(out), biases, split(probs))])``. Forward: per
# expert a multiply (b * p, written) and an add (t and b*p read, written), then the concatenation
# (read, written): 2n + 1 kernels and 6 passes of the routed tokens x hidden. Backward (autograd of
# the same graph): per expert grad*p and its sum over the tokens (the bias gradient), grad*b and
# its sum over hidden (the gate gradient), and the bias gradient added into Megatron's main_grad;
# then the split's backward, a concatenation of the tokens' gradients: 5n + 2 kernels, 8 passes.
# The gates are in the activations' dtype (the router's softmax ``type_as(logits)``, moe_utils.py).
# fc1's bias rides in the grouped GEMM's epilogue (skip_bias_add False); so do both under "fused"
# (one packed kernel: Megatron-Core's _apply_packed_bias, NVIDIA/Megatron-LM#6000, August 2026).
BIAS_PASSES = {False: (6, 2, 1), True: (8, 5, 2)}  # backward?: (passes, kernels per expert, more kernels)


def expert_bias_ops(m: ModelSpec, plan: ParallelPlan, rows: float, experts: int, bwd: bool) -> list[Op]:
    """The experts' output bias added expert by expert (:data:`BIAS_PASSES`), over ``rows`` routed
    token copies on ``experts`` local experts; nothing for models without biases or when fused.
    Named "experts ..." so the host issues its kernels one by one (passes.OpTimer._kernels)."""
    if not m.bias or expert_bias(plan) != "per_expert":
        return []
    passes, per_expert, more = BIAS_PASSES[bwd]
    return [Compute("experts fc2 bias" + (" bwd" if bwd else ""), "memory",
                    bytes=passes * rows * m.hidden_size * plan.element_bytes, batch=per_expert * experts + more)]


TOKEN_COUNTS = "allgather ep token counts"  # blocking, before the host reads them: never hidden


def routed_ops(m: ModelSpec, plan: ParallelPlan, bwd: bool) -> list[Op]:
    """Router, permute, dispatch, local experts, combine, unpermute (items 1-5 of the module
    docstring), in forward order; backward runs the same steps with gradients, GEMMs twice."""
    e, h, k = plan.element_bytes, m.hidden_size, m.experts_per_token
    t = routed_tokens(m, plan)
    ep, etp = plan.ep, plan.etp
    n_local = local_experts(m, plan)
    load = rank_load_factor(m, plan)
    rows = t * k * load * etp  # token copies the busiest rank's experts run (after the etp gather)
    scale = 2.0 if bwd else 1.0
    suffix = " bwd" if bwd else ""
    f = m.moe_ffn_hidden_size // etp
    n_in = 2 if m.mlp == "swiglu" else 1
    ops: list[Op] = []
    ops += _grouped("router", t, m.num_experts, h, 1, bwd, plan, fp8_plan=False)
    ops.append(memory_op("router top-k" + suffix, scale * 3 * t * m.num_experts * 4))
    reads = 0 if bwd else host.syncs_per_forward(m, plan)  # dropless: the tokens per expert read on the host
    if reads:
        if ep > 1 and plan.moe_dispatcher == "alltoall":  # every rank's counts gathered first (the
            # alltoall dispatcher's preprocess in Megatron-Core, gather_from_sequence_parallel_region
            # over the tp x ep group; executor.moe's all_gather): tiny, its latency a sync point
            ops.append(Comm(TOKEN_COUNTS, "allgather", "ep", ep * m.num_experts * 8))
        ops += [Compute("dispatcher host sync", "sync")] * reads  # simdist.analytic.host
    ops.append(memory_op("permute" + suffix, scale * (1 + k) * t * h * e))
    if ep > 1:
        if plan.moe_dispatcher == "allgather":
            ops.append(Comm("allgather ep dispatch", "allgather", "ep", t * ep * h * e))
        else:
            ops.append(Comm("alltoall ep dispatch", "alltoall", "ep", t * k * h * e * load))
    if etp > 1:
        ops.append(Comm("allgather etp tokens", "allgather", "etp", rows * h * e))
    if n_local > 1:
        ops.append(memory_op("sort by expert" + suffix, scale * 2 * rows * h * e))
    per_expert = rows / n_local
    ops += _grouped("experts fc1", per_expert, n_in * f, h, n_local, bwd, plan)
    ops.append(memory_op("expert activation" + suffix, scale * (n_in + 1) * rows * f * e,
                         f"{m.mlp} {'bwd' if bwd else 'fwd'}", rows * f))
    ops += _grouped("experts fc2", per_expert, h, f, n_local, bwd, plan)
    ops += expert_bias_ops(m, plan, rows, n_local, bwd)
    if n_local > 1:
        ops.append(memory_op("unsort" + suffix, scale * 2 * rows * h * e))
    if etp > 1:
        ops.append(Comm("reducescatter etp tokens", "reducescatter", "etp", rows * h * e))
    if ep > 1:
        if plan.moe_dispatcher == "allgather":
            ops.append(Comm("reducescatter ep combine", "reducescatter", "ep", t * ep * h * e))
        else:
            ops.append(Comm("alltoall ep combine", "alltoall", "ep", t * k * h * e * load))
    ops.append(memory_op("unpermute" + suffix, scale * (1 + k) * t * h * e))
    return ops
