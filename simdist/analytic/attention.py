"""Attention variants: an explicit head dimension, multi-head latent attention (MLA) and sliding
windows; their parameters, FLOPs and op lists. Context parallelism's communication is in
:mod:`simdist.analytic.context`.

Shapes
- Multi-head / grouped-query attention with head dimension d: Q and O of a*d, K and V of
  kv_heads*d (Qwen3 and GPT-OSS have a*d != hidden; Megatron-LM's ``--kv-channels``).
- MLA (DeepSeek-V2, arXiv:2405.04434 sec 2.1; DeepSeek-V3 arXiv:2412.19437 sec 2.1.1; Megatron-
  Core's MLASelfAttention): queries through a low-rank W_DQ (hidden x q_lora_rank) with an
  RMSNorm and W_UQ (q_lora_rank x a*(d+r)) or one W_Q; keys and values through W_DKV (hidden x
  (kv_lora_rank + r), the r rotary key dims shared by all heads) with an RMSNorm and W_UKV
  (kv_lora_rank x a*(d+v)); output W_O (a*v x hidden). The down projections and their norms
  are replicated over tensor parallelism, the up projections column-parallel, W_O
  row-parallel. Scores use d+r dimensions per head, the weighted sum v.
- Sliding window w (Mistral; GPT-OSS's banded layers): each query sees the last w keys.

FLOPs follow the project's convention (simdist.analytic.flops): the attention core is counted
over the whole s x s square, i.e. twice what a causal kernel computes. A windowed layer's band
holds A = s*w - w(w-1)/2 (query, key) pairs against s(s+1)/2 for full causal attention, so in
the same convention each query "attends" 2A/s keys (s for full attention).
"""

from __future__ import annotations

from simdist.analytic.ops import Compute, _gemm, _linear
from simdist.analytic.params import mla_params
from simdist.spec.layers import LayerKind
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def q_head_dim(m: ModelSpec) -> int:
    """Dimensions per query (and key) head the scores are taken over."""
    return m.head_dim + (m.qk_rope_head_dim if m.attention == "mla" else 0)


def v_dim(m: ModelSpec) -> int:
    """Dimensions per value head (and per head of the attention output)."""
    return m.v_head_dim if m.attention == "mla" else m.head_dim


def attention_linear_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of the projections per token (2 per weight)."""
    if m.attention == "mla":
        p = mla_params(m)
        norms = m.kv_lora_rank + m.q_lora_rank
        return 2.0 * (p.total - norms)
    h, qd, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.kv_dim
    return 2.0 * (h * (qd + 2 * kv) + qd * h)


def attended_keys(m: ModelSpec, window: bool) -> float:
    """Keys per query in the full-square convention (see the module docstring)."""
    s = m.seq_length
    if not window or m.sliding_window is None or m.sliding_window >= s:
        return float(s)
    w = m.sliding_window
    return 2.0 * (s * w - w * (w - 1) / 2) / s


def attention_core_flops_per_token(m: ModelSpec, window: bool = False) -> float:
    """QK^T and AV per token, forward (full-square convention)."""
    keys = attended_keys(m, window)
    a = m.num_attention_heads
    return 2.0 * keys * a * (q_head_dim(m) + v_dim(m))


def is_variant(m: ModelSpec) -> bool:
    """The model's attention differs from the hidden-size MHA the dense op list prices."""
    return (m.attention == "mla" or m.num_attention_heads * m.head_dim != m.hidden_size
            or (m.sliding_window is not None and m.sliding_window < m.seq_length))


def projection_ops(m: ModelSpec, tokens: int, t: int, bwd: bool, plan: ParallelPlan | None = None
                   ) -> tuple[list[Compute], list[Compute]]:
    """The GEMMs before the attention core (QKV, or MLA's down and up projections) and after it
    (the output projection), on one of ``t`` tensor-parallel ranks. Down projections are
    replicated: every TP rank runs them whole. With ``plan`` each is a transformer linear of
    the plan's precision (:func:`simdist.analytic.ops._linear`: FP8 with its casts under
    precision fp8, as Transformer Engine runs every linear of the block, MLA's included)."""
    h, a = m.hidden_size, m.num_attention_heads

    def gemm(name: str, rows: int, n: int, k: int) -> list[Compute]:
        return _linear(plan, name, rows, n, k, bwd) if plan is not None else _gemm(name, rows, n, k, bwd)

    if m.attention == "mla":
        d, r, v, kvr, qr = m.head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank, m.q_lora_rank
        before: list[Compute] = []
        if qr:
            before += gemm("q down", tokens, qr, h)
            before += gemm("q up", tokens, a * (d + r) // t, qr)
        else:
            before += gemm("q", tokens, a * (d + r) // t, h)
        before += gemm("kv down", tokens, kvr + r, h)
        before += gemm("kv up", tokens, a * (d + v) // t, kvr)
        return before, gemm("attn out", tokens, h, a * v // t)
    qd = a * m.head_dim
    return (gemm("qkv", tokens, (qd + 2 * m.kv_dim) // t, h),
            gemm("attn out", tokens, h, qd // t))


def core_op(m: ModelSpec, kind: LayerKind, s_q: int, s_k: int, b: int, heads: int, bwd: bool,
            share: float = 1.0, name: str = "flash attention", kernel: str = "flash2") -> Compute:
    """One fused attention kernel: ``s_q`` queries against ``s_k`` keys for ``b`` sequences and
    ``heads`` heads, carrying ``share`` of the layer's full-square FLOPs (context parallelism
    splits them); backward costs 2.5x forward (FlashAttention-2: five GEMMs against two). The
    full-square convention counts twice the pairs a kernel computes, for a band as for a causal
    square, so one efficiency times both. ``kernel``: the fused kernel class the plan runs
    (:func:`simdist.spec.frameworks.attention_kernel`), priced like the dense layer's
    (:func:`simdist.analytic.ops.layer_ops`)."""
    per_query = attention_core_flops_per_token(m, kind.window) / m.num_attention_heads
    flops = per_query * m.seq_length * b * heads * share * (2.5 if bwd else 1.0)
    return Compute(name + (" bwd" if bwd else ""), "attention", flops, m=s_q, n=s_k,
                   k=max(q_head_dim(m), v_dim(m)), batch=b * heads, kernel=kernel)
