"""Gradient compression and quantized wire formats: the bytes a compressed sync puts on the
wire, the HBM traffic of the compression kernels, and the GPU memory of their buffers.

Dense casts (fp16/bf16, int8 with a block scale: ZeRO++ qwZ/qgZ) shrink each element;
top-k sends a fraction of the entries with their indices (all-gathered, since they cannot be
summed); PowerSGD all-reduces two low-rank factors per weight matrix. The data-parallel and
parameter-server traffic (:mod:`simdist.analytic.data_parallel`,
:mod:`simdist.analytic.param_server`) use these sizes; the kernels are timed as memory-bound
work by the cost model.
"""

from __future__ import annotations

from collections.abc import Callable

from simdist.analytic.cost import CostModel
from simdist.analytic.cpu_optimizer import stage_tensors
from simdist.analytic.params import head_params, params_per_rank, stage_num_layers
from simdist.frozen import frozen
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

QUANT_GROUP = 512
"""Elements per fp32 scale in block-wise int8 quantization (ZeRO++ qwZ/qgZ, Wang et al. 2023
sec 4.1: block-based quantization with one scale per block)."""
INDEX_BYTES = 4  # int32 index per kept value in top-k sparsification (Lin et al. 2018, DGC)
TOPK_SELECT_PASSES = 4  # radix select over 32-bit keys: one pass per 8-bit digit


LOSSY = ("int8", "topk", "powersgd")  # the methods whose error the residual carries over


def keeps_residual(plan: ParallelPlan) -> bool:
    """Error feedback is on and the method loses information: the residual is kept and added
    to the next step's gradient (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD)."""
    return plan.grad_compression.error_feedback and plan.grad_compression.method in LOSSY


def param_wire_bytes(plan: ParallelPlan) -> float:
    """Bytes per parameter in ZeRO-3/FSDP all-gathers: the 16-bit (or fp32) weights, or int8
    with one fp32 scale per block under ZeRO++ qwZ (Wang et al. 2023 sec 4.1)."""
    if plan.zero_quantized_weights:
        return 1.0 + 4.0 / QUANT_GROUP
    return float(plan.element_bytes)


def uncompressed_grad_bytes(plan: ParallelPlan, sharded: bool) -> float:
    """Gradient bytes per element on the wire without compression. ZeRO-2/3 reduce-scatter the
    16-bit gradients of each micro-batch; DDP and ZeRO-1 reduce the gradient buffer as it is
    (fp32 with Megatron's main_grad accumulation; memory.state_bytes().grads)."""
    b = float(plan.grad_buffer_bytes)
    return min(b, plan.element_bytes) if sharded else b


def grad_wire_bytes(plan: ParallelPlan, sharded: bool) -> float:
    """Bytes per gradient element of a dense (reduce-scatter / all-reduce) gradient sync after
    quantization: fp16/bf16 casts (PyTorch DDP fp16_compress_hook), int8 with a block scale
    (ZeRO++ qgZ, Wang et al. 2023 sec 4.3; 1-bit Adam's error-compensated quantization, Tang et
    al. 2021). Sparsifying and low-rank methods are not dense: see topk_elements and
    powersgd_elements."""
    base = uncompressed_grad_bytes(plan, sharded)
    method = plan.grad_compression.method
    if method in ("fp16", "bf16"):
        return min(base, 2.0)
    if method == "int8":
        return 1.0 + 4.0 / QUANT_GROUP
    return base


def topk_elements(n: float, plan: ParallelPlan) -> float:
    """Gradient entries each rank sends under top-k sparsification: ratio x n (Lin et al. 2018,
    Deep Gradient Compression; Aji & Heafield 2017)."""
    return max(1.0, plan.grad_compression.ratio * n)


def topk_wire_bytes(plan: ParallelPlan) -> float:
    """Bytes per kept entry: its value in the gradient's precision plus an int32 index."""
    return uncompressed_grad_bytes(plan, sharded=False) + INDEX_BYTES


@frozen(slots=True)
class PowerSgdElements:
    """Elements one GPU all-reduces per step under PowerSGD (Vogels et al. NeurIPS 2019, Alg. 1):
    for every weight matrix M (rows x cols) the factors P = M Q (rows x r) and Q = M^T P
    (cols x r), each all-reduced; 1-D tensors (norms, biases) go uncompressed."""

    p: float
    q: float
    uncompressed: float
    matrix: float  # elements of the compressed matrices (what the factors stand for)
    count: float = 0.0  # the compressed matrices themselves


def powersgd_elements(m: ModelSpec, plan: ParallelPlan, stage: int) -> PowerSgdElements:
    """PowerSGD factor sizes for the matrices one GPU of ``stage`` holds, with TP-sharded shapes:
    column-parallel weights (Wq, Wk, Wv, fc1/gate/up) hold rows/t x cols, row-parallel ones (Wo,
    fc2) rows x cols/t (Shoeybi et al. 2019), the vocabulary-parallel embedding and head V/t x h."""
    r, t = plan.grad_compression.rank, plan.tp
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    n_in = 2 if m.mlp == "swiglu" else 1
    # (rows, cols, count) per layer after TP sharding
    mats = [(h / t, h, 1), (kv / t, h, 2), (h, h / t, 1),
            (f / t, h, n_in * m.num_experts), (h, f / t, m.num_experts)]
    layers = stage_num_layers(m, plan, stage)
    p = layers * sum(rows * r * c for rows, _, c in mats)
    q = layers * sum(cols * r * c for _, cols, c in mats)
    elems = layers * sum(rows * cols * c for rows, cols, c in mats)
    vocab = 0
    if stage == 0:
        vocab += 1
    if stage == plan.pp - 1 and head_params(m, separate_copy=plan.pp > 1).sharded:
        vocab += 1
    p += vocab * m.vocab_size / t * r
    q += vocab * h * r
    elems += vocab * m.vocab_size / t * h
    positions = 1 if stage == 0 and m.position_embedding == "learned" else 0  # a seq x h matrix, not TP-sharded
    p, q, elems = p + positions * m.seq_length * r, q + positions * h * r, elems + positions * m.seq_length * h
    total = params_per_rank(m, plan, stage)
    return PowerSgdElements(p=p, q=q, uncompressed=max(0.0, total - elems), matrix=elems,
                            count=layers * sum(c for _, _, c in mats) + vocab + positions)


def compression_ratio(m: ModelSpec, plan: ParallelPlan, stage: int = 0) -> float:
    """Bytes a rank sends in the compressed gradient sync over the bytes it would send
    uncompressed (one all-reduce of the gradient buffer). For top-k this is per rank's
    contribution; the all-gather that carries it grows with the DP size (see
    :func:`simdist.analytic.data_parallel.dp_traffic`)."""
    method = plan.grad_compression.method
    sharded = plan.shards_gradients
    base = uncompressed_grad_bytes(plan, sharded)
    if method in ("none", "fp16", "bf16", "int8"):
        return grad_wire_bytes(plan, sharded) / base
    n = params_per_rank(m, plan, stage)
    if method == "topk":
        return topk_elements(n, plan) * topk_wire_bytes(plan) / (n * base)
    ps = powersgd_elements(m, plan, stage)
    return (ps.p + ps.q + ps.uncompressed) / n


# Ops a DDP communication hook runs besides its collectives, as the executor registers them
# (executor.compression; torch 2.13's hooks), each paying the per-op cost of the cost model:
# per bucket: clone, + residual, abs, topk, gather the values, zero them in the residual, pack values and
# indices (cat), unpack (contiguous, long), zero the bucket, index_add_ every rank's entries, divide
TOPK_HOOK_OPS = 12
# powerSGD_hook per bucket: the residual added and kept (copy, add, subtract), the vectors packed (cat)
# and divided, Q divided; per matrix: P = M Q, Q = M^T P, M = P Q^T (three batched products) and P and Q
# orthogonalized (QR above rank 2; else Gram-Schmidt: per column a norm and a division, and for the
# columns after it a product, a sum, a product and a subtraction); per vector one copy back
POWERSGD_BUCKET_OPS = 6
POWERSGD_PRODUCTS = 3


def orthogonalize_ops(rank: int) -> int:
    """Ops of one orthogonalization of a rank-``rank`` factor (torch's ``_orthogonalize``)."""
    return 1 if rank > 2 else 2 * rank + 4 * (rank - 1)


def hook_ops(m: ModelSpec, plan: ParallelPlan, stage: int, buckets: int) -> float | None:
    """Ops the plan's top-k or PowerSGD hook runs on one GPU per step (constants above); None for
    the dense casts, whose few ops per step the cost model counts as four kernels."""
    method = plan.grad_compression.method
    if method == "topk":
        return TOPK_HOOK_OPS * buckets
    if method != "powersgd":
        return None
    matrices = powersgd_elements(m, plan, stage).count
    vectors = max(0.0, stage_tensors(m, plan, stage) - matrices)
    per_matrix = POWERSGD_PRODUCTS + 2 * orthogonalize_ops(plan.grad_compression.rank)
    return POWERSGD_BUCKET_OPS * buckets + per_matrix * matrices + vectors


def compression_kernel_bytes(m: ModelSpec, plan: ParallelPlan, stage: int, syncs: int = 1,
                             selection: bool = True) -> float:
    """HBM traffic of the compression kernels of one GPU in one step (memory-bound work);
    without top-k's selection passes when ``selection`` is False (a profile that measured the
    device's selection rate prices it apart: :func:`topk_selection_time`).

    Per gradient element of ``b`` bytes, per sync (``syncs`` = micro-batches for ZeRO-2/3,
    1 otherwise):
      fp16/bf16 cast: read b, write 2, and back after the reduction: 2 (b + 2)
        (a no-op when the gradients are already 16-bit);
      int8: quantize (read b, write 1) and dequantize (read 1, write b): 2 (b + 1);
      error feedback (Seide et al. 2014; Karimireddy et al. 2019): add the residual before
        compressing and store the new one: read g, read e, write g+e, then read, write e: 5 b;
      top-k: radix select, 4 passes over 32-bit keys, then the all-gathered values and indices
        scatter-added into a dense buffer (read and write each received entry);
      PowerSGD: P = M Q and Q = M^T P read M twice, the decompression P Q^T writes it once
        (Vogels et al. 2019 Alg. 1; matrix-vector-like products with r << rows, cols are
        bandwidth-bound).
    """
    method = plan.grad_compression.method
    if method == "none":
        return 0.0
    n = params_per_rank(m, plan, stage)
    sharded = plan.shards_gradients
    b = uncompressed_grad_bytes(plan, sharded)
    ef = 5 * b if keeps_residual(plan) else 0.0
    if method in ("fp16", "bf16"):
        per = 2 * (b + 2.0) if b > 2.0 else 0.0
        return syncs * n * per
    if method == "int8":
        return syncs * n * (2 * (b + 1.0) + ef)
    if method == "topk":
        k = topk_elements(n, plan)
        received = plan.dp * k * topk_wire_bytes(plan)
        select = TOPK_SELECT_PASSES * 4.0 if selection else 0.0
        return syncs * (n * (select + ef + b) + 2 * received)
    ps = powersgd_elements(m, plan, stage)
    return syncs * (ps.matrix * (3 * b + ef) + 4 * (ps.p + ps.q))


def compression_times(m: ModelSpec, plan: ParallelPlan, stage: int, buckets: int, layers: int,
                      cost: CostModel) -> tuple[float, float]:
    """(seconds per micro-batch, seconds per step) of one GPU's compression kernels: ZeRO-2/3
    compress every micro-batch's reduce-scatter, per layer; DDP and ZeRO-1 once a step, in the
    communication hook (its own ops for top-k and PowerSGD, :func:`hook_ops`; top-k's selection
    at the profile's measured rate when it has one, :func:`topk_selection_time`)."""
    if not plan.grad_compression.enabled or plan.dp <= 1:
        return 0.0, 0.0
    select = topk_selection_time(m, plan, stage, buckets, cost.select_time)
    nbytes = compression_kernel_bytes(m, plan, stage, selection=select is None)  # HBM traffic: memory-bound
    if plan.shards_gradients:
        return cost.memory_time(nbytes, kernels=2 * layers), 0.0
    ops = hook_ops(m, plan, stage, buckets)
    if ops is None:  # the dense casts: a few kernels
        return 0.0, cost.memory_time(nbytes, kernels=4)
    return 0.0, cost.memory_time(nbytes, kernels=0) + ops * cost.kernel_overhead + (select or 0.0)


def topk_selection_time(m: ModelSpec, plan: ParallelPlan, stage: int, buckets: int,
                        select_time: Callable[[float, float], float | None]) -> float | None:
    """Seconds one GPU spends selecting its top-k entries in one step: one selection per
    gradient bucket, of the bucket's entries, at the device's measured rate (``select_time``
    of one tensor and the entries it keeps, profile v8); None without one, or for other methods."""
    if plan.grad_compression.method != "topk":
        return None
    each = params_per_rank(m, plan, stage) / max(1, buckets)
    t = select_time(each, topk_elements(each, plan))
    return None if t is None else buckets * t


def error_feedback_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """GPU memory the compressor keeps: the error-feedback residual, one gradient-sized buffer
    (Karimireddy et al. 2019, EF-SGD), for the lossy methods when error_feedback is on; PowerSGD
    also keeps its Q factors for the warm start and the P buffers (Vogels et al. 2019 sec 3);
    top-k the all-gathered values and indices of every rank."""
    method = plan.grad_compression.method
    if method == "none":
        return 0.0
    n = params_per_rank(m, plan, stage)
    b = uncompressed_grad_bytes(plan, plan.shards_gradients)
    out = n * b if keeps_residual(plan) else 0.0
    if method == "powersgd":
        ps = powersgd_elements(m, plan, stage)
        out += (ps.p + ps.q) * b
    elif method == "topk":
        out += plan.dp * topk_elements(n, plan) * topk_wire_bytes(plan)
    return out

