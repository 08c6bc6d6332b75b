"""Memory of what contract v1.2 adds: expert weights and their states sharded by expert and
expert-data parallelism, dense states sharded over the context-parallel ranks too, activations
of MLA, windowed and MoE layers, dispatcher buffers and context parallelism's K/V blocks.
:mod:`simdist.analytic.memory` calls these for the models and plans that need them.

Model states (Megatron-Core's distributed optimizer, --use-distributed-optimizer; torchtitan's
FSDP over ``dp_shard_cp``): dense parameters are replicated over dp*cp ranks, so ZeRO shards
their states over dp_shard*cp; routed experts are split over ep (and each over etp) and
replicated over the expert-data-parallel group of tp*cp*dp/(etp*ep) ranks, which shards their
states (parallel_state's expert data-parallel group; Megatron-LM's theoretical memory formula
divides the expert states the same way, training/theoretical_memory_usage.py).

Activations per layer and micro-batch, on one GPU, after Korthikanti et al. 2022 Table 2 (see
simdist.analytic.memory.layer_activation_bytes, whose dense terms these keep):
- attention with head dimension d: Q, K, V (a*d + 2*kv_heads*d) and the attention output (a*d);
  MLA: the replicated down-projection outputs and their normalised copies (2*(q_lora_rank +
  kv_lora_rank + rotary dims)) and, TP-sharded, per-head Q and K (d + rotary dims), V and the
  output (v_head_dim);
- a MoE FFN, as Megatron-LM's theoretical memory formula counts it (training/
  theoretical_memory_usage.py, sparse MLP terms): the fp32 router logits and probabilities
  (2*4*T*E), the permuted token copies the experts read (rows*h) and their hidden activations
  (SwiGLU: the gate and up outputs and the activation's output, 3 x rows x moe_ffn/etp; GELU 2x),
  with rows = T*k*(busiest rank's load)*etp (simdist.analytic.moe); the gate weights are applied
  inside the fused unpermute, so the expert outputs are not kept; the shared experts as a dense
  FFN.
"""

from __future__ import annotations

from simdist.analytic.attention import attended_keys
from simdist.analytic.context import kv_block_bytes
from simdist.analytic.eager import mlp_hidden_saved
from simdist.analytic.moe import local_experts, rank_load_factor, routed_tokens
from simdist.analytic.params import (
    expert_params_per_rank,
    layer_params,
    params_per_rank,
    routed_params,
    stage_layers,
)
from simdist.spec.groups import expert_data_parallel_size
from simdist.spec.layers import LayerKind, layer_kind
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def state_params(m: ModelSpec, plan: ParallelPlan, stage: int, sharded: bool) -> float:
    """Parameters whose state (weights, gradients or optimizer states) one GPU of ``stage``
    keeps: all it holds, or with ZeRO sharding its shard of the dense ones (over dp_shard*cp)
    and of the experts (over the expert-data-parallel group)."""
    n = params_per_rank(m, plan, stage)
    if not sharded:
        return float(n)
    experts = expert_params_per_rank(m, plan, stage) if m.is_moe else 0
    if not experts and plan.cp == 1:
        return n / plan.dp_shard
    return (n - experts) / (plan.dp_shard * plan.cp) + experts / expert_data_parallel_size(plan)


def layer_state_params(m: ModelSpec, plan: ParallelPlan) -> float:
    """The largest layer's parameters on one GPU (a ZeRO-3 gather unit)."""
    if not m.is_moe:
        return layer_params(m).per_tp_rank(plan.tp)
    dense = layer_params(m, True).per_tp_rank(plan.tp) - routed_params(m).per_tp_rank(plan.tp)
    experts = routed_params(m).per_tp_rank(plan.etp) // plan.ep
    return max(layer_params(m).per_tp_rank(plan.tp), dense + experts)


def _attention_bytes(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, recompute: str) -> tuple[float, float]:
    """(replicated over TP, sharded over TP) attention activations beyond the norms' inputs;
    selective recompute runs MLA's up projections again (``mla_up_proj``): only the output stays."""
    e = plan.element_bytes
    sb = m.seq_length // plan.cp * plan.micro_batch_size
    a = m.num_attention_heads
    if m.attention == "mla":
        r = m.qk_rope_head_dim
        replicated = 2 * e * sb * (m.q_lora_rank + m.kv_lora_rank + r)
        heads = m.v_head_dim if recompute == "selective" else 2 * (m.head_dim + r) + 2 * m.v_head_dim
        return replicated, e * sb * a * heads
    qd = a * m.head_dim
    return 0.0, e * sb * (qd + 2 * m.kv_dim + qd)


def _core_bytes(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, recompute: str) -> float:
    s, b, a = m.seq_length // plan.cp, plan.micro_batch_size, m.num_attention_heads
    if plan.flash_attention or plan.cp > 1:
        return 4 * a * s * b  # fp32 log-sum-exp per row
    if recompute == "selective":
        return 0.0
    e = plan.element_bytes
    keys = attended_keys(m, kind.window)
    return (e + (1 + e if m.dropout else 0)) * a * s * keys * b


def _routed_bytes(m: ModelSpec, plan: ParallelPlan, recompute: str) -> float:
    """Selective recompute runs the experts' activation again (``moe_act``): its output goes."""
    e, h, k = plan.element_bytes, m.hidden_size, m.experts_per_token
    t = routed_tokens(m, plan)
    rows = t * k * rank_load_factor(m, plan) * plan.etp
    kept = (3 if m.mlp == "swiglu" else 2) - (1 if recompute == "selective" else 0)
    hidden = kept * rows * (m.moe_ffn_hidden_size // plan.etp) * e
    return 2 * 4 * t * m.num_experts + rows * h * e + hidden


def layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, kind: LayerKind,
                           recompute: str | None = None) -> float:
    """Activations one layer of ``kind`` saves for backward, per micro-batch, on one GPU."""
    recompute = plan.recompute if recompute is None else recompute
    t, e = plan.tp, plan.element_bytes
    s, b, h = m.seq_length // plan.cp, plan.micro_batch_size, m.hidden_size
    sbh = s * b * h
    split = t if (plan.sequence_parallel and t > 1) else 1
    if recompute == "full":
        return e * sbh / split
    drop = 2 * sbh if m.dropout else 0
    replicated = 2 * e * sbh + 2 * e * sbh + drop  # norms' inputs, attention and FFN inputs
    attn_rep, attn_sharded = _attention_bytes(m, plan, kind, recompute)
    sharded = attn_sharded + _core_bytes(m, plan, kind, recompute)
    routed = 0.0
    if kind.moe:
        routed = _routed_bytes(m, plan, recompute)
        f = m.num_shared_experts * m.moe_ffn_hidden_size
    else:
        f = m.ffn_hidden_size
    sharded += (len(mlp_hidden_saved(m.mlp, plan)) + 1) * e * s * b * f  # + the last GEMM's input
    return replicated / split + attn_rep + sharded / t + routed


def stage_layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Mean activations per layer over the layers of ``stage`` (layer kinds differ)."""
    layers = stage_layers(m, plan, stage) or (0,)
    return sum(layer_activation_bytes(m, plan, layer_kind(m, i)) for i in layers) / len(layers)


def largest_layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, recompute: str) -> float:
    """The largest layer's activations (what a recomputed layer holds during its backward)."""
    kinds = {layer_kind(m, i) for i in range(m.num_layers)}
    return max(layer_activation_bytes(m, plan, k, recompute) for k in kinds)


def mtp_activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int, head_bytes: float) -> float:
    """The MTP modules' activations on the last stage: one layer each, its projection's input
    and its own logits (``head_bytes``: the LM head's, one micro-batch's worth)."""
    if not m.mtp_layers or stage != plan.pp - 1:
        return 0.0
    e = plan.element_bytes
    sbh = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size
    one = layer_activation_bytes(m, plan, layer_kind(m, m.num_layers)) + 2 * e * sbh
    return m.mtp_layers * (one + head_bytes)


def buffer_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Transient buffers of one layer: the dispatcher's received tokens and the combine's
    input (2*rows*h), and context parallelism's K/V in flight: a ring's next block beside the
    current one (two blocks, K/V and their gradients in backward), or every rank's K/V after an
    all-gather."""
    out = 0.0
    e = plan.element_bytes
    if m.is_moe and (plan.ep > 1 or plan.etp > 1):
        rows = routed_tokens(m, plan) * m.experts_per_token * rank_load_factor(m, plan) * plan.etp
        out += 2 * rows * m.hidden_size * e * (1 if local_experts(m, plan) == 1 else 2)
    if plan.cp > 1:
        kv = kv_block_bytes(m, plan)
        out += {"ring": 4 * kv, "allgather": plan.cp * kv}.get(plan.cp_method, 2 * kv)
    return out
