"""Ops: what one GPU runs for one layer, micro-batch and pass. They say what runs, never how
long: simdist.analytic.cost times compute ops, simdist.analytic.collectives times communication.

Shapes follow Megatron-LM's layer (Shoeybi et al. 2019; Korthikanti et al. 2022 for sequence
parallelism): QKV and fc1 are column-parallel, the output projection and fc2 row-parallel, so
each layer does one TP all-reduce after attention and one after the MLP in the forward pass and
the same two in the backward pass (all-gather + reduce-scatter pairs with sequence
parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

ComputeKind = Literal["gemm", "attention", "memory"]
Collective = Literal["allreduce", "allgather", "reducescatter", "sendrecv", "alltoall", "broadcast"]
Axis = Literal["tp", "cp", "pp", "dp", "dp_shard", "dp_replica", "ps"]
Pass = Literal["fwd", "bwd"]


@dataclass(frozen=True, slots=True)
class Compute:
    name: str
    kind: ComputeKind
    flops: float = 0.0
    bytes: float = 0.0  # HBM traffic for memory-bound ops
    m: int = 0  # GEMM shape (m x k) @ (k x n); attention: m = seq, n = seq, k = head_dim
    n: int = 0
    k: int = 0
    batch: int = 1  # batched GEMM / attention heads x micro-batch


@dataclass(frozen=True, slots=True)
class Comm:
    name: str
    collective: Collective
    axis: Axis
    bytes: float  # the collective's buffer size S in nccl-tests' sense


Op = Compute | Comm


def _gemm(name: str, m: int, n: int, k: int, backward: bool) -> list[Compute]:
    """A linear layer: forward (m x k)(k x n); backward = data grad + weight grad GEMMs.
    Backward lists are built in forward order and reversed at the end, so the weight grad is
    listed first here to run after the data grad (whose TP all-reduce it can then hide)."""
    if not backward:
        return [Compute(name, "gemm", 2.0 * m * n * k, m=m, n=n, k=k)]
    return [
        Compute(f"{name} wgrad", "gemm", 2.0 * m * n * k, m=k, n=n, k=m),
        Compute(f"{name} dgrad", "gemm", 2.0 * m * n * k, m=m, n=k, k=n),
    ]


def _mem(name: str, nbytes: float) -> Compute:
    return Compute(name, "memory", bytes=nbytes)


@cache
def layer_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """One transformer layer on one GPU for one micro-batch, forward or backward."""
    bwd = phase == "bwd"
    t, cp = plan.tp, plan.cp
    e = plan.element_bytes
    s, b = m.seq_length // cp, plan.micro_batch_size
    tokens = s * b
    h, kv, a = m.hidden_size, m.kv_dim, m.num_attention_heads
    f = m.ffn_hidden_size
    sp = plan.sequence_parallel and t > 1
    act = tokens * h * e  # one [s, b, h] activation
    rep = act / t if sp else act  # tensors that sequence parallelism splits
    mem_scale = 2.0 if bwd else 1.0  # backward of elementwise ops reads/writes about twice
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
            ops.append(Comm(f"allgather tp {where} (wgrad input)", "allgather", "tp", act))
        elif into or bwd:
            ops.append(Comm(f"allgather tp {where}", "allgather", "tp", act))
        else:
            ops.append(Comm(f"reducescatter tp {where}", "reducescatter", "tp", act))

    # --- attention block
    ops.append(_mem("norm1", mem_scale * 2 * rep))
    tp_collective("attn in")
    ops += _gemm("qkv", tokens, (h + 2 * kv) // t, h, bwd)
    if m.position_embedding == "rope":
        ops.append(_mem("rope", mem_scale * 2 * tokens * (h + kv) * e / t))
    heads = a // t
    if cp > 1:
        # ring attention (context parallel): K and V of every other CP rank pass through
        ops.append(Comm("sendrecv cp kv", "sendrecv", "cp", (cp - 1) * 2 * tokens * kv * e / t))
    if plan.flash_attention:
        flops = 4.0 * tokens * s * cp * h / t * (2.5 if bwd else 1.0)
        ops.append(Compute("flash attention" + (" bwd" if bwd else ""), "attention", flops,
                           m=s, n=s * cp, k=m.head_dim, batch=b * heads))
    else:
        # explicit attention: QK^T and AV batched GEMMs plus the fused scale-mask-softmax,
        # its dropout, all over the s x s scores (Megatron-LM 2021)
        scores = b * heads * s * s * cp
        for name in ("QK^T", "AV"):
            ops.append(Compute(name + (" bwd" if bwd else ""), "gemm",
                               2.0 * scores * m.head_dim * (2 if bwd else 1),
                               m=s, n=s * cp if name == "QK^T" else m.head_dim,
                               k=m.head_dim if name == "QK^T" else s * cp, batch=b * heads))
        drop = (2 * e + 1) if m.dropout else 0
        ops.append(_mem("softmax" + (" bwd" if bwd else ""), mem_scale * scores * (2 * e + drop)))
    ops += _gemm("attn out", tokens, h, h // t, bwd)
    tp_collective("attn out")
    ops.append(_mem("bias dropout add", mem_scale * (3 * rep + (tokens * h / (t if sp else 1) if m.dropout else 0))))

    # --- MLP block
    ops.append(_mem("norm2", mem_scale * 2 * rep))
    tp_collective("mlp in")
    n_in = 2 if m.mlp == "swiglu" else 1
    experts = m.experts_per_token
    ops += _gemm("fc1", tokens * experts, n_in * f // t, h, bwd)
    ops.append(_mem("swiglu" if n_in == 2 else "gelu", mem_scale * (n_in + 1) * tokens * experts * f * e / t))
    ops += _gemm("fc2", tokens * experts, h, f // t, bwd)
    tp_collective("mlp out")
    ops.append(_mem("bias dropout add", mem_scale * (3 * rep + (tokens * h / (t if sp else 1) if m.dropout else 0))))
    if m.num_experts > 1:
        ops.append(_gemm("router", tokens, m.num_experts, h, bwd)[0])
    return tuple(reversed(ops)) if bwd else tuple(ops)


@cache
def embedding_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """Token (+ position) embedding on the first stage: a gather forward, a scatter-add backward."""
    e = plan.element_bytes
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    ops: list[Op] = [_mem("embedding" + (" bwd" if phase == "bwd" else ""), 2 * tokens * m.hidden_size * e)]
    if plan.tp > 1:  # vocabulary-parallel embedding: partial rows summed over TP
        kind = "reducescatter" if plan.sequence_parallel else "allreduce"
        ops.append(Comm(f"{kind} tp embedding", kind, "tp", tokens * m.hidden_size * e))
    return tuple(ops)


@cache
def head_ops(m: ModelSpec, plan: ParallelPlan, phase: Pass) -> tuple[Op, ...]:
    """Final norm, LM head (vocabulary-parallel GEMM) and cross-entropy on the last stage."""
    bwd = phase == "bwd"
    e = plan.element_bytes
    t = plan.tp
    tokens = m.seq_length // plan.cp * plan.micro_batch_size
    h, V = m.hidden_size, m.vocab_size
    ops: list[Op] = [_mem("final norm", (2.0 if bwd else 1.0) * 2 * tokens * h * e / (t if plan.sequence_parallel and t > 1 else 1))]
    if t > 1 and plan.sequence_parallel:
        ops.append(Comm("allgather tp head", "allgather", "tp", tokens * h * e))
    ops += _gemm("lm head", tokens, V // t, h, bwd)
    # cross-entropy over fp32 logits: cast, max, exp-sum, loss (+ gradient in backward)
    ops.append(_mem("cross entropy" + (" bwd" if bwd else ""), (2.0 if bwd else 3.0) * tokens * V / t * 4))
    if t > 1:
        ops.append(Comm("allreduce tp loss", "allreduce", "tp", tokens * 4 * 3))
    if bwd and t > 1 and not plan.sequence_parallel:
        ops.append(Comm("allreduce tp head grad", "allreduce", "tp", tokens * h * e))
    return tuple(reversed(ops)) if bwd else tuple(ops)


@cache
def recompute_ops(m: ModelSpec, plan: ParallelPlan) -> tuple[Op, ...]:
    """The forward ops of one layer that backward runs again: the whole layer under full
    recompute; under selective recompute the attention core of explicit attention (Korthikanti
    et al. 2022 sec 5; FlashAttention recomputes it inside its backward kernel already)."""
    if plan.recompute == "full":
        return layer_ops(m, plan, "fwd")
    if plan.recompute == "selective" and not plan.flash_attention:
        return tuple(op for op in layer_ops(m, plan, "fwd")
                     if isinstance(op, Compute) and op.name in ("QK^T", "AV", "softmax"))
    return ()
