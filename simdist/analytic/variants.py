"""Op lists of the layers contract v1.2 adds: each is the dense layer's op list
(:func:`simdist.analytic.ops.layer_ops`) with its attention block and its FFN block replaced by
their variants, so norms, residual adds and tensor-parallel collectives stay priced in one place.

- attention: MLA or an explicit head dimension (:mod:`simdist.analytic.attention`), sliding
  windows, and context parallelism's methods (:mod:`simdist.analytic.context`);
- FFN: the dense FFN of ``ffn_hidden_size`` in dense layers (tokens not multiplied by top-k),
  the routed experts (:mod:`simdist.analytic.moe`) plus the shared experts (a dense FFN of
  num_shared_experts x moe_ffn_hidden_size, tensor-parallel with the dense layer's collectives)
  in MoE layers;
- multi-token prediction (DeepSeek-V3 sec 2.2; Megatron-Core's MultiTokenPredictionBlock): per
  module the embedding of the shifted tokens, two RMSNorms, the (2h -> h) projection, one layer
  of the last layer's kind, and the shared LM head with its loss, on the last pipeline stage.

A dense model with hidden-size attention and cp = 1 keeps the dense op list unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from simdist.analytic import attention, context, moe, ops
from simdist.analytic.ops import Comm, Compute, Op, Pass
from simdist.spec.layers import DENSE, LayerKind, layer_kind
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def plain(m: ModelSpec, plan: ParallelPlan) -> bool:
    """The dense op list prices this model and plan as they are."""
    return not m.is_moe and not attention.is_variant(m) and plan.cp == 1


@cache
def dense_view(m: ModelSpec) -> ModelSpec:
    """The model with a dense FFN of ffn_hidden_size in every layer."""
    return replace(m, num_experts=1, experts_per_token=1)


def _index(ops_: list[Op], prefix: str, last: bool = False) -> int:
    found = [i for i, op in enumerate(ops_) if op.name.startswith(prefix)]
    if not found:
        raise ValueError(f"the dense layer's op list has no {prefix!r} op")
    return found[-1] if last else found[0]


def _ffn_span(ops_: list[Op]) -> tuple[int, int]:
    """[start, end) of the FFN block between the second norm and the last residual add."""
    return _index(ops_, "norm2") + 1, _index(ops_, "bias dropout add", last=True)


def _forward_order(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> list[Op]:
    got = ops.layer_ops(m, plan, phase)
    return list(reversed(got)) if phase == "bwd" else list(got)


def attention_block(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, bwd: bool) -> list[Op]:
    """Projections, rotary embedding and attention core of one layer, in forward order."""
    t, e = plan.tp, plan.element_bytes
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    before, after = attention.projection_ops(m, tokens, t, bwd, plan)
    out: list[Op] = list(before)
    if m.position_embedding == "rope":
        a = m.num_attention_heads
        width = (a * m.qk_rope_head_dim / t + m.qk_rope_head_dim) if m.attention == "mla" \
            else (a * m.head_dim + m.kv_dim) / t
        out.append(Compute("rope", "memory", bytes=(2.0 if bwd else 1.0) * 2 * tokens * width * e))
    if plan.flash_attention or plan.cp > 1:
        out += context.core_ops(m, plan, kind, bwd)
    else:  # explicit QK^T, softmax, AV over the s x s scores (Megatron-LM's unfused path)
        s, b, heads = m.seq_length, plan.micro_batch_size, m.num_attention_heads // t
        keys = round(attention.attended_keys(m, kind.window))
        scores = b * heads * s * keys
        qd, vd = attention.q_head_dim(m), attention.v_dim(m)
        f = 2 if bwd else 1
        sfx = " bwd" if bwd else ""
        out.append(Compute("QK^T" + sfx, "gemm", 2.0 * scores * qd * f, m=s, n=keys, k=qd, batch=b * heads))
        drop = (2 * e + 1) if m.dropout else 0
        out.append(Compute("softmax" + sfx, "memory", bytes=(2.0 if bwd else 1.0) * scores * (2 * e + drop)))
        out.append(Compute("AV" + sfx, "gemm", 2.0 * scores * vd * f, m=s, n=vd, k=keys, batch=b * heads))
    return out + list(after)


def _renamed(op: Op, prefix: str) -> Op:
    return replace(op, name=prefix + op.name)


def moe_block(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> list[Op]:
    """Routed experts, then the shared experts (the dense FFN block of their width)."""
    out = moe.routed_ops(m, plan, phase == "bwd")
    if m.num_shared_experts:
        shared = replace(dense_view(m), ffn_hidden_size=m.num_shared_experts * m.moe_ffn_hidden_size)
        base = _forward_order(shared, plan, phase)
        a, z = _ffn_span(base)
        out += [_renamed(op, "shared ") for op in base[a:z]]
    return out


@cache
def layer_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass, kind: LayerKind = DENSE) -> tuple[Op, ...]:
    """One layer of ``kind`` on one GPU for one micro-batch (backward in backward order)."""
    if plain(m, plan):
        return ops.layer_ops(m, plan, phase)
    bwd = phase == "bwd"
    out = _forward_order(dense_view(m), plan, phase)
    if attention.is_variant(m) or plan.cp > 1:
        i, j = _index(out, "qkv"), _index(out, "attn out", last=True)
        out[i:j + 1] = attention_block(m, plan, kind, bwd)
    if kind.moe:
        a, z = _ffn_span(out)
        out[a:z] = moe_block(m, plan, phase)
    return tuple(reversed(out)) if bwd else tuple(out)


SELECTIVE = ("QK^T", "AV", "softmax", "q up", "kv up", "expert activation")


@cache
def recompute_ops(m: ModelSpec, plan: ParallelPlan, kind: LayerKind = DENSE) -> tuple[Op, ...]:
    """What backward runs again (see :func:`simdist.analytic.ops.recompute_ops`): the whole
    layer of this kind under full recompute; under selective the explicit attention core, and
    in MLA and MoE layers what Megatron-Core's recompute modules ``mla_up_proj`` and ``moe_act``
    run again (the up projections of MLA, the experts' activation), as the DeepSeek-V3 and
    GPT-OSS recipes of Megatron-Bridge recompute them."""
    if plain(m, plan):
        return ops.recompute_ops(m, plan)
    if plan.recompute == "full":
        return layer_ops(m, plan, "fwd", kind)
    if plan.recompute == "selective":
        return tuple(op for op in layer_ops(m, plan, "fwd", kind) if isinstance(op, Compute)
                     and op.name in SELECTIVE and (op.name not in ("QK^T", "AV", "softmax") or not plan.flash_attention))
    return ()


@cache
def mtp_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """The multi-token-prediction modules on the last stage (empty without them)."""
    if not m.mtp_layers:
        return ()
    bwd = phase == "bwd"
    e, t, h = plan.element_bytes, plan.tp, m.hidden_size
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    glue: list[Op] = [Compute("mtp norms" + (" bwd" if bwd else ""), "memory",
                              bytes=(2.0 if bwd else 1.0) * 2 * 2 * tokens * h * e)]
    glue += ops._gemm("mtp eh proj", tokens, h // t, 2 * h, bwd)
    kind = layer_kind(m, m.num_layers)
    emb = ops.embedding_ops(m, plan, phase)
    layer = layer_ops(m, plan, phase, kind)
    head = ops.head_ops(m, plan, phase)
    one = (*head, *layer, *reversed(glue), *emb) if bwd else (*emb, *glue, *layer, *head)
    return one * m.mtp_layers


def comm_bytes(op_list: tuple[Op, ...], axis: str, collective: str | None = None) -> float:
    """Bytes of the collectives over ``axis`` in an op list (the S of each, summed), of one kind
    (``collective``) or all."""
    return sum(op.bytes for op in op_list if isinstance(op, Comm) and op.axis == axis
               and collective in (None, op.collective))
