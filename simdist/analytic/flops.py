"""Model FLOPs (2 per multiply-add), forward + backward, and recomputation FLOPs separately.

Per token and layer the forward pass costs 2*(QKV + output + MLP weights) + 4*s*h for the
attention scores and the weighted sum (QK^T and AV, counted over the whole s x s square as
Megatron-LM, PaLM and MosaicML do). Backward costs twice the forward (Narayanan et al. SC'21,
sec 5.1). With the GPT defaults this gives exactly the Megatron-LM count
96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) once the recompute forward pass is added
(Narayanan et al. SC'21, eq. 3).
"""

from __future__ import annotations

from simdist.analytic.ops import attention_keys
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def layer_forward_flops_per_token(m: ModelSpec) -> float:
    h, kv, s = m.hidden_size, m.kv_dim, m.seq_length
    q = m.num_attention_heads * m.head_dim  # = h unless head_dim is set apart (Qwen3, GPT-OSS)
    qkv_out = 2 * h * (q + 2 * kv) + 2 * q * h
    n_in = 2 if m.mlp == "swiglu" else 1
    mlp = 2 * (n_in + 1) * h * m.ffn_hidden_size * m.experts_per_token
    router = 2 * h * m.num_experts if m.num_experts > 1 else 0
    # QK^T and AV: 2*s*q each per token, over the keys a query sees (sliding windows: fewer)
    attention = 4 * attention_keys(m, s) * q
    return qkv_out + mlp + router + attention


def attention_core_flops_per_token(m: ModelSpec) -> float:
    """The s^2 part (scores and weighted sum): what selective recompute runs again."""
    return 4 * attention_keys(m, m.seq_length) * m.num_attention_heads * m.head_dim


def head_forward_flops_per_token(m: ModelSpec) -> float:
    return 2 * m.hidden_size * m.vocab_size


def model_flops_per_token(m: ModelSpec) -> float:
    """Forward + backward model FLOPs per token (no recomputation)."""
    fwd = m.num_layers * layer_forward_flops_per_token(m) + head_forward_flops_per_token(m)
    return 3 * fwd


def model_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> float:
    return model_flops_per_token(m) * m.seq_length * plan.global_batch_size


def recompute_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> float:
    """Extra forward FLOPs that activation recomputation adds to one step."""
    tokens = m.seq_length * plan.global_batch_size
    if plan.recompute == "full":
        return m.num_layers * layer_forward_flops_per_token(m) * tokens
    if plan.recompute == "selective" and not plan.flash_attention:
        return m.num_layers * attention_core_flops_per_token(m) * tokens
    return 0.0


def megatron_flops_per_step(m: ModelSpec, plan: ParallelPlan) -> float:
    """Narayanan et al. SC'21 eq. 3 (assumes full recompute, GELU 4h MLP, MHA)."""
    B, s, L, h, V = plan.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
