"""How long compute ops take on one GPU: GEMMs by FLOPs over peak x efficiency, with the
efficiency lowered for small and skinny shapes; attention by its FLOPs at the fused-kernel
efficiency; memory-bound ops by bytes over HBM bandwidth. A calibration profile, when given,
supplies the efficiencies measured on the hardware at hand.

Shape model for GEMMs (the mechanism, not a fitted table): cuBLAS-style kernels cover the
output with tiles scheduled in waves over the SMs, so efficiency = tile fill x wave fill
(the best over common tile shapes; smaller tiles run less efficiently per FLOP), times a
pipeline-depth factor k/(k + k0) for short inner dimensions, and never faster than the
memory roofline (NVIDIA, "Matrix Multiplication Background User's Guide", sections on tile
and wave quantization and arithmetic intensity).
"""

from __future__ import annotations

import functools
import math

from simdist.analytic.host import SYNC_ROUND_TRIP_S
from simdist.analytic.ops import Compute
from simdist.spec.cluster import GpuSpec, HostSpec
from simdist.spec.frameworks import framework_of
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import CalibrationProfile

# (tile rows, tile cols, relative per-tile efficiency)
_TILES = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.92), (128, 64, 0.80), (64, 64, 0.60))
_K_HALF = 48  # inner dimension at which the main loop reaches half its steady efficiency
_SEQ_HALF = 384  # FlashAttention: sequence length at which a kernel reaches half its peak
KERNEL_OVERHEAD_S = 4e-6  # launch gap between dependent kernels on a busy stream
_KEY_BLOCK = 128  # FlashAttention's key/value tile (FlashAttention-2 paper sec 3.3: blocks of 64 or 128)


def causal_share(keys: int) -> float:
    """The share of the full s x s square a causal FlashAttention kernel computes: the key tiles on
    or below the diagonal, nb(nb + 1)/2 of nb^2 with nb = keys / 128 (the tiles above it are
    skipped). The catalog's ``efficiency.attention`` is a fraction of peak on these computed FLOPs
    (a physical fraction, at most 1); the FLOP counts stay on the full square (the MFU convention
    of Megatron-LM and MosaicML), so the full-square efficiency is the computed one over this share."""
    nb = max(1, math.ceil(keys / _KEY_BLOCK))
    return (nb + 1) / (2 * nb)


# FlashAttention in Triton (the FlashAttention-1 algorithm with an attention-bias input, which
# llm-foundry's MPT runs for ALiBi as ``attn_impl: triton``) against FlashAttention-2, forward and
# backward together: "1.3-2.5x faster than FlashAttention in Triton" (Dao 2023, FlashAttention-2,
# arXiv:2307.08691 sec 4.1, A100 benchmarks). The geometric middle of that range:
# sqrt(1.3 x 2.5) = 1.80.
TRITON_FA_SLOWDOWN = 1.80


@functools.lru_cache(maxsize=65536)
def gemm_shape_efficiency(m: int, n: int, k: int, sms: int, batch: int = 1) -> float:
    """Fraction of a GPU's large-GEMM efficiency that a (m x k)(k x n) GEMM reaches."""
    best = 0.0
    for tm, tn, q in _TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(tiles / sms)
        fill = (m * n * batch) / (waves * sms * tm * tn)
        best = max(best, fill * q)
    return best * k / (k + _K_HALF)


class CostModel:
    """Times compute ops of one GPU type and precision (memoised per op)."""

    def __init__(self, gpu: GpuSpec, precision: str, profile: CalibrationProfile | None = None):
        self.gpu, self.precision, self.profile = gpu, precision, profile
        self._cache: dict[Compute, float] = {}

    @property
    def peak(self) -> float:
        if self.profile and self.profile.peak_flops:
            return self.profile.peak_flops
        return self.gpu.peak(self.precision)

    @property
    def attention_peak(self) -> float:
        """Attention runs in 16-bit even in FP8 training (Transformer Engine's default)."""
        return self.sixteen_bit_peak

    @property
    def sixteen_bit_peak(self) -> float:
        """The peak of everything FP8 training does not run in FP8 (attention, LM head, router):
        BF16; the plan's own precision otherwise."""
        if self.profile and self.profile.peak_flops:
            return self.profile.peak_flops
        return self.gpu.peak("bf16" if self.precision == "fp8" else self.precision)

    def gemm_peak(self, op: Compute) -> float:
        return self.peak if op.fp8 else self.sixteen_bit_peak

    @property
    def memory_bandwidth(self) -> float:
        if self.profile and self.profile.memory_bandwidth_bytes_per_s:
            return self.profile.memory_bandwidth_bytes_per_s
        return self.gpu.memory_bandwidth_bytes_per_s

    @property
    def kernel_overhead(self) -> float:
        if self.profile and self.profile.kernel_overhead_s is not None:
            return self.profile.kernel_overhead_s
        return KERNEL_OVERHEAD_S

    def _eff(self, key: str) -> float:
        eff = self.gpu.efficiency
        if key == "fp8_gemm":
            return eff.get("fp8_gemm", eff["gemm"])
        return eff[key]

    def memory_time(self, nbytes: float, kernels: int = 1) -> float:
        """A memory-bound pass of ``nbytes`` of HBM traffic in ``kernels`` kernels (0 if none)."""
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.memory_bandwidth * self.memory_efficiency(nbytes)) + kernels * self.kernel_overhead

    def select_time(self, elements: float, k: float) -> float | None:
        """Top-k selection of ``k`` of one ``elements``-long tensor at the profile's measured
        rates (v8); None without them (the selection is then priced as radix-select passes over
        memory)."""
        return self.profile.select_time(elements, k) if self.profile else None

    def weight_fetch_time(self, op: Compute) -> float:
        """What a GEMM pays to fetch its layer's weight from memory, at a CPU profile's measured
        cost by the weight's size (v11, executor.bench.bench_cold_gemm), which the profile keeps
        only where the ranks' working sets overflow the cache (simdist.analytic.cache_residency);
        a round of ``batch`` experts' GEMMs fetches each expert's weight."""
        if self.profile is None or op.weight <= 0 or not self.profile.weight_fetch_s:
            return 0.0
        return op.batch * self.profile.weight_fetch(op.weight / op.batch * _element_bytes(self.precision, op.fp8))

    def pointwise_time(self, op: Compute) -> float:
        """What a pointwise op computes, at a CPU profile's measured rate per element of its kind
        and pass (v13, executor.bench.bench_pointwise); 0 where the profile has none (a GPU's
        pointwise ops stream their bytes: the memory-bound price stands alone)."""
        t = self.profile.pointwise_time(op.pointwise, op.elements) if self.profile and op.pointwise else None
        return t or 0.0

    def time(self, op: Compute) -> float:
        t = self._cache.get(op)
        if t is None:
            t = self._cache[op] = _op_time(self, op)
        return t

    def gemm_efficiency(self, op: Compute) -> float:
        if self.profile:  # a CPU profile may hold its GEMMs in another precision apart (gemm.bf16)
            fitted = self.profile.efficiency(f"gemm.{self.precision}", op.flops)
            if fitted is None:
                fitted = self.profile.efficiency("gemm", op.flops)
            if fitted is not None:
                return fitted
        return self._eff("fp8_gemm" if op.fp8 else "gemm") * gemm_shape_efficiency(op.m, op.n, op.k, self.gpu.sms,
                                                                                 op.batch)

    def attention_efficiency(self, op: Compute) -> float:
        """Fraction of peak on the full-square FLOP count: a calibration profile's (measured on
        that count), else the catalog's fraction on the computed FLOPs over :func:`causal_share`."""
        if self.profile:  # its microbenchmark times forward + backward, 3x the forward's FLOPs: an op is
            # priced as its share of such a pair (backward here is 2.5x forward, so the pair is 1.2x it)
            fitted = self.profile.efficiency("attention", op.flops * (1.2 if op.name.endswith(" bwd") else 3.0))
            if fitted is not None:
                return fitted
        # FlashAttention kernels tile over the sequence; short sequences and small heads fill
        # the tiles poorly (Dao 2023, FlashAttention-2, Figs. 4-7: throughput rises with
        # sequence length and is lower for head dim 64 than 128).
        seq = op.m / (op.m + _SEQ_HALF)
        head = min(1.0, (op.k / 128) ** 0.25)
        computed = min(1.0, self._eff("attention") * seq * head * self.kernel_speed(op.kernel))
        return computed / causal_share(op.n)

    def kernel_speed(self, kernel: str) -> float:
        """A fused attention kernel's speed relative to FlashAttention-2 (what ``efficiency.
        attention`` measures): the GPU's ``fused_attention_speedup`` for cuDNN's fused attention
        (FlashAttention-3 class on Hopper), 1/:data:`TRITON_FA_SLOWDOWN` for FlashAttention in Triton."""
        if kernel == "cudnn":
            return self.gpu.fused_attention_speedup
        if kernel == "triton":
            return 1.0 / TRITON_FA_SLOWDOWN
        return 1.0

    def memory_efficiency(self, nbytes: float, cold: bool = False) -> float:
        """Fraction of the memory bandwidth a pass of ``nbytes`` achieves; ``cold``: over data
        out of the cache, at a CPU profile's cold-copy curve where it has one (profile v8)."""
        if self.profile:
            fitted = self.profile.efficiency("memory.cold", nbytes) if cold else None
            if fitted is None:
                fitted = self.profile.efficiency("memory", nbytes)
            if fitted is not None:
                return fitted
        return self._eff("memory")


def _element_bytes(precision: str, fp8: bool) -> int:
    return 4 if precision == "fp32" else (1 if fp8 else 2)


def _op_time(cm: CostModel, op: Compute) -> float:
    if op.kind == "sync":  # the drain's round trip; the refill after it: simdist.analytic.host
        return SYNC_ROUND_TRIP_S
    if op.kind == "gemm":
        compute = op.flops / (cm.gemm_peak(op) * cm.gemm_efficiency(op))
        traffic = (op.m * op.k + op.k * op.n + op.m * op.n) * op.batch * _element_bytes(cm.precision, op.fp8)
        return (max(compute, traffic / (cm.memory_bandwidth * cm.memory_efficiency(traffic))) + cm.kernel_overhead
                + cm.weight_fetch_time(op))
    if op.kind == "attention":
        # FLOPs on the full s x s square (the MFU convention of Megatron-LM and MosaicML); the
        # efficiency is on that count too: the computed fraction of peak over the causal share.
        return op.flops / (cm.attention_peak * cm.attention_efficiency(op)) + cm.kernel_overhead
    # a memory op of ``batch`` kernels (an expert's FP8 quantization each: simdist.analytic.moe) pays each its gap
    # on a CPU a pointwise op streams its bytes or computes its elements, whichever takes longer
    cold = op.kind == "copy"
    streamed = op.bytes / (cm.memory_bandwidth * cm.memory_efficiency(op.bytes, cold))
    return max(streamed, cm.pointwise_time(op)) + cm.kernel_overhead * op.batch


def optimizer_bytes_per_param(optimizer: str, precision: str, grad_bytes: float) -> float:
    """HBM traffic of one optimizer step per parameter (fused multi-tensor kernels), in bytes.

    Every optimizer reads the gradient twice (the global-norm clip, then the update) and writes
    the 16-bit working copy of the weight after updating the fp32 master (mixed precision,
    Micikevicius et al. 2018); in fp32 training the weight is read and written in place. Then:
      adam / adamw (Kingma & Ba 2015; Loshchilov & Hutter 2019): read and write m and v
        (30 B per parameter with 16-bit gradients);
      sgd with momentum: read and write the momentum buffer;
      lars (You, Gitman & Ginsburg 2017): sgd + the per-layer trust ratio ||w|| / ||g||, one more
        read of the weights and of the gradient;
      lamb (You et al. ICLR 2020, Alg. 2; NVIDIA apex FusedLAMB's two stages): adam's update is
        written out, the norms of the weights and of the update read them, and the second stage
        reads the update again: + 4 (write u) + 4 + 4 (norms) + 4 (read u);
      adafactor (Shazeer & Stern 2018, Alg. 4 with momentum, as Hugging Face's "slightly more
        than 4 bytes" per parameter): the momentum (read, write), one more gradient read for the
        factored row/column statistics of g^2, and the update written then read for its RMS
        clipping; the factored moments are O(rows + cols) and negligible.
    """
    master = 0.0 if precision == "fp32" else 4.0
    param = 4.0 if precision == "fp32" else 2.0
    weights = master or param  # the fp32 copy the update reads and writes
    clip = grad_bytes  # global gradient-norm clip reads the gradient once more
    base = 2 * weights + grad_bytes + clip + (param if master else 0.0)
    extra = {
        "adam": 2 * 8.0,
        "adamw": 2 * 8.0,
        "sgd": 2 * 4.0,
        "lars": 2 * 4.0 + weights + grad_bytes,
        "lamb": 2 * 8.0 + 4 * weights,
        "adafactor": 2 * 4.0 + grad_bytes + 2 * weights,
    }[optimizer]
    return base + extra


def grad_buffer_pass_bytes(params: float, plan: ParallelPlan) -> float:
    """HBM traffic per step of the passes a framework makes over the rank's whole gradient buffer
    (``params`` parameters, unsharded) besides reducing it (Framework.grad_buffer_passes), when the
    plan keeps one contiguous buffer (ZeRO 0/1; ZeRO-2/3 shard the gradients as they come).

    Megatron-LM / Megatron-Core (r0.8, megatron/core/distributed): two, each
    ``plan.grad_buffer_bytes`` per parameter. ``train_step`` calls ``zero_grad_buffer()`` on every
    model chunk before the first micro-batch, a memset of the buffer (one write); and each bucket's
    ``start_grad_sync`` first takes ``grad_data.norm(p=2)`` to refuse NaN gradients
    (``check_for_nan_in_grad``, on in Megatron-LM through ``--check-for-nan-in-loss-and-grad``,
    default True), one read of the buffer. The optimizer's own gradient-norm clip reads only its
    shard (:func:`optimizer_bytes_per_param`)."""
    passes = framework_of(plan.framework).grad_buffer_passes
    if passes <= 0 or plan.zero_stage > 1 or params <= 0:
        return 0.0
    return passes * params * plan.grad_buffer_bytes


def cpu_optimizer_time(params: float, plan: ParallelPlan, host: HostSpec) -> float:
    """A node's CPU optimizer step over ``params`` parameters: the node's CPU Adam throughput
    (host.cpu_optimizer_throughput; Ren et al. 2021 sec 5.1, DeepSpeed CPU-Adam), scaled by the
    optimizer's memory traffic relative to Adam's (a CPU optimizer step is bandwidth-bound:
    it streams the fp32 states once). ZeRO-Offload and the parameter servers run it."""
    if params <= 0:
        return 0.0
    scale = (optimizer_bytes_per_param(plan.optimizer, "fp32", 4.0)
             / optimizer_bytes_per_param("adam", "fp32", 4.0))
    return params / host.cpu_optimizer_params_per_s * scale
