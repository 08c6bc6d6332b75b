"""Distributed-training system mechanisms, written once for both engines.

Every mechanism beyond plain 3D parallelism is described here as pure functions of the model,
the plan and the cluster: which collectives run, how many bytes cross PCIe, NVMe and the NICs,
how much the CPU and the compression kernels do, and how much of it backward can hide. The
closed-form engine (:mod:`simdist.analytic.steptime`) times these descriptions with the alpha-beta
collective model; the discrete-event engine's lowering (:mod:`simdist.sim.lowering`) can turn the
same descriptions into ops and let its network model time them, so the two engines share one
mechanism and differ only in how they time and overlap it.

API for the engines (all pure, no simpy):

- Data parallelism with hybrid sharding and compression:
  ``dp_traffic(model, plan, stage) -> DataParallelTraffic``: every DP collective of one GPU of
  ``stage`` in one step (ZeRO-0/1/2/3, FSDP/HSDP, ZeRO++ quantized all-gathers, compressed
  gradient sync), grouped by when it runs (``fwd_gathers``, ``bwd_gathers`` and
  ``microbatch_grad_sync`` per micro-batch, split into ``gather_chunks`` per-layer pieces;
  ``step_grad_sync`` once per step in ``step_buckets`` buckets; ``post_step_gathers`` after the
  optimizer), each a :class:`CollectiveCall` (name, kind, axis, bytes of one call, calls).
  ``CommContext(cluster, plan, net).call_time(call)`` times one with the alpha-beta model;
  ``dp_times(ctx, traffic, plan, t_fwd, t_bwd, last_bwd, first_fwd)`` is the closed-form overlap.
- Overlap: ``bucketed_exposed(t_bucket, n_buckets, t_overlap)`` (DDP buckets / Horovod fusion
  buffers started as backward produces them) and ``prefetch_exposed(t_comm, chunks, t_compute)``
  (ZeRO-3 / FSDP prefetched all-gathers); ``grad_buckets(nbytes, plan)`` counts the buckets.
- Gradient compression: ``grad_wire_bytes``, ``param_wire_bytes``, ``topk_elements``,
  ``topk_wire_bytes``, ``powersgd_elements``, ``compression_ratio``, ``compression_kernel_bytes``
  (HBM traffic of the compression kernels, to time as memory-bound work) and
  ``error_feedback_bytes`` (GPU memory of the residual buffers).
- Offload: ``offload_traffic(model, plan, cluster, stage) -> OffloadTraffic`` (PCIe bytes down and
  up per micro-batch and per step, NVMe bytes per node, parameters the node's CPU updates) and
  ``offload_times(traffic, cluster, plan) -> OffloadTimes``.
- Optimizer on the CPU: ``cpu_optimizer_time(params_on_node, plan, host)``.
- Parameter servers: ``ps_traffic(model, plan, cluster, stage) -> PSTraffic`` (per server and
  busiest-NIC bytes), ``ps_times(model, plan, cluster, net, stage) -> PSTimes`` and
  ``async_staleness_steps(plan)``.

Sources are cited next to each formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simdist.analytic.collectives import (
    LINK_EFFICIENCY,
    GroupLayout,
    Network,
    collective_time,
    layout_for_axis,
)
from simdist.analytic.memory import state_bytes
from simdist.analytic.params import (
    head_params,
    params_per_rank,
    stage_num_layers,
)
from simdist.spec.cluster import ClusterSpec, HostSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

QUANT_GROUP = 512
"""Elements per fp32 scale in block-wise int8 quantization (ZeRO++ qwZ/qgZ, Wang et al. 2023
sec 4.1: block-based quantization with one scale per block)."""
INDEX_BYTES = 4  # int32 index per kept value in top-k sparsification (Lin et al. 2018, DGC)
TOPK_SELECT_PASSES = 4  # radix select over 32-bit keys: one pass per 8-bit digit
PCIE_EFFICIENCY = LINK_EFFICIENCY["pcie"]  # achieved fraction of the PCIe line rate
DEEPSPEED_ZERO3_BUSBW = 21e9
"""Bus bandwidth (bytes/s per GPU) that DeepSpeed ZeRO-3's per-submodule parameter fetch
reaches, whatever the links carry: one p4d node (8 A100, NVSwitch) spent 420 ms more per forward
under ZeRO-3 than ZeRO-2 gathering a 5.1B-parameter model, 10.2 GB x 7/8 in 0.42 s = 21 GB/s
(DeepSpeed issue #1174, 2021, v0.3.16). Each fetch is a list all_gather followed by copies
and a host synchronisation (DeepSpeed PR #1188), so it is bound by the GPU's copies and the
host, not the network: the same ceiling shows on Selene's 8 x HDR nodes, where ZeRO-3's step
stops shrinking past 768 GPUs (Narayanan et al. SC'21 Table 2)."""


def busbw_cap(plan: ParallelPlan, axis: str = "dp") -> float:
    """Bus-bandwidth ceiling of the plan's collectives over ``axis`` (0 = the network's): the
    data-parallel ones of DeepSpeed ZeRO-3."""
    if axis.startswith("dp") and plan.shards_params and plan.zero3_fetch == "module":
        return DEEPSPEED_ZERO3_BUSBW
    return 0.0


# --- timing context ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    """``calls`` back-to-back collectives of one kind, each of buffer size ``bytes`` (the S of
    nccl-tests), over the ranks of one plan axis (dp, dp_shard, dp_replica)."""

    name: str
    kind: str  # allreduce | allgather | reducescatter | alltoall
    axis: str
    bytes: float
    calls: int = 1

    @property
    def total_bytes(self) -> float:
        return self.bytes * self.calls


class CommContext:
    """Times collectives of one scenario on its cluster (alpha-beta model of sim.collectives)."""

    def __init__(self, cluster: ClusterSpec, plan: ParallelPlan, net: Network):
        self.cluster, self.plan, self.net = cluster, plan, net
        self._layouts: dict[str, GroupLayout] = {}

    def layout(self, axis: str) -> GroupLayout:
        g = self._layouts.get(axis)
        if g is None:
            g = self._layouts[axis] = layout_for_axis(self.cluster, self.plan, axis)
        return g

    def time(self, kind: str, nbytes: float, axis: str) -> float:
        return collective_time(kind, nbytes, self.layout(axis), self.net, busbw_cap(self.plan, axis))

    def call_time(self, call: CollectiveCall) -> float:
        """All ``call.calls`` calls, back to back."""
        return call.calls * self.time(call.kind, call.bytes, call.axis)

    def one_call_time(self, call: CollectiveCall) -> float:
        return self.time(call.kind, call.bytes, call.axis)


def calls_time(ctx: CommContext, calls: tuple[CollectiveCall, ...]) -> float:
    return sum(ctx.call_time(c) for c in calls)


# --- overlap ----------------------------------------------------------------------------------


def bucketed_exposed(t_bucket: float, n_buckets: int, t_overlap: float, overlap: bool = True) -> float:
    """Exposed time of ``n_buckets`` gradient buckets of ``t_bucket`` seconds each, reduced one
    after the other as a backward pass of ``t_overlap`` seconds fills them at an even rate
    (PyTorch DDP, Li et al. VLDB 2020 sec 3.2.3; Horovod tensor fusion, Sergeev & Del Balso 2018).

    Bucket i is ready at (i+1) T/n and the comm stream runs them in order, so the last one ends
    at max_i [(i+1) T/n + (n-i) t_b]; the maximum of this linear function sits at an end:
      exposed = max(t_b, n t_b - T (n-1)/n).
    Smaller buckets start earlier but pay the collective latency more often; the last bucket
    is always exposed. Without overlap the buckets run after backward: n t_b.
    """
    if n_buckets <= 0 or t_bucket <= 0:
        return 0.0
    if not overlap:
        return n_buckets * t_bucket
    return max(t_bucket, n_buckets * t_bucket - t_overlap * (n_buckets - 1) / n_buckets)


def prefetch_exposed(t_comm: float, chunks: int, t_compute: float) -> float:
    """Exposed time of communication split into ``chunks`` equal pieces prefetched one chunk
    ahead of the compute that needs them (ZeRO-3 / FSDP parameter all-gathers, Zhao et al. VLDB
    2023 sec 3.3.2): the first piece waits in full, the rest hides unless communication is
    longer than the compute: max(t/chunks, t - t_compute)."""
    if t_comm <= 0:
        return 0.0
    return max(t_comm / max(1, chunks), t_comm - t_compute)


# --- wire formats and compression ------------------------------------------------------------


def param_wire_bytes(plan: ParallelPlan) -> float:
    """Bytes per parameter in ZeRO-3/FSDP all-gathers: the 16-bit (or fp32) weights, or int8
    with one fp32 scale per block under ZeRO++ qwZ (Wang et al. 2023 sec 4.1)."""
    if plan.zero_quantized_weights:
        return 1.0 + 4.0 / QUANT_GROUP
    return float(plan.element_bytes)


def _uncompressed_grad_bytes(plan: ParallelPlan, sharded: bool) -> float:
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
    base = _uncompressed_grad_bytes(plan, sharded)
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
    return _uncompressed_grad_bytes(plan, sharded=False) + INDEX_BYTES


@dataclass(frozen=True, slots=True)
class PowerSgdElements:
    """Elements one GPU all-reduces per step under PowerSGD (Vogels et al. NeurIPS 2019, Alg. 1):
    for every weight matrix M (rows x cols) the factors P = M Q (rows x r) and Q = M^T P
    (cols x r), each all-reduced; 1-D tensors (norms, biases) go uncompressed."""

    p: float
    q: float
    uncompressed: float
    matrix: float  # elements of the compressed matrices (what the factors stand for)


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
    total = params_per_rank(m, plan, stage)
    return PowerSgdElements(p=p, q=q, uncompressed=max(0.0, total - elems), matrix=elems)


def compression_ratio(m: ModelSpec, plan: ParallelPlan, stage: int = 0) -> float:
    """Bytes a rank sends in the compressed gradient sync over the bytes it would send
    uncompressed (one all-reduce of the gradient buffer). For top-k this is per rank's
    contribution; the all-gather that carries it grows with the DP size (see dp_traffic)."""
    method = plan.grad_compression.method
    sharded = plan.shards_gradients
    base = _uncompressed_grad_bytes(plan, sharded)
    if method in ("none", "fp16", "bf16", "int8"):
        return grad_wire_bytes(plan, sharded) / base
    n = params_per_rank(m, plan, stage)
    if method == "topk":
        return topk_elements(n, plan) * topk_wire_bytes(plan) / (n * base)
    ps = powersgd_elements(m, plan, stage)
    return (ps.p + ps.q + ps.uncompressed) / n


def compression_kernel_bytes(m: ModelSpec, plan: ParallelPlan, stage: int, syncs: int = 1) -> float:
    """HBM traffic of the compression kernels of one GPU in one step (memory-bound work).

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
    b = _uncompressed_grad_bytes(plan, sharded)
    ef = 5 * b if plan.grad_compression.error_feedback and method in ("int8", "topk", "powersgd") else 0.0
    if method in ("fp16", "bf16"):
        per = 2 * (b + 2.0) if b > 2.0 else 0.0
        return syncs * n * per
    if method == "int8":
        return syncs * n * (2 * (b + 1.0) + ef)
    if method == "topk":
        k = topk_elements(n, plan)
        received = plan.dp * k * topk_wire_bytes(plan)
        return syncs * (n * (TOPK_SELECT_PASSES * 4.0 + ef + b) + 2 * received)
    ps = powersgd_elements(m, plan, stage)
    return syncs * (ps.matrix * (3 * b + ef) + 4 * (ps.p + ps.q))


def error_feedback_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """GPU memory the compressor keeps: the error-feedback residual, one gradient-sized buffer
    (Karimireddy et al. 2019, EF-SGD), for the lossy methods when error_feedback is on; PowerSGD
    also keeps its Q factors for the warm start and the P buffers (Vogels et al. 2019 sec 3);
    top-k the all-gathered values and indices of every rank."""
    method = plan.grad_compression.method
    if method == "none":
        return 0.0
    n = params_per_rank(m, plan, stage)
    b = _uncompressed_grad_bytes(plan, plan.shards_gradients)
    out = n * b if plan.grad_compression.error_feedback and method in ("int8", "topk", "powersgd") else 0.0
    if method == "powersgd":
        ps = powersgd_elements(m, plan, stage)
        out += (ps.p + ps.q) * b
    elif method == "topk":
        out += plan.dp * topk_elements(n, plan) * topk_wire_bytes(plan)
    return out


# --- data-parallel traffic ----------------------------------------------------------------------


def zero3_modules_per_layer(m: ModelSpec) -> int:
    """Submodules with parameters in a layer: two norms, QKV, output projection, MLP linears."""
    return 4 + (3 if m.mlp == "swiglu" else 2)


def shard_axis(plan: ParallelPlan) -> str:
    """The axis ZeRO/FSDP shards over: the shard group under hybrid sharding, else all of dp."""
    return "dp_shard" if plan.hybrid_sharding else "dp"


def grad_buckets(nbytes: float, plan: ParallelPlan) -> int:
    """Buckets a gradient buffer of ``nbytes`` is reduced in: ddp_bucket_size buckets when the
    reduction overlaps backward, one collective over the contiguous buffer otherwise (Megatron-LM
    without --overlap-grad-reduce)."""
    if not plan.overlap_grad_reduce or nbytes <= 0:
        return 1
    return max(1, math.ceil(nbytes / plan.ddp_bucket_size_bytes))


@dataclass(frozen=True, slots=True)
class DataParallelTraffic:
    """Every data-parallel collective of one GPU of one stage in one step, grouped by when it
    runs. Bytes are per call, after quantization / compression.

    - ``fwd_gathers``: per micro-batch, parameter all-gathers before each layer's forward
      (ZeRO-3/FSDP), ``gather_chunks`` pieces prefetched one ahead;
    - ``bwd_gathers``: per micro-batch, the all-gathers again for backward (and for the
      recomputed forward under full recompute);
    - ``microbatch_grad_sync``: per micro-batch, the gradient reduce-scatter (ZeRO-2/3) and, under
      hybrid sharding, the all-reduce of the shard across replicas, per layer;
    - ``step_grad_sync``: once per step, during the last micro-batch's backward (DDP all-reduce,
      ZeRO-1 reduce-scatter, compressed syncs), issued as ``step_buckets`` buckets (each call list
      divided evenly: one bucket = one call of each entry);
    - ``post_step_gathers``: after the optimizer, the updated parameter shards all-gathered
      (ZeRO-1/2; Megatron's distributed optimizer overlaps them with the next forward).
    """

    fwd_gathers: tuple[CollectiveCall, ...] = ()
    bwd_gathers: tuple[CollectiveCall, ...] = ()
    microbatch_grad_sync: tuple[CollectiveCall, ...] = ()
    step_grad_sync: tuple[CollectiveCall, ...] = ()
    post_step_gathers: tuple[CollectiveCall, ...] = ()
    gather_chunks: int = 1
    step_buckets: int = 1

    def step_bytes(self, microbatches: int) -> float:
        """Bytes this GPU puts into DP collectives per step (sum of buffer sizes)."""
        per_mb = sum(c.total_bytes for c in self.fwd_gathers + self.bwd_gathers + self.microbatch_grad_sync)
        once = sum(c.total_bytes for c in self.step_grad_sync + self.post_step_gathers)
        return microbatches * per_mb + once


def dp_traffic(m: ModelSpec, plan: ParallelPlan, stage: int) -> DataParallelTraffic:
    """The DP collectives of one GPU of ``stage`` in one optimizer step (allreduce mode; the
    parameter-server modes use ps_traffic instead).

    Hybrid sharding (``dp_shard`` < dp: FSDP HYBRID_SHARD / HSDP, Zhao et al. VLDB 2023 sec 3.2.2;
    ZeRO++ hpZ, Wang et al. 2023 sec 4.2): parameters are gathered and gradients reduce-scattered
    inside the shard group (one node when dp_shard <= GPUs per node), and the shard's gradients
    all-reduced across the dp/dp_shard replicas.
    ZeRO stages (Rajbhandari et al. SC'20 sec 5): 0 all-reduces the gradients once per step;
    1 reduce-scatters them once per step and all-gathers the updated parameters; 2 reduce-scatters
    every micro-batch's gradients; 3 also all-gathers each layer's parameters before its forward
    and backward, per layer (FSDP units) or per submodule (DeepSpeed ``zero3_fetch: module``).
    """
    if plan.dp == 1 or plan.uses_parameter_servers:
        return DataParallelTraffic()
    n = params_per_rank(m, plan, stage)
    ax = shard_axis(plan)
    hybrid = plan.hybrid_sharding
    shard = plan.dp_shard
    layers = max(1, stage_num_layers(m, plan, stage))
    method = plan.grad_compression.method

    if plan.shards_gradients:
        gb = grad_wire_bytes(plan, sharded=True)
        grad_bytes = n * gb
        post: tuple[CollectiveCall, ...] = ()
        if plan.zero_stage == 2:
            sync = [CollectiveCall("reducescatter grads", "reducescatter", ax, grad_bytes / layers, layers)]
            if hybrid:
                sync.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                           grad_bytes / shard / layers, layers))
            if plan.axis_size(ax) > 1:
                post = (CollectiveCall("allgather params", "allgather", ax, n * state_bytes_params(plan)),)
            return DataParallelTraffic(microbatch_grad_sync=tuple(sync), post_step_gathers=post,
                                       gather_chunks=layers)
        calls = layers * (zero3_modules_per_layer(m) if plan.zero3_fetch == "module" else 1)
        pb = param_wire_bytes(plan)
        gathers_bwd = 2 if plan.recompute == "full" else 1  # recomputation gathers again
        fwd = (CollectiveCall("allgather params fwd", "allgather", ax, n * pb / calls, calls),)
        bwd = (CollectiveCall("allgather params bwd", "allgather", ax, n * pb / calls, calls * gathers_bwd),)
        sync = [CollectiveCall("reducescatter grads", "reducescatter", ax, grad_bytes / calls, calls)]
        if hybrid:
            sync.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                       grad_bytes / shard / layers, layers))
        return DataParallelTraffic(fwd_gathers=fwd, bwd_gathers=bwd, microbatch_grad_sync=tuple(sync),
                                   gather_chunks=layers)

    # ZeRO-0 / ZeRO-1: one gradient sync per step, in buckets during the last backward
    if method == "topk":
        k = topk_elements(n, plan)
        nbytes = n * _uncompressed_grad_bytes(plan, False)
        nb = grad_buckets(nbytes, plan)
        # values + int32 indices are not summable: all-gathered, so the buffer grows with dp
        calls = [CollectiveCall("allgather top-k values+indices", "allgather", "dp",
                                plan.dp * k * topk_wire_bytes(plan) / nb, nb)]
    elif method == "powersgd":
        ps = powersgd_elements(m, plan, stage)
        b = _uncompressed_grad_bytes(plan, False)
        nb = grad_buckets(n * b, plan)
        calls = [CollectiveCall("allreduce PowerSGD P", "allreduce", "dp", ps.p * b / nb, nb),
                 CollectiveCall("allreduce PowerSGD Q", "allreduce", "dp", ps.q * b / nb, nb)]
        if ps.uncompressed:
            calls.append(CollectiveCall("allreduce 1-D tensors", "allreduce", "dp", ps.uncompressed * b / nb, nb))
    else:
        gb = grad_wire_bytes(plan, sharded=False)
        nbytes = n * gb
        nb = grad_buckets(n * _uncompressed_grad_bytes(plan, False), plan)
        if plan.zero_stage == 0:
            calls = [CollectiveCall("allreduce grads", "allreduce", "dp", nbytes / nb, nb)]
        else:
            calls = [CollectiveCall("reducescatter grads", "reducescatter", ax, nbytes / nb, nb)]
            if hybrid:
                calls.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                            nbytes / shard / nb, nb))
    post = ()
    if plan.zero_stage == 1 and plan.axis_size(ax) > 1:
        post = (CollectiveCall("allgather params", "allgather", ax, n * state_bytes_params(plan)),)
    return DataParallelTraffic(step_grad_sync=tuple(calls), post_step_gathers=post, step_buckets=nb)


def state_bytes_params(plan: ParallelPlan) -> float:
    return float(plan.element_bytes)


@dataclass(frozen=True, slots=True)
class DataParallelTimes:
    """Exposed DP time of one GPU: per micro-batch (ZeRO-2/3) and once per step."""

    fwd_exposed: float  # per micro-batch, in forward (ZeRO-3 gathers)
    bwd_exposed: float  # per micro-batch, in backward (ZeRO-3 gathers, ZeRO-2/3 reduce-scatters)
    step_sync: float  # the last backward's gradient sync that did not hide
    post_step: float  # parameter all-gather after the optimizer that did not hide
    per_microbatch_unhidden: float = 0.0  # what the per-micro-batch traffic costs un-overlapped
    gather_fwd: float = 0.0  # un-overlapped: one micro-batch's forward gathers
    gather_bwd: float = 0.0  # backward (and recompute) gathers
    grad_sync: float = 0.0  # reduce-scatters (+ replica all-reduces)

    @property
    def per_microbatch(self) -> float:
        return self.fwd_exposed + self.bwd_exposed


def dp_times(ctx: CommContext, tr: DataParallelTraffic, plan: ParallelPlan, t_fwd: float, t_bwd: float,
             last_bwd: float | None = None, first_fwd: float | None = None) -> DataParallelTimes:
    """Exposed time of ``tr`` given one micro-batch's forward and backward compute on the stage.

    ZeRO-3: prefetched all-gathers and per-layer reduce-scatters hide behind compute except the
    first gather and the last reduce-scatter (prefetch_exposed); without ``overlap_param_gather``
    all of it waits. ZeRO-2: the per-layer reduce-scatters trail backward (the first chunk
    exposed). The per-step sync runs in buckets during the last backward (bucketed_exposed).
    The post-step all-gather overlaps the next step's first forward with Megatron's
    ``--overlap-param-gather`` (overlap_param_gather), and waits in full otherwise.
    """
    last_bwd = t_bwd if last_bwd is None else last_bwd
    first_fwd = t_fwd if first_fwd is None else first_fwd
    chunks = tr.gather_chunks
    ag_f = calls_time(ctx, tr.fwd_gathers)
    ag_b = calls_time(ctx, tr.bwd_gathers)
    rs = calls_time(ctx, tr.microbatch_grad_sync)
    fwd_exp = bwd_exp = 0.0
    unhidden = ag_f + ag_b + rs
    if tr.fwd_gathers:  # ZeRO-3
        if not plan.overlap_param_gather:
            fwd_exp, bwd_exp = ag_f, ag_b + rs
        else:
            fwd_exp = prefetch_exposed(ag_f, chunks, t_fwd)
            # one layer's gather and one layer's reduce-scatter cannot hide
            bwd_exp = max((ag_f + rs) / chunks, ag_b + rs - t_bwd) if (ag_b + rs) > 0 else 0.0
    elif tr.microbatch_grad_sync:  # ZeRO-2
        bwd_exp = prefetch_exposed(rs, chunks, t_bwd)
    step = 0.0
    if tr.step_grad_sync:
        nb = tr.step_buckets
        t_b = sum(ctx.time(c.kind, c.bytes, c.axis) * c.calls / nb for c in tr.step_grad_sync)
        step = bucketed_exposed(t_b, nb, last_bwd, plan.overlap_grad_reduce)
    post = 0.0
    if tr.post_step_gathers:
        ag = calls_time(ctx, tr.post_step_gathers)
        nb = tr.step_buckets
        if plan.zero_stage == 1 and plan.overlap_param_gather and plan.overlap_grad_reduce and nb > 1:
            # Megatron's distributed optimizer (--overlap-param-gather): one all-gather per
            # bucket, each issued ahead of the forward of the layers it holds
            per_bucket = sum(ctx.time(c.kind, c.total_bytes / nb, c.axis) for c in tr.post_step_gathers)
            post = prefetch_exposed(nb * per_bucket, nb, first_fwd)
        else:
            post = ag
    return DataParallelTimes(fwd_exp, bwd_exp, step, post, unhidden, ag_f, ag_b, rs)


# --- offload (ZeRO-Offload, ZeRO-Infinity, FSDP CPU offload) --------------------------------


@dataclass(frozen=True, slots=True)
class OffloadTraffic:
    """Host traffic of one GPU of one stage in one step (bytes), and the node's CPU work.

    ZeRO-Offload (Ren et al. USENIX ATC'21 sec 4): the fp32 master weights, the optimizer states
    and the optimizer step live on the CPU; each GPU sends its gradient partition down over PCIe
    (every micro-batch under ZeRO-2/3, where DeepSpeed accumulates on the host) and receives its
    updated 16-bit parameter partition after the CPU step. ZeRO-Infinity (Rajbhandari et al.
    SC'21 sec 5-6) moves the same states to NVMe and, with parameter offload, fetches each
    layer's parameter shard from host (or NVMe) before its all-gather, in forward and backward.
    FSDP's CPUOffload(offload_params=True) (Zhao et al. VLDB 2023 sec 3.3.3) does the latter from
    host memory.
    """

    pcie_down_per_microbatch: float = 0.0  # GPU -> host gradients, during backward
    pcie_down_per_step: float = 0.0  # GPU -> host, once (ZeRO-0/1 gradients, or updated params)
    pcie_up_per_microbatch: float = 0.0  # host -> GPU parameter shards before the gathers
    pcie_up_per_step: float = 0.0  # host -> GPU updated 16-bit parameters after the CPU step
    nvme_per_microbatch_node: float = 0.0  # NVMe bytes of the node per micro-batch (params)
    nvme_per_step_node: float = 0.0  # NVMe bytes of the node per step (optimizer states in and out)
    cpu_params_node: float = 0.0  # parameters the node's CPU updates per step
    gather_chunks: int = 1  # parameter fetches are prefetched layer by layer

    @property
    def used(self) -> bool:
        return any((self.pcie_down_per_microbatch, self.pcie_down_per_step, self.pcie_up_per_microbatch,
                    self.pcie_up_per_step, self.nvme_per_microbatch_node, self.nvme_per_step_node,
                    self.cpu_params_node))


def optimizer_shard_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters whose optimizer states one GPU owns (its ZeRO partition)."""
    n = params_per_rank(m, plan, stage)
    return n / plan.dp_shard if plan.shards_optimizer else n


def gpus_per_node_in_job(cluster: ClusterSpec) -> int:
    return min(cluster.gpus_per_node, cluster.world_size)


def offload_traffic(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, stage: int) -> OffloadTraffic:
    """PCIe and NVMe bytes and CPU work of ``plan.offload`` for one GPU of ``stage`` (see
    OffloadTraffic for the mechanisms and sources)."""
    off = plan.offload
    if not off.any:
        return OffloadTraffic()
    b = state_bytes(m, plan)
    n = params_per_rank(m, plan, stage)
    shard = optimizer_shard_params(m, plan, stage)
    pshard = n / plan.dp_shard if plan.shards_params else n
    gpn = gpus_per_node_in_job(cluster)
    pb = state_bytes_params(plan)
    gb16 = min(b.grads, float(plan.element_bytes))
    layers = max(1, stage_num_layers(m, plan, stage))
    down_mb = down_step = up_mb = up_step = nvme_mb = nvme_step = cpu = 0.0
    if off.optimizer != "none":
        if plan.shards_gradients:
            down_mb = shard * gb16  # each micro-batch's reduced partition (accumulated on the host)
        else:
            down_step = shard * b.grads
        cpu = shard * gpn
        if off.params == "none":
            up_step = shard * pb  # updated 16-bit partition back to the GPU
        if off.optimizer == "nvme":
            # fp32 master + optimizer states + fp32 gradient read in and written back per step
            nvme_step = 2 * shard * gpn * (b.optimizer + 4.0)
    if off.params != "none":
        gathers = 3 if plan.recompute == "full" else 2
        up_mb = gathers * pshard * pb
        if off.optimizer == "none":
            down_step += pshard * pb  # the GPU optimizer's updated 16-bit shard goes back
        if off.params == "nvme":
            nvme_mb = gathers * pshard * pb * gpn
            nvme_step += pshard * pb * gpn  # updated parameters written once
    return OffloadTraffic(down_mb, down_step, up_mb, up_step, nvme_mb, nvme_step, cpu, layers)


def cpu_optimizer_time(params_on_node: float, plan: ParallelPlan, host: HostSpec) -> float:
    """CPU optimizer step of the node: its parameters over the node's CPU Adam throughput
    (host.cpu_optimizer_throughput; Ren et al. 2021 sec 5.1, DeepSpeed CPU-Adam), scaled by the
    optimizer's memory traffic relative to Adam's (a CPU optimizer step is bandwidth-bound:
    it streams the fp32 states once)."""
    if params_on_node <= 0:
        return 0.0
    from simdist.analytic.cost import optimizer_bytes_per_param

    scale = (optimizer_bytes_per_param(plan.optimizer, "fp32", 4.0)
             / optimizer_bytes_per_param("adam", "fp32", 4.0))
    return params_on_node / host.cpu_optimizer_params_per_s * scale


@dataclass(frozen=True, slots=True)
class OffloadTimes:
    pcie_down_per_microbatch: float
    pcie_up_per_microbatch: float  # incl. the NVMe reads that feed it (pipelined: the slower)
    after_step: float  # CPU step, parameter upload and NVMe swap of the states, pipelined
    cpu_step: float
    before_step: float  # ZeRO-0/1 gradient download after the last backward


def offload_times(tr: OffloadTraffic, cluster: ClusterSpec, plan: ParallelPlan) -> OffloadTimes:
    """Seconds of each offload transfer. PCIe is per GPU per direction at PCIE_EFFICIENCY of the
    line rate; NVMe is the node's bandwidth shared by its GPUs. The CPU step, the upload of the
    updated parameters and the NVMe swap of the states run tile by tile in a pipeline (DeepSpeed
    CPU-Adam copies each updated tile while the next one is computed; ZeRO-Infinity overlaps NVMe
    swaps with the optimizer, Rajbhandari et al. SC'21 sec 6.2), so they cost the slowest."""
    host = cluster.host
    if host is None or not tr.used:
        return OffloadTimes(0.0, 0.0, 0.0, 0.0, 0.0)
    pcie = host.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY
    nvme = host.nvme_bandwidth_bytes_per_s
    down_mb = tr.pcie_down_per_microbatch / pcie
    up_mb = max(tr.pcie_up_per_microbatch / pcie, tr.nvme_per_microbatch_node / nvme)
    cpu = cpu_optimizer_time(tr.cpu_params_node, plan, host)
    after = max(cpu, tr.pcie_up_per_step / pcie, tr.nvme_per_step_node / nvme)
    return OffloadTimes(down_mb, up_mb, after, cpu, tr.pcie_down_per_step / pcie)


# --- parameter servers ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PSTraffic:
    """Push/pull traffic of the parameter-server modes in one step (bytes).

    Every worker (GPU) pushes its gradient and pulls the updated parameters, each split evenly
    over the servers (Li et al. OSDI'14, "Scaling Distributed Machine Learning with the
    Parameter Server"; BytePS docs/rationale.md): a server receives G x workers / servers and
    sends as much, with G = a worker's gradient bytes. Servers sit on the training nodes, spread
    evenly (one per node by default), so the traffic between a worker and a server on its own
    node stays off the NIC. Per node NIC and direction:
      out = g G (K - s)/K  [local workers' pushes to remote servers]
          + s G (W - g)/K  [local servers' replies to remote workers]
    and the same in, for g workers and s servers on the node, W workers and K servers in all.
    """

    workers: int
    servers: int
    worker_bytes: float  # G: one worker's push (= its pull)
    per_server_bytes: float  # in + out of one server: 2 G W / K
    node_nic_bytes: float  # per direction, the busiest node's NIC
    servers_per_node: int


def ps_server_count(plan: ParallelPlan, cluster: ClusterSpec) -> int:
    return plan.parameter_servers or cluster.num_nodes


def ps_traffic(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, stage: int = 0) -> PSTraffic:
    """Push/pull bytes of the parameter-server modes (see PSTraffic). Gradient compression
    shrinks both the push and the pull by its ratio (BytePS compresses both directions)."""
    n = params_per_rank(m, plan, stage)
    w = cluster.world_size
    k = ps_server_count(plan, cluster)
    g_node = gpus_per_node_in_job(cluster)
    wire = _uncompressed_grad_bytes(plan, False) * compression_ratio(m, plan, stage)
    worker_bytes = n * wire
    spn_max = math.ceil(k / cluster.num_nodes)
    spn_min = k // cluster.num_nodes

    def node_bytes(s: int) -> float:
        return g_node * worker_bytes * (k - s) / k + s * worker_bytes * (w - g_node) / k

    busiest = max(node_bytes(spn_max), node_bytes(spn_min))
    return PSTraffic(workers=w, servers=k, worker_bytes=worker_bytes,
                     per_server_bytes=2 * worker_bytes * w / k, node_nic_bytes=busiest,
                     servers_per_node=spn_max)


@dataclass(frozen=True, slots=True)
class PSTimes:
    nic: float  # the busiest NIC's push/pull time (full duplex: push in, pull out)
    server_cpu: float  # the servers' optimizer step per step (sync) or per worker cycle (async)
    worker_nic: float  # one worker's own push and pull at its share of the node's NIC


def ps_times(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, net: Network, stage: int = 0) -> PSTimes:
    """Seconds of one step's push/pull and server update. The NICs are full duplex, so pushes
    (in) and pulls (out) of different keys overlap: the busiest NIC carries ``node_nic_bytes`` per
    direction. A node's NIC bandwidth is net.inter_bw_node (achieved, all NICs); per push/pull a
    round trip of the inter-node latency. The servers apply the optimizer on the CPU
    (classic parameter server): the synchronous mode updates each server's 1/K of the parameters
    once per step; the asynchronous mode updates on every worker's push."""
    tr = ps_traffic(m, plan, cluster, stage)
    nic = 2 * net.inter_latency + tr.node_nic_bytes / net.inter_bw_node
    # a worker pushes G and pulls G at its share of the node's NIC (full duplex)
    own = 2 * net.inter_latency + tr.worker_bytes / (net.inter_bw_node / gpus_per_node_in_job(cluster))
    cpu = 0.0
    if cluster.host is not None:
        n_total = params_per_rank(m, plan, stage) * plan.model_parallel_size
        per_server = n_total / tr.servers
        updates = plan.dp if plan.async_parameter_servers else 1
        cpu = cpu_optimizer_time(per_server * tr.servers_per_node * updates, plan, cluster.host)
    return PSTimes(nic, cpu, own)


def async_staleness_steps(plan: ParallelPlan) -> float:
    """Mean staleness of an asynchronous parameter server in updates: with W workers of equal
    speed taking turns, W - 1 other updates land between a worker's pull and its push (Dean et
    al. NIPS'12, Downpour SGD; Lian et al. NIPS'15, the staleness bound tau ~ number of workers).
    Counted per model replica (dp workers update the same parameters)."""
    return float(max(0, plan.dp - 1))
