"""Model FLOPs (2 per multiply-add), forward + backward, and recomputation FLOPs separately.

Per token and layer the forward pass costs 2*(QKV + output + MLP weights) + 4*s*h for the
attention scores and the weighted sum (QK^T and AV, counted over the whole s x s square as
Megatron-LM, PaLM and MosaicML do). Backward costs twice the forward (Narayanan et al. SC'21,
sec 5.1). With the GPT defaults this gives exactly the Megatron-LM count
96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) once the recompute forward pass is added
(Narayanan et al. SC'21, eq. 3).
"""

from __future__ import annotations

from simdist.analytic.attention import attention_core_flops_per_token as _core
from simdist.analytic.attention import attention_linear_flops_per_token
from simdist.analytic.moe import active_ffn_flops_per_token
from simdist.spec.layers import DENSE, LayerKind, layer_kind, model_kind_counts
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def layer_forward_flops_per_token(m: ModelSpec, kind: LayerKind = DENSE) -> float:
    """One layer's forward FLOPs per token: projections, the attention core (over the whole
    square, or a window's band in the same convention: simdist.analytic.attention) and the FFN
    (a MoE layer counts its active parameters: router, top-k routed and shared experts)."""
    if kind.moe:
        ffn = active_ffn_flops_per_token(m)
    else:
        n_in = 2 if m.mlp == "swiglu" else 1
        ffn = 2 * (n_in + 1) * m.hidden_size * m.ffn_hidden_size
    return attention_linear_flops_per_token(m) + ffn + _core(m, kind.window)


def layers_forward_flops_per_token(m: ModelSpec) -> float:
    """Every layer of the model, each by its kind (simdist.spec.layers)."""
    return sum(n * layer_forward_flops_per_token(m, k) for k, n in model_kind_counts(m))


def attention_core_flops_per_token(m: ModelSpec) -> float:
    """The s^2 part (scores and weighted sum): what selective recompute runs again."""
    return _core(m, False)


def head_forward_flops_per_token(m: ModelSpec) -> float:
    return 2 * m.hidden_size * m.vocab_size


def mtp_forward_flops_per_token(m: ModelSpec) -> float:
    """DeepSeek-V3's MTP modules: one layer of the last layer's kind, the (2h -> h) projection
    and the shared LM head each (as Megatron-LM's num_floating_point_operations counts them)."""
    if not m.mtp_layers:
        return 0.0
    h = m.hidden_size
    one = layer_forward_flops_per_token(m, layer_kind(m, m.num_layers)) + 2 * 2 * h * h
    return m.mtp_layers * (one + head_forward_flops_per_token(m))


def model_flops_per_token(m: ModelSpec) -> float:
    """Forward + backward model FLOPs per token (no recomputation)."""
    fwd = layers_forward_flops_per_token(m) + head_forward_flops_per_token(m) + mtp_forward_flops_per_token(m)
    return 3 * fwd


def model_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> float:
    return model_flops_per_token(m) * m.seq_length * plan.global_batch_size


def recompute_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> float:
    """Extra forward FLOPs that activation recomputation adds to one step."""
    tokens = m.seq_length * plan.global_batch_size
    if plan.recompute == "full":
        return layers_forward_flops_per_token(m) * tokens
    if plan.recompute == "selective" and not plan.flash_attention:
        return m.num_layers * attention_core_flops_per_token(m) * tokens
    return 0.0


def megatron_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> float:
    """Narayanan et al. SC'21 eq. 3 (assumes full recompute, GELU 4h MLP, MHA)."""
    B, s, L, h, V = plan.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
