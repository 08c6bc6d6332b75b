"""Ops: what one GPU runs for one layer, micro-batch and pass. They say what runs, never how
long: simdist.analytic.cost times compute ops, simdist.analytic.collectives times communication.

Shapes follow Megatron-LM's layer (Shoeybi et al. 2019; Korthikanti et al. 2022 for sequence
parallelism): QKV and fc1 are column-parallel, the output projection and fc2 row-parallel, so
each layer does one TP all-reduce after attention and one after the MLP in the forward pass and
the same two in the backward pass (all-gather + reduce-scatter pairs with sequence
parallelism).

Attention heads are ``head_dim`` wide, which need not be hidden / heads (Qwen3, GPT-OSS): the
query and output projections are hidden x heads*head_dim. With fewer KV heads than TP ranks each
rank keeps one KV head, replicated over tp / kv_heads ranks (Megatron-Core and TE replicate the
query groups when tp > num_query_groups). Sliding-window layers attend to ``sliding_window``
keys (:func:`attention_keys`). Under FP8 the transformer linears run in FP8 with their cast
kernels (:mod:`simdist.analytic.fp8`); what recomputation runs again follows the framework's
policy (:func:`recompute_ops`).
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from simdist.analytic import eager, fp8
from simdist.frozen import frozen
from simdist.spec.frameworks import attention_kernel, framework_of, recompute_early_stop
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

# sync: a host read that drains the queue (analytic.host); copy: a memory-bound copy of data out of
# the cache (FSDP2's copies on a CPU: simdist.analytic.fsdp2), at a profile's cold-copy rate
ComputeKind = Literal["gemm", "attention", "memory", "copy", "sync"]
Collective = Literal["allreduce", "allgather", "reducescatter", "sendrecv", "alltoall", "broadcast"]
Axis = Literal["tp", "cp", "pp", "dp", "dp_shard", "dp_replica", "ps"]
Pass = Literal["fwd", "bwd"]


@frozen(slots=True)
class Compute:
    name: str
    kind: ComputeKind
    flops: float = 0.0
    bytes: float = 0.0  # HBM traffic for memory-bound ops
    m: int = 0  # GEMM shape (m x k) @ (k x n); attention: m = seq, n = seq, k = head_dim
    n: int = 0
    k: int = 0
    batch: int = 1  # batched GEMM / attention heads x micro-batch
    fp8: bool = False  # a GEMM run in FP8 (simdist.analytic.fp8); otherwise in the plan's 16/32-bit type
    kernel: str = "flash2"  # attention: the fused kernel class (simdist.spec.frameworks.attention_kernel)
    # a GEMM of a layer's weight: the weight's elements it reads (forward, data grad) or writes
    # (weight grad), fetched from memory where the cache does not hold it (simdist.analytic.cache_residency)
    weight: float = 0.0
    # a pointwise op that computes per element ("gelu fwd", "layernorm bwd"; "" if it streams): a
    # CPU profile prices its ``elements`` at its measured rate (CostModel.pointwise_time)
    pointwise: str = ""
    elements: float = 0.0


@frozen(slots=True)
class Comm:
    name: str
    collective: Collective
    axis: Axis
    bytes: float  # the collective's buffer size S in nccl-tests' sense
    # in flight while the compute op after it runs, which hides it (a context-parallel transfer
    # issued before a kernel and awaited after it: simdist.analytic.context)
    overlaps_next: bool = False


Op = Compute | Comm


def _gemm(name: str, m: int, n: int, k: int, backward: bool, in_fp8: bool = False) -> list[Compute]:
    """A linear layer: forward (m x k)(k x n); backward = data grad + weight grad GEMMs.
    Backward lists are built in forward order and reversed at the end, so the weight grad is
    listed first here to run after the data grad (whose TP all-reduce it can then hide)."""
    w = float(n * k)
    if not backward:
        return [Compute(name, "gemm", 2.0 * m * n * k, m=m, n=n, k=k, fp8=in_fp8, weight=w)]
    return [
        Compute(f"{name} wgrad", "gemm", 2.0 * m * n * k, m=k, n=n, k=m, fp8=in_fp8, weight=w),
        Compute(f"{name} dgrad", "gemm", 2.0 * m * n * k, m=m, n=k, k=n, fp8=in_fp8, weight=w),
    ]


def _linear(plan: ParallelPlan, name: str, m: int, n: int, k: int, backward: bool) -> list[Compute]:
    """A transformer linear: its GEMMs, in FP8 under precision fp8 with the recipe's casts of the
    input (forward) or the output gradient (backward), and of the weight (fp8.py)."""
    if plan.precision != "fp8":
        return _gemm(name, m, n, k, backward)
    cb = fp8.cast_bytes(plan)
    weight = memory_op(f"fp8 cast {name} weight", cb * k * n * fp8.weight_casts_per_microbatch(plan) / 2)
    operand = memory_op(f"fp8 cast {name} {'grad' if backward else 'input'}", cb * m * (n if backward else k))
    gemms = _gemm(name, m, n, k, backward, in_fp8=True)
    # backward lists are reversed later: the casts then run before their GEMMs
    return [*gemms, weight, operand] if backward else [operand, weight, *gemms]


def kv_heads_per_rank(m: ModelSpec, tp: int) -> int:
    """KV heads each TP rank computes: kv_heads / tp, or one replicated head when tp > kv_heads."""
    return max(1, m.num_kv_heads // tp)


def attention_keys(m: ModelSpec, s: int) -> float:
    """Keys per query on the full-square FLOP convention (4 s h per token, which the fitted
    attention efficiency is measured on): s for causal attention; a sliding window of w keys
    does s w - w^2/2 of the causal s^2/2 band's work, i.e. 2w - w^2/s keys; averaged over the
    layers when only some are windowed (GPT-OSS: every other layer)."""
    w = m.sliding_window
    if not w or w >= s:
        return float(s)
    windowed = (m.sliding_window_layers if m.sliding_window_layers is not None else m.num_layers) / m.num_layers
    return windowed * (2 * w - w * w / s) + (1 - windowed) * s


def memory_op(name: str, nbytes: float, pointwise: str = "", elements: float = 0.0) -> Compute:
    """A memory-bound op of ``nbytes`` of traffic; ``pointwise``/``elements``: what it computes
    per element, which a CPU may take longer for (CostModel.pointwise_time)."""
    return Compute(name, "memory", bytes=nbytes, pointwise=pointwise, elements=elements)


@cache
def layer_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """One transformer layer on one GPU for one micro-batch, forward or backward."""
    bwd = phase == "bwd"
    t, cp = plan.tp, plan.cp
    e = plan.element_bytes
    s, b = m.seq_length // cp, plan.micro_batch_size
    tokens = s * b
    h, a, hd = m.hidden_size, m.num_attention_heads, m.head_dim
    q = a * hd // t  # query (and attention output) width per rank
    kv = kv_heads_per_rank(m, t) * hd  # key / value width per rank
    f = m.ffn_hidden_size
    sp = plan.sequence_parallel and t > 1
    act = tokens * h * e  # one [s, b, h] activation
    rep = act / t if sp else act  # tensors that sequence parallelism splits
    mem_scale = 2.0 if bwd else 1.0  # backward of elementwise ops reads/writes about twice
    # FP8 linears gather their inputs in FP8 (TE's sequence-parallel all-gather, torchao's
    # Float8ColwiseParallel): half the bytes of the 16-bit all-gather
    gather_in = act / 2 if plan.precision == "fp8" else act
    ops: list[Op] = []

    def tp_collective(where: str) -> None:
        """Megatron's f/g operators around a column-parallel ("in") / row-parallel ("out") pair:
        all-reduce after "out" forward and after "in" backward; with sequence parallelism an
        all-gather at "in" and a reduce-scatter at "out" forward, reversed in backward, where
        the input is also gathered again for the weight gradient (Korthikanti sec 4.2.2)."""
        if t == 1:
            return
        into = where.endswith("in")
        if not sp:
            if into == bwd:
                ops.append(Comm(f"allreduce tp {where}", "allreduce", "tp", act))
            return
        if into and bwd:
            ops.append(Comm(f"reducescatter tp {where}", "reducescatter", "tp", act))
            ops.append(Comm(f"allgather tp {where} (wgrad input)", "allgather", "tp", gather_in))
        elif into:
            ops.append(Comm(f"allgather tp {where}", "allgather", "tp", gather_in))
        elif bwd:
            ops.append(Comm(f"allgather tp {where}", "allgather", "tp", act))
        else:
            ops.append(Comm(f"reducescatter tp {where}", "reducescatter", "tp", act))

    # --- attention block
    normed = rep / e  # the elements a norm computes
    ops.append(memory_op("norm1", mem_scale * 2 * rep * eager.traffic_factor(plan, "norm", phase, m.norm),
                         f"{m.norm} {phase}", normed))
    tp_collective("attn in")
    ops += _linear(plan, "qkv", tokens, q + 2 * kv, h, bwd)
    if m.position_embedding == "rope":
        ops.append(memory_op("rope", mem_scale * 2 * tokens * (q + kv) * e * eager.traffic_factor(plan, "rope", phase)))
    heads = a // t
    keys = attention_keys(m, s * cp)
    if cp > 1:
        # ring attention (context parallel): K and V of every other CP rank pass through
        ops.append(Comm("sendrecv cp kv", "sendrecv", "cp", (cp - 1) * 2 * tokens * kv * e))
    if plan.flash_attention:
        flops = 4.0 * tokens * keys * q * (2.5 if bwd else 1.0)
        ops.append(Compute("flash attention" + (" bwd" if bwd else ""), "attention", flops,
                           m=s, n=s * cp, k=hd, batch=b * heads,
                           kernel=attention_kernel(plan)))
    else:
        # explicit attention: QK^T and AV batched GEMMs plus the fused scale-mask-softmax,
        # its dropout, all over the s x s scores (Megatron-LM 2021)
        scores = b * heads * s * s * cp
        for name in ("QK^T", "AV"):
            ops.append(Compute(name + (" bwd" if bwd else ""), "gemm",
                               2.0 * scores * hd * (2 if bwd else 1),
                               m=s, n=s * cp if name == "QK^T" else hd,
                               k=hd if name == "QK^T" else s * cp, batch=b * heads))
        drop = (2 * e + 1) if m.dropout else 0
        ops.append(memory_op("softmax" + (" bwd" if bwd else ""), mem_scale * scores * (2 * e + drop)))
    ops += _linear(plan, "attn out", tokens, h, q, bwd)
    tp_collective("attn out")
    ops.append(memory_op("bias dropout add", mem_scale * (3 * rep + (tokens * h / (t if sp else 1) if m.dropout else 0))))

    # --- MLP block
    ops.append(memory_op("norm2", mem_scale * 2 * rep * eager.traffic_factor(plan, "norm", phase, m.norm),
                         f"{m.norm} {phase}", normed))
    tp_collective("mlp in")
    n_in = 2 if m.mlp == "swiglu" else 1
    experts = m.experts_per_token
    ops += _linear(plan, "fc1", tokens * experts, n_in * f // t, h, bwd)
    act_x = eager.traffic_factor(plan, "swiglu", phase) if n_in == 2 else 1.0
    ops.append(memory_op(m.mlp, mem_scale * (n_in + 1) * tokens * experts * f * e / t * act_x, f"{m.mlp} {phase}",
                         tokens * experts * f / t))
    ops += _linear(plan, "fc2", tokens * experts, h, f // t, bwd)
    tp_collective("mlp out")
    ops.append(memory_op("bias dropout add", mem_scale * (3 * rep + (tokens * h / (t if sp else 1) if m.dropout else 0))))
    if m.num_experts > 1:
        ops.append(_gemm("router", tokens, m.num_experts, h, bwd)[0])
    return tuple(reversed(ops)) if bwd else tuple(ops)


@cache
def embedding_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """Token (+ position) embedding on the first stage: a gather forward, a scatter-add backward."""
    e = plan.element_bytes
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    ops: list[Op] = [memory_op("embedding" + (" bwd" if phase == "bwd" else ""), 2 * tokens * m.hidden_size * e)]
    if plan.tp > 1:  # vocabulary-parallel embedding: partial rows summed over TP
        kind = "reducescatter" if plan.sequence_parallel else "allreduce"
        ops.append(Comm(f"{kind} tp embedding", kind, "tp", tokens * m.hidden_size * e))
    return tuple(ops)


# HBM bytes per logit of the loss, forward and backward, per framework (Framework.cross_entropy),
# each op one kernel over the logits:
# - "megatron": Megatron-Core's _VocabParallelCrossEntropy (megatron/core/tensor_parallel/
#   cross_entropy.py; cross_entropy_loss_fusion is off by default): forward the bf16 logits to
#   fp32 (2 + 4), the max (4), the max subtracted in place (4 + 4), exp in place (4 + 4), the sum
#   (4), the softmax's division in place (4 + 4) = 38 B; backward the gradient scaled in place
#   (4 + 4) and cast back to bf16 for the LM head's GEMMs (4 + 2) = 14 B;
# - "torch": F.cross_entropy(logits.float()) (torchtitan's loss, Hugging Face models): forward the
#   cast (2 + 4) and log_softmax (reads the input for the max, the exp-sum and the output, writes
#   it: 3 x 4 + 4) = 22 B; backward nll_loss's zeroed gradient (4), log_softmax's backward (4 + 4
#   + 4) and the cast back (4 + 2) = 22 B;
# - "fused": one loss kernel (Megatron-Core's fused or flash-attn's xentropy): about three passes
#   over fp32 logits forward and two backward, 12 + 8 B (simdist's count before frameworks).
CROSS_ENTROPY_BYTES = {"megatron": {"fwd": 38.0, "bwd": 14.0}, "torch": {"fwd": 22.0, "bwd": 22.0},
                       "fused": {"fwd": 12.0, "bwd": 8.0}}


@cache
def head_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """Final norm, LM head (vocabulary-parallel GEMM) and cross-entropy on the last stage."""
    bwd = phase == "bwd"
    e = plan.element_bytes
    t = plan.tp
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    h, V = m.hidden_size, m.vocab_size
    normed = tokens * h / (t if plan.sequence_parallel and t > 1 else 1)
    ops: list[Op] = [memory_op("final norm", (2.0 if bwd else 1.0) * 2 * normed * e, f"{m.norm} {phase}", normed)]
    if t > 1 and plan.sequence_parallel:
        ops.append(Comm("allgather tp head", "allgather", "tp", tokens * h * e))
    ops += _gemm("lm head", tokens, V // t, h, bwd)
    # the loss over the logits, as the framework computes it (:data:`CROSS_ENTROPY_BYTES`)
    per_logit = CROSS_ENTROPY_BYTES[framework_of(plan.framework).cross_entropy][phase]
    ops.append(memory_op("cross entropy" + (" bwd" if bwd else ""), per_logit * tokens * V / t, f"cross_entropy {phase}",
                    tokens * V / t))
    if t > 1:
        ops.append(Comm("allreduce tp loss", "allreduce", "tp", tokens * 4 * 3))
    if bwd and t > 1 and not plan.sequence_parallel:
        ops.append(Comm("allreduce tp head grad", "allreduce", "tp", tokens * h * e))
    return tuple(reversed(ops)) if bwd else tuple(ops)


@cache
def recompute_ops(m: ModelSpec, plan: ParallelPlan) -> tuple[Op, ...]:
    """The forward ops of one layer that backward runs again, by the framework's policy:

    - ``full``: the whole layer, or under PyTorch's non-reentrant checkpoint (``plan.
      recompute_early_stop``, the ``pytorch`` and ``torchtitan`` frameworks') the layer up to the
      last tensor backward saved (:func:`_early_stopped`);
    - ``selective``, Megatron's (Korthikanti et al. 2022 sec 5): the attention core of explicit
      attention (FlashAttention recomputes it inside its backward kernel already);
    - ``selective``, torchtitan's per-op policy (parallelize_llama.py @ba24697, the llama3
      configs' ``selective_ac_option = 'op'``): the block runs again up to the last tensor
      backward needs (the MLP's down-projection input), each op recomputed unless saved; saved
      are the attention outputs, reduce-scatters, amaxes and every odd-numbered ``aten.mm`` in
      the block (wq, wv, wo... counted q, k, v, o, w1, w3, w2: k, o and w3 recomputed). FP8
      linears call ``_scaled_mm``, not in that list, so under FP8 every linear up to the
      down-projection is recomputed. Elementwise ops and the sequence-parallel all-gathers run
      again."""
    if plan.recompute == "full":
        fwd = layer_ops(m, plan, "fwd")
        return _early_stopped(m, fwd) if recompute_early_stop(plan) else fwd
    if plan.recompute != "selective":
        return ()
    fwd = layer_ops(m, plan, "fwd")
    if framework_of(plan.framework).selective_recompute != "op-level":
        if plan.flash_attention:
            return ()
        return tuple(op for op in fwd if isinstance(op, Compute) and op.name in ("QK^T", "AV", "softmax"))
    out: list[Op] = []
    for op in fwd:
        if op.name.startswith("fc2") or op.name.startswith("fp8 cast fc2"):
            break  # the down-projection's input is the last tensor backward needs
        if isinstance(op, Comm):
            if op.collective == "allgather":
                out.append(op)
        elif op.kind == "memory" or (op.kind == "gemm" and op.fp8):
            out.append(op)
        elif op.kind == "gemm":
            out += _unsaved_matmuls(m, plan, op)
    return tuple(out)


def _early_stopped(m: ModelSpec, fwd: tuple[Op, ...]) -> tuple[Op, ...]:
    """A layer's forward as PyTorch's non-reentrant checkpoint re-runs it: it "stops recomputation
    as soon as all needed intermediate activations have been recomputed" (torch.utils.checkpoint
    docs, early stop on by default since PyTorch 2.1), i.e. when the last tensor the original
    forward saved for backward is packed again. An aten op packs the inputs it saves before it
    computes (autograd's generated VariableType kernels record them, then dispatch the op), so the
    recompute ends as the down-projection's 16-bit GEMM is called: its input is the last saved
    tensor, and what follows it (the row-parallel collective, the residual add) saves nothing.
    An FP8 linear (torchao's Float8Linear, Transformer Engine) is a custom autograd Function whose
    saved tensors are packed once its forward returns: its GEMM and casts run again and the
    recompute ends after them. Dropout after the down-projection saves its mask, so with dropout
    the whole layer runs again; so it does when a GEMM follows (a router)."""
    last = max((i for i, op in enumerate(fwd) if op.name == "fc2"), default=None)
    if last is None:
        return fwd
    for op in fwd[last + 1:]:
        if isinstance(op, Compute) and (op.kind != "memory" or not op.name.startswith("bias dropout add")
                                        or m.dropout):
            return fwd
    fc2 = fwd[last]
    return fwd[:last + 1] if isinstance(fc2, Compute) and fc2.fp8 else fwd[:last]


def _unsaved_matmuls(m: ModelSpec, plan: ParallelPlan, op: Compute) -> list[Compute]:
    """The parts of a fused 16-bit GEMM that torchtitan's per-op policy recomputes: the model's
    separate matmuls numbered q, k, v, o, w1, w3 in the block, the even ones recomputed."""
    t, hd = plan.tp, m.head_dim
    if op.name == "qkv":  # k
        n = kv_heads_per_rank(m, t) * hd
        return [Compute("qkv (k part)", "gemm", 2.0 * op.m * n * op.k, m=op.m, n=n, k=op.k, weight=float(n * op.k))]
    if op.name == "attn out":  # o
        return [op]
    if op.name == "fc1" and m.mlp == "swiglu":  # w3
        return [Compute("fc1 (w3 part)", "gemm", op.flops / 2, m=op.m, n=op.n // 2, k=op.k, weight=op.weight / 2)]
    return []
