"""Context parallelism: the attention core of one layer when the sequence is split over ``cp``
ranks, with its communication, for the three methods of ``plan.cp_method``.

Every method balances the causal work the way the frameworks do: the sequence is cut into
2*cp chunks and rank i holds chunks i and 2cp-1-i (Megatron-Core / Transformer Engine's
context parallelism; torchtitan's ``_HeadTailLoadBalancer``), so each rank computes 1/cp of
the causal attention. What differs is how the keys and values meet the queries:

- ``ring`` (Liu et al. 2023, Ring Attention; Transformer Engine's ``cp_comm_type: p2p``): cp
  steps; at each the rank computes its queries against one K/V block while it sends that block
  on and receives the next, so each transfer hides behind a kernel; backward passes K/V and the
  K/V gradients. A step's kernel holds 1/cp of the rank's work (the diagonal step does the
  causal half of a full block, the others half-blocks). Under Megatron-Core and NeMo the ring is
  Transformer Engine's (:func:`te_ring_core_ops`: its transfer schedule, and the copies and
  accumulations of the causal split beside the kernels); elsewhere a plain ring of cp kernels.
- ``allgather`` (Llama 3, arXiv:2407.21783 sec 3.3.2; torchtitan's all-gather rotation): one
  all-gather of every rank's K and V before the kernel, and a reduce-scatter of their gradients
  after the backward kernel, both exposed (small with GQA's few K/V heads).
- ``ulysses`` (Jacobs et al. 2023, DeepSpeed-Ulysses): an all-to-all turns sequence shards into
  head shards before attention (Q, K, V) and back after it (the output); the kernel runs the
  whole sequence for heads/cp heads; backward does the same all-to-alls with gradients. Exposed.

Under a framework whose CP is PyTorch's ``context_parallel`` (torchtitan: Framework.
sdpa_context_parallel) the ``allgather`` method runs as PyTorch implements it
(torch/distributed/tensor/experimental/_attention.py, PyTorch 2.6: ``_templated_ring_attention``
with its default ``_RotateMethod.ALL_GATHER``, ``_cp_options.convert_to_f32``): see
:func:`torch_sdpa_core_ops`. Its K and V are the model's SDPA inputs, which torchtitan's Llama
repeats to every query head first (torchtitan/models/llama/model.py, ``Attention.forward``:
``repeat_kv`` before ``F.scaled_dot_product_attention``), so GQA saves no CP traffic there.
"""

from __future__ import annotations

from simdist.analytic.attention import core_op, q_head_dim, v_dim
from simdist.analytic.ops import Comm, Compute, Op
from simdist.spec.frameworks import attention_kernel, framework_of
from simdist.spec.layers import LayerKind
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

# Bytes of HBM traffic per element of one rank's attention output (or of its query gradient) that
# PyTorch's ring loop adds per step after the first, counted from _attention.py's ops in fp32
# (convert_to_f32): forward, _SDPAMerger.step: the block output to fp32 (2 + 4), out - block_out
# (4 + 4 + 4), sigmoid(lse difference) times it (4 + 4), out minus that (4 + 4 + 4) = 38 B; on the
# steps with only the second query chunk (half of them, ``partial``) half of that plus
# _partial_update's torch.cat of the whole output (4 + 4): (38 + 27) / 2 = 32.5 B. Backward: the fp32
# grad_query += the step's bf16 gradient (4 + 2 + 4), and per K and V (repeated to the query
# width): the received fp32 accumulator's _partial_update add and cat (4 + 2 + 4 + 4 + 4) and the
# torch.cat that packs it for the next rank (4 + 4): 10 + 2 x 26 = 62 B.
SDPA_MERGE_BYTES = 32.5
SDPA_GRAD_ACCUM_BYTES = 62.0


def sdpa_context_parallel(plan: ParallelPlan) -> bool:
    """Whether CP runs PyTorch's context_parallel over SDPA (:func:`torch_sdpa_core_ops`)."""
    return plan.cp_method == "allgather" and framework_of(plan.framework).sdpa_context_parallel


def kv_block_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """K and V of one rank's s/cp tokens on one tensor-parallel rank (what a ring step sends).
    MLA moves per-head keys (d + rotary dims) and values after the up projection; under
    PyTorch's context_parallel K and V are repeated to every query head (module docstring)."""
    s, b, e, t = m.seq_length // plan.cp, plan.micro_batch_size, plan.element_bytes, plan.tp
    if m.attention == "mla":
        width = m.num_attention_heads * (q_head_dim(m) + v_dim(m))
    elif sdpa_context_parallel(plan):
        width = 2 * m.num_attention_heads * m.head_dim
    else:
        width = 2 * m.kv_dim
    return s * b * width * e / t


def torch_sdpa_core_ops(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, bwd: bool) -> list[Op]:
    """PyTorch's context_parallel with the all-gather rotation, in forward order (module
    docstring): one all-gather of every rank's (repeated) K and V, issued before the first
    step's kernel and awaited after it, so that kernel hides it; then cp kernels of 1/cp of the
    rank's work each (the head-tail load balancing: the diagonal step causal, the others a
    half-block unmasked), each after the first merged into the fp32 output
    (:data:`SDPA_MERGE_BYTES`). Backward gathers K and V again the same way, runs cp backward
    kernels, adds each into fp32 gradients (:data:`SDPA_GRAD_ACCUM_BYTES`) and passes the K/V
    gradient accumulator (fp32) to the next rank after every step, each transfer awaited after
    the next step's kernel, which hides it; the last one is awaited at once, beside only the
    query gradient's cast back to 16 bits."""
    cp, t = plan.cp, plan.tp
    s, b = m.seq_length // cp, plan.micro_batch_size
    heads = m.num_attention_heads // t
    kv = kv_block_bytes(m, plan)
    step = core_op(m, kind, s, s, b, heads, bwd, share=1.0 / cp ** 2, kernel=attention_kernel(plan))
    elements = s * b * heads * v_dim(m)
    gather = Comm("allgather cp kv", "allgather", "cp", cp * kv, overlaps_next=True)
    if not bwd:
        merge = Compute("cp merge", "memory", bytes=SDPA_MERGE_BYTES * elements)
        return [gather, step] + [step, merge] * (cp - 1)
    accumulate = Compute("cp grad accumulate", "memory", bytes=SDPA_GRAD_ACCUM_BYTES * elements)
    grads = Comm("sendrecv cp kv grads", "sendrecv", "cp", 2.0 * kv)  # fp32: twice the 16-bit bytes
    run: list[Op] = [gather]
    for _ in range(cp):
        run += [step, accumulate, grads]
    # the query gradient back to 16 bits (4 + 2 B), the only work beside the last transfer
    run.append(Compute("cp grad cast", "memory", bytes=6.0 * elements))
    return list(reversed(run))  # forward order: the caller reverses backward lists


# Transformer Engine's ring attention with the causal 2-chunk split (AttnFuncWithCP in
# transformer_engine/pytorch/attention.py, v1.3-1.5, the Transformer Engine of NeMo 24.03; the
# loop is unchanged in later versions' context_parallel.py). Rank r holds chunks r and 2cp-1-r;
# at step i it meets the K/V block of rank r-i: step 0 the causal kernel over its own two chunks,
# steps 1..r all its queries against the first half of the block (``kv[:, :, 0].contiguous()``),
# steps r+1.. the second half of its queries (``q[:, 1].contiguous()``) against the whole block,
# both unmasked. Averaged over the ranks, a step after the first takes the full-query branch with
# probability 1/2, so its query-side work is (1 + 1/2)/2 = 3/4 of the whole and one of the two
# half-copies runs. HBM bytes per element (16-bit tensors, 2 B read + 2 B written per copied
# element; the in-place adds read two operands and write one, 6 B):
# - forward, each step after the first: the half-copy, 4 B x (K/V or query elements) / 2;
# - forward, after the loop, one output correction per step (flash_attn_fwd_out_correction:
#   out += out_step x exp(lse_step - lse), jit-fused: read out_step and out, write out, 6 B) over
#   the whole output at step 0 and 3/4 of it on average after;
# - backward, once: the K/V copied into the first send buffer (``p2p_comm_buffers[0][0].copy_``);
# - backward, each step: dq accumulated (``dq.add_``, 6 B over the step's query share), the step's
#   dK and dV packed (``torch.cat``, 4 B over the step's key share) and added into the received
#   K/V gradient (6 B); after the diagonal step the half-copies of K/V or of q, out and dout
#   (``[:, 1].contiguous()`` of three query-sized tensors).
# The frameworks whose attention is Transformer Engine's DotProductAttention (Megatron-Core's
# TEDotProductAttention), hence whose ring is AttnFuncWithCP; the others run a plain ring.
TE_RING_FRAMEWORKS = ("megatron", "nemo")
TE_COPY_BYTES = 4.0
TE_ACCUMULATE_BYTES = 6.0
TE_CAT_BYTES = 4.0
TE_SIDE_SHARE = 0.75  # the query (or key) share of a step after the diagonal one, averaged over ranks


def te_ring(plan: ParallelPlan) -> bool:
    """Whether the plan's ring attention is Transformer Engine's (:func:`te_ring_core_ops`)."""
    return plan.cp_method == "ring" and framework_of(plan.framework).name in TE_RING_FRAMEWORKS


def te_ring_core_ops(m: ModelSpec, plan: ParallelPlan, kind: LayerKind, bwd: bool) -> list[Op]:
    """Transformer Engine's ring attention (the constants above), in forward order.

    Forward: cp kernels, each beside the P2P send/receive of the K/V block the next one needs
    (cp - 1 transfers of one block, each issued before the kernel it overlaps, which hides it),
    the half-copies of the causal split, then the output corrections. Backward (the loop of
    ``AttnFuncWithCP.backward``): cp kernels; step i sends the K/V block on together with the
    K/V gradient accumulated so far (only K/V at the first step, only the gradient at the last:
    1, 2, ..., 2, 1 blocks) and awaits it after its kernel, so every transfer overlaps the kernel
    of its own step; then the step's gradients are accumulated."""
    cp, t, e = plan.cp, plan.tp, plan.element_bytes
    s, b = m.seq_length // cp, plan.micro_batch_size
    heads = m.num_attention_heads // t
    kv = kv_block_bytes(m, plan)
    kv_el = kv / e
    q_el = s * b * heads * q_head_dim(m)
    o_el = s * b * heads * v_dim(m)
    step = core_op(m, kind, s, s, b, heads, bwd, share=1.0 / cp ** 2, kernel=attention_kernel(plan))
    if not bwd:
        copy = Compute("cp split copy", "memory", bytes=TE_COPY_BYTES * (kv_el + q_el) / 2 / 2)
        fwd: list[Op] = []
        for i in range(cp):
            if i < cp - 1:  # the block for step i+1, in flight during step i's kernel
                fwd.append(Comm("sendrecv cp kv", "sendrecv", "cp", kv))
            fwd.append(step)
            if i < cp - 1:
                fwd.append(copy)
        corrected = o_el * (1 + TE_SIDE_SHARE * (cp - 1))
        fwd.append(Compute("cp out correction", "memory", bytes=TE_ACCUMULATE_BYTES * corrected))
        return fwd
    # backward, in the order it runs; the caller reverses backward lists
    run: list[Op] = [Compute("cp kv copy", "memory", bytes=TE_COPY_BYTES * kv_el)]
    for i in range(cp):
        blocks = 1.0 if i in (0, cp - 1) else 2.0
        side = 1.0 if i == cp - 1 else TE_SIDE_SHARE  # the diagonal step runs last in backward
        accumulate = (TE_ACCUMULATE_BYTES * side * q_el + (TE_CAT_BYTES + TE_ACCUMULATE_BYTES) * side * kv_el
                      + (0.0 if i == cp - 1 else TE_COPY_BYTES * (kv_el + 3 * q_el) / 2 / 2))
        run += [Comm("sendrecv cp kv" + (" grads" if i > 0 else ""), "sendrecv", "cp", blocks * kv), step,
                Compute("cp grad accumulate", "memory", bytes=accumulate)]
    return list(reversed(run))


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
    method = plan.cp_method
    if method == "ring" and te_ring(plan):
        return te_ring_core_ops(m, plan, kind, bwd)
    if method == "ring":  # a plain ring (Liu et al. 2023): one step's kernel per block
        out: list[Op] = []
        step = core_op(m, kind, s, s, b, heads, bwd, share=1.0 / cp ** 2, kernel=kernel)
        for i in range(cp):
            if i < cp - 1:  # the block for step i+1 (with its gradient in backward), in flight beside step i
                out.append(Comm("sendrecv cp kv", "sendrecv", "cp", (2.0 if bwd else 1.0) * kv))
            out.append(step)
        # listed before the kernel they hide behind (passes.OpTimer hides a ring transfer behind
        # the compute op that follows it); backward lists are reversed by the caller
        return out
    if method == "allgather" and sdpa_context_parallel(plan):
        return torch_sdpa_core_ops(m, plan, kind, bwd)
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
