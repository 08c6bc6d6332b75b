"""Context parallelism: the attention core of one layer when the sequence is split over ``cp``
ranks, with its communication, for the three methods of ``plan.cp_method``.

Every method balances the causal work the way the frameworks do: the sequence is cut into
2*cp chunks and rank i holds chunks i and 2cp-1-i (Megatron-Core / Transformer Engine's
context parallelism; torchtitan's ``_HeadTailLoadBalancer``), so each rank computes 1/cp of
the causal attention. What differs is how the keys and values meet the queries:

- ``ring`` (Liu et al. 2023, Ring Attention; Transformer Engine's ``cp_comm_type: p2p``): cp
  steps; at each the rank computes its queries against one K/V block while it sends that block
  on and receives the next, so each step's transfer hides behind the previous step's kernel;
  backward passes K/V and their gradients (twice the bytes). A step's kernel holds 1/cp of the
  rank's work (the diagonal step does the causal half of a full block, the others half-blocks).
- ``allgather`` (Llama 3, arXiv:2407.21783 sec 3.3.2; torchtitan's all-gather rotation): one
  all-gather of every rank's K and V before the kernel, and a reduce-scatter of their gradients
  after the backward kernel, both exposed (small with GQA's few K/V heads).
- ``ulysses`` (Jacobs et al. 2023, DeepSpeed-Ulysses): an all-to-all turns sequence shards into
  head shards before attention (Q, K, V) and back after it (the output); the kernel runs the
  whole sequence for heads/cp heads; backward does the same all-to-alls with gradients. Exposed.
"""

from __future__ import annotations

from simdist.analytic.attention import core_op, q_head_dim, v_dim
from simdist.analytic.ops import Comm, Op
from simdist.spec.frameworks import attention_kernel
from simdist.spec.layers import LayerKind
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def kv_block_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """K and V of one rank's s/cp tokens on one tensor-parallel rank (what a ring step sends).
    MLA moves per-head keys (d + rotary dims) and values after the up projection."""
    s, b, e, t = m.seq_length // plan.cp, plan.micro_batch_size, plan.element_bytes, plan.tp
    if m.attention == "mla":
        width = m.num_attention_heads * (q_head_dim(m) + v_dim(m))
    else:
        width = 2 * m.kv_dim
    return s * b * width * e / t


def core_ops(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, bwd: bool) -> list[Op]:
    """The attention core of one layer on one rank, in forward order. Every kernel is the
    framework's (its native fused attention where it has one), as in the dense layer."""
    cp, t = plan.cp, plan.tp
    s, b = m.seq_length // cp, plan.micro_batch_size
    heads = m.num_attention_heads // t
    kernel = attention_kernel(plan)
    if cp == 1:
        return [core_op(m, kind, s, s, b, heads, bwd, kernel=kernel)]
    kv = kv_block_bytes(m, plan)
    grads = 2.0 if bwd else 1.0
    method = plan.cp_method
    if method == "ring":
        out: list[Op] = []
        step = core_op(m, kind, s, s, b, heads, bwd, share=1.0 / cp ** 2, kernel=kernel)
        for i in range(cp):
            if i < cp - 1:  # the block for step i+1, in flight during step i's kernel
                out.append(Comm("sendrecv cp kv", "sendrecv", "cp", grads * kv))
            out.append(step)
        # the sends are listed before the kernel they hide behind (passes.OpTimer hides a ring
        # transfer behind the compute op that follows it)
        return out
    if method == "allgather":
        gather = Comm("allgather cp kv", "allgather", "cp", cp * kv)
        kernel = core_op(m, kind, s, m.seq_length, b, heads, bwd, share=1.0 / cp, kernel=kernel)
        if bwd:
            return [gather, kernel, Comm("reducescatter cp kv grads", "reducescatter", "cp", cp * kv)]
        return [gather, kernel]
    # ulysses: Q, K, V to head shards, the output back to sequence shards
    e = plan.element_bytes
    q = s * b * m.num_attention_heads * q_head_dim(m) * e / t
    o = s * b * m.num_attention_heads * v_dim(m) * e / t
    kernel = core_op(m, kind, m.seq_length, m.seq_length, b, heads // cp, bwd, kernel=kernel)
    return [Comm("alltoall cp qkv", "alltoall", "cp", q + kv), kernel, Comm("alltoall cp out", "alltoall", "cp", o)]
