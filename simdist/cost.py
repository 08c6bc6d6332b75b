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

import math

from simdist.calibrate.profile import CalibrationProfile
from simdist.sim.ops import Compute
from simdist.spec.cluster import GpuSpec

# (tile rows, tile cols, relative per-tile efficiency)
_TILES = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.92), (128, 64, 0.80), (64, 64, 0.60))
_K_HALF = 48  # inner dimension at which the main loop reaches half its steady efficiency
_SEQ_HALF = 384  # FlashAttention: sequence length at which a kernel reaches half its peak
KERNEL_OVERHEAD_S = 4e-6  # launch gap between dependent kernels on a busy stream


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
        if self.profile and self.profile.peak_flops:
            return self.profile.peak_flops
        return self.gpu.peak("bf16" if self.precision == "fp8" else self.precision)

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
        if key == "gemm" and self.precision == "fp8":
            return eff.get("fp8_gemm", eff["gemm"])
        return eff[key]

    def time(self, op: Compute) -> float:
        t = self._cache.get(op)
        if t is None:
            t = self._cache[op] = _op_time(self, op)
        return t

    def gemm_efficiency(self, op: Compute) -> float:
        if self.profile:
            fitted = self.profile.efficiency("gemm", op.flops)
            if fitted is not None:
                return fitted
        return self._eff("gemm") * gemm_shape_efficiency(op.m, op.n, op.k, self.gpu.sms, op.batch)

    def attention_efficiency(self, op: Compute) -> float:
        if self.profile:
            fitted = self.profile.efficiency("attention", op.flops)
            if fitted is not None:
                return fitted
        # FlashAttention kernels tile over the sequence; short sequences and small heads fill
        # the tiles poorly (Dao 2023, FlashAttention-2, Figs. 4-7: throughput rises with
        # sequence length and is lower for head dim 64 than 128).
        seq = op.m / (op.m + _SEQ_HALF)
        head = min(1.0, (op.k / 128) ** 0.25)
        return self._eff("attention") * seq * head

    def memory_efficiency(self, nbytes: float) -> float:
        if self.profile:
            fitted = self.profile.efficiency("memory", nbytes)
            if fitted is not None:
                return fitted
        return self._eff("memory")


def _op_time(cm: CostModel, op: Compute) -> float:
    if op.kind == "gemm":
        compute = op.flops / (cm.peak * cm.gemm_efficiency(op))
        e = 4 if cm.precision == "fp32" else (1 if cm.precision == "fp8" else 2)
        traffic = (op.m * op.k + op.k * op.n + op.m * op.n) * op.batch * e
        return max(compute, traffic / (cm.memory_bandwidth * cm.memory_efficiency(traffic))) + cm.kernel_overhead
    if op.kind == "attention":
        # Efficiency is on the full s x s FLOP count (the MFU convention of Megatron-LM and
        # MosaicML), so it folds in however much of the causal half a kernel manages to skip.
        return op.flops / (cm.attention_peak * cm.attention_efficiency(op)) + cm.kernel_overhead
    return op.bytes / (cm.memory_bandwidth * cm.memory_efficiency(op.bytes)) + cm.kernel_overhead


def optimizer_bytes_per_param(optimizer: str, precision: str, grad_bytes: float) -> float:
    """HBM traffic of one optimizer step per parameter (fused multi-tensor kernels).

    Adam/AdamW: read fp32 master, m, v and the gradient; write master, m, v and the 16-bit
    parameter; plus a gradient read for the global-norm clip. LAMB/LARS add a pass over
    weights and updates for the per-layer trust ratio (You et al. 2020; You et al. 2017).
    """
    master = 0.0 if precision == "fp32" else 4.0
    param = 4.0 if precision == "fp32" else 2.0
    states = {"adam": 8.0, "adamw": 8.0, "lamb": 8.0, "sgd": 4.0, "lars": 4.0, "adafactor": 4.5}[optimizer]
    traffic = 2 * (master + states) + grad_bytes + param + grad_bytes  # + clip-norm read
    if precision == "fp32":
        traffic += param  # read and write the weights in place
    if optimizer in ("lamb", "lars"):
        traffic += 2 * (master or param)  # weight and update norms
    return traffic
