"""What a described step assumed about its framework and its collectives, in plain sentences for
the prediction's assumptions: the framework whose defaults and rules apply, the FP8 recipe, the
gradient bucket rule, and the algorithm and protocol NCCL's tuning model picks for each collective kind on each
plan axis (at the size of that kind's largest call)."""

from __future__ import annotations

from simdist.analytic import eager, fp8, host, moe
from simdist.analytic.collectives import collective_choice, layout_for_axis
from simdist.analytic.cost import TRITON_FA_SLOWDOWN
from simdist.analytic.ops import Comm, embedding_ops, head_ops, layer_ops
from simdist.analytic.overlap import bucket_rule_text, compute_slowdown
from simdist.analytic.stage import StepDescription
from simdist.spec.cluster import GpuSpec
from simdist.spec.frameworks import attention_kernel, framework_of, recompute_early_stop
from simdist.spec.plan import ParallelPlan
from simdist.units import GiB


def _size(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= GiB else f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 \
        else f"{nbytes / 1024:.0f} KiB"


_KERNELS = {"flash2": "FlashAttention-2 (SDPA / flash-attn)", "cudnn": "Transformer Engine's cuDNN fused attention",
            "triton": "FlashAttention in Triton (FlashAttention-2 paper: 1.3-2.5x slower)"}


def attention_kernel_line(plan: ParallelPlan, gpu: GpuSpec) -> str:
    k = attention_kernel(plan)
    origin = "as set" if plan.attention_kernel else "the framework's default"
    speed = {"cudnn": gpu.fused_attention_speedup, "triton": 1 / TRITON_FA_SLOWDOWN}.get(k, 1.0)
    return f"attention kernel {k} ({_KERNELS[k]}, {origin}): {speed:.2f}x FlashAttention-2's speed on {gpu.name}"


def framework_lines(d: StepDescription) -> list[str]:
    plan = d.plan
    out = []
    if plan.framework:
        fw = framework_of(plan.framework)
        policy = {"attention-core": "the attention core (Megatron)",
                  "op-level": "every second matmul and the elementwise ops (per-op selective AC)"}
        out.append(f"framework {fw.name}: {fw.description}; its defaults fill the plan fields the scenario leaves "
                   f"unset; recompute: selective recomputes {policy[fw.selective_recompute]}")
    if plan.recompute == "full" and recompute_early_stop(plan):
        origin = "as set" if plan.recompute_early_stop is not None else "the framework's default"
        out.append(f"recompute full stops early ({origin}): PyTorch's non-reentrant checkpoint re-runs each layer "
                   "only up to the last tensor backward saved, so a 16-bit down-projection is not run again")
    if plan.flash_attention:
        out.append(attention_kernel_line(plan, d.scenario.cluster.gpu))
    if not eager.fused(plan):
        origin = "as set" if plan.fused_elementwise is not None else "the framework's default"
        out.append(f"elementwise ops eager ({origin}): one kernel per PyTorch op, RMSNorm {eager.RMSNORM:g}x, RoPE "
                   f"{eager.ROPE:g}x, SwiGLU {eager.SWIGLU['fwd']:.2g}x the fused HBM traffic")
    if plan.precision == "fp8":
        out.append(fp8.description(plan, d.scenario.cluster.gpu.name))
    dp = d.stages[0].dp
    if plan.dp > 1 and dp.step_grad_sync:
        out.append(f"gradient buckets: {bucket_rule_text(plan)}, {dp.step_buckets} per stage"
                   + ("" if plan.overlap_grad_reduce else " (one buffer after backward: no overlap)")
                   + (f"; the compute beside them runs {slowdown:.1%} slower (Lee et al. 2025)"
                      if plan.overlap_grad_reduce and not plan.interleaved
                      and (slowdown := compute_slowdown(d.cost.profile)) else ""))
    elif plan.dp > 1 and dp.microbatch_grad_sync:
        out.append("gradient buckets: one per wrapped module (transformer layer), reduce-scattered as backward "
                   "produces it (FSDP / ZeRO-2/3)")
    return out


def collective_lines(d: StepDescription) -> list[str]:
    """One line naming, per plan axis and collective kind, what NCCL's model runs its largest
    call with."""
    sc, net = d.scenario, d.net
    m, plan = sc.model, sc.plan
    largest: dict[tuple[str, str], float] = {}
    ops = [op for phase in ("fwd", "bwd") for f in (layer_ops, embedding_ops, head_ops) for op in f(m, plan, phase)]
    for op in ops:
        if isinstance(op, Comm) and op.collective != "sendrecv":
            key = (op.axis, op.collective)
            largest[key] = max(largest.get(key, 0.0), op.bytes)
    dp = d.stages[0].dp
    for c in dp.fwd_gathers + dp.bwd_gathers + dp.microbatch_grad_sync + dp.step_grad_sync + dp.post_step_gathers:
        key = (c.axis, c.kind)
        largest[key] = max(largest.get(key, 0.0), c.bytes)
    parts = []
    for (axis, kind), nbytes in sorted(largest.items()):
        g = layout_for_axis(sc.cluster, plan, axis)
        if g.size <= 1 or nbytes <= 0:
            continue
        choice = collective_choice(kind, nbytes, g, net)
        where = f"{g.size} GPUs in {g.nodes} node{'s' if g.nodes > 1 else ''}"
        parts.append(f"{axis} {kind} {_size(nbytes)} over {where}: {choice.label}")
    if not parts:
        return []
    model = "NCCL's tuning model (NCCL 2.30 tuning.cc)" if net.nccl else "alpha-beta on the profile's measured links"
    return [f"collective algorithms ({model}, largest call of each kind): " + "; ".join(parts)]


def moe_lines(d: StepDescription) -> list[str]:
    """The MoE layer's host reads and the SMs its dispatcher takes (simdist.analytic.host, moe)."""
    m, plan = d.scenario.model, d.scenario.plan
    if not m.is_moe:
        return []
    parts = []
    if host.syncs_per_forward(m, plan):
        gap = host.drain_gap(moe.dispatch_overlapped(plan), d.cost.profile)
        idle = (f"the GPU idle {gap * 1e6:.0f} us more while the host prepares the next launch (measured), "
                if gap else "the paired micro-batch's queued kernels keep the GPU busy meanwhile, ")
        parts.append(f"dropless routing: the host reads the tokens per expert once per MoE forward, draining the "
                     f"GPU queue ({host.SYNC_ROUND_TRIP_S * 1e6:.0f} us round trip, {idle}then "
                     f"{host.HOST_ISSUE_S * 1e6:.0f} us of host time per kernel until the host is ahead again)")
    else:
        parts.append("expert inputs padded to capacity: no host read of the tokens per expert")
    if moe.dispatch_overlapped(plan):
        parts.append("each layer's forward paired with another micro-batch's backward node by node (combined 1F1B): "
                     "an all-to-all hides only behind the compute node paired with it")
        stretch = moe.overlap_stretch(plan, d.scenario.cluster, d.cost.profile)
        parts.append(f"compute beside the overlapped dispatch loses {stretch:.2f} s per second hidden (the "
                     f"{moe.dispatcher_sms(plan, d.scenario.cluster)} SMs of the dispatcher's kernels and their "
                     f"HBM traffic, measured end to end)")
    if moe.expert_bias_ops(m, plan, 1, 1, False):
        n = moe.local_experts(m, plan)
        parts.append(f"the experts' output bias added expert by expert in eager PyTorch (Megatron-Core's TEGroupedMLP): "
                     f"{2 * n + 1} kernels forward, {5 * n + 2} backward per MoE layer")
    if m.moe_router_group_topk < m.moe_router_groups:
        parts.append(f"group-limited routing: experts from {m.moe_router_group_topk} of {m.moe_router_groups} groups")
    return ["mixture of experts: " + "; ".join(parts)]


def step_lines(d: StepDescription) -> list[str]:
    return framework_lines(d) + moe_lines(d) + collective_lines(d)
