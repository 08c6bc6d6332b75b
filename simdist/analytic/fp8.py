"""FP8 training as Transformer Engine and torchao run it: which recipe a plan gets, which GEMMs run
in FP8, and the memory-bound cast kernels each recipe adds (the ops in :mod:`simdist.analytic.ops`
carry them; :mod:`simdist.analytic.cost` times them).

Which GEMMs: the linear layers of every transformer block run their forward (fprop), input-
gradient (dgrad) and weight-gradient (wgrad) GEMMs in FP8 under every recipe here (Transformer
Engine's DelayedScaling, Float8CurrentScaling, Float8BlockScaling and MXFP8BlockScaling recipes
quantize all three by default; torchao's float8 tensorwise and rowwise recipes too). The
attention core (Transformer Engine's DotProductAttention without ``fp8_dpa``; SDPA), the LM head
(Megatron's output layer is not a TE module; torchtitan excludes "output" from float8) and the MoE
router stay in BF16.

Casts, per element of each GEMM operand (HBM bytes, read + write):
- delayed scaling (TE default on Hopper): the scale is last step's amax, so one fused
  cast-transpose kernel reads the BF16 tensor and writes the FP8 tensor and its transpose (the
  wgrad operand), recording the amax on the way: 2 + 1 + 1 = 4 B;
- tensorwise current scaling (TE Float8CurrentScaling, torchao's dynamic tensorwise): the amax
  of this very tensor first (one more read), then the cast-transpose: 2 + 4 = 6 B;
- rowwise (torchao): per-row scales for the GEMM operand and per-column ones for its transpose,
  each its own quantization pass: 2 x (2 + 1) = 6 B;
- blockwise (TE Float8BlockScaling, 1x128 and 128x128 blocks) and MXFP8 (32-element blocks):
  scales computed inside the quantization kernel, which writes both orientations: 4 B.
Weights: Transformer Engine quantizes a weight on the first micro-batch of a step and reuses it
(``is_first_microbatch``, as Megatron passes it); torchao quantizes it in every forward, and its
transpose again for dgrad.
"""

from __future__ import annotations

from simdist.spec.frameworks import framework_of
from simdist.spec.plan import ParallelPlan

CAST_BYTES = {"delayed": 4.0, "tensorwise": 6.0, "rowwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0}
MXFP8_GPUS = ("b200", "gb200", "b300", "gb300")  # Blackwell: TE's default recipe is MXFP8


def recipe(plan: ParallelPlan, gpu_name: str = "") -> str:
    """The plan's FP8 recipe: ``fp8_recipe`` when set, else its framework's default: torchao's
    tensorwise dynamic scaling for PyTorch / torchtitan, Transformer Engine's otherwise
    (get_default_fp8_recipe: MXFP8 on Blackwell, delayed scaling before)."""
    if plan.fp8_recipe:
        return plan.fp8_recipe
    default = framework_of(plan.framework).fp8_recipe
    if default != "te-default":
        return default
    return "mxfp8" if gpu_name.startswith(MXFP8_GPUS) else "delayed"


def uses_torchao(plan: ParallelPlan) -> bool:
    """torchao float8 (PyTorch / torchtitan) rather than Transformer Engine."""
    return framework_of(plan.framework).fp8_recipe != "te-default"


def cast_bytes(plan: ParallelPlan) -> float:
    """HBM bytes per element to quantize one GEMM operand (and its transpose) under the recipe."""
    return CAST_BYTES[recipe(plan)]


def weight_casts_per_microbatch(plan: ParallelPlan) -> float:
    """Weight quantizations per micro-batch: torchao quantizes the weight for fprop and its
    transpose for dgrad in every micro-batch (2); Transformer Engine once per step, on the first
    micro-batch (1 / micro-batches)."""
    if uses_torchao(plan):
        return 2.0
    return 1.0 / max(1, plan.num_microbatches)


# Kernels Transformer Engine launches to quantize one tensor (transformer_engine/pytorch/csrc/
# quantizer.cpp): Float8CurrentScalingQuantizer::quantize_impl runs nvte_compute_amax, then
# nvte_compute_scale_from_amax, then nvte_quantize_v2, one after the other on the stream;
# block-scaled and MXFP8 quantizers compute their scales inside one nvte_quantize_v2.
TE_KERNELS_PER_TENSOR = {"tensorwise": 3, "blockwise": 1, "mxfp8": 1, "delayed": 1}


def quantize_kernels(plan: ParallelPlan, tensors: int) -> int:
    """Kernels that quantize ``tensors`` tensors of one grouped operand (one per local expert:
    Transformer Engine's GroupedLinear splits its input by expert and quantizes each split with
    its own quantizer, tex.split_quantize). Transformer Engine fuses the splits into one
    nvte_multi_cast_transpose only under delayed scaling ("Currently only have fused kernel for
    FP8 delayed scaling", multi_tensor_quantize_impl in pytorch/csrc/extensions/cast.cpp); every
    other recipe quantizes them one by one (:data:`TE_KERNELS_PER_TENSOR` each). torchao's MoE
    training (torchao/prototype/moe_training/scaled_grouped_mm.py, ``_scaled_grouped_mm``)
    quantizes the whole token operand at once, row-wise, and the jagged per-expert scales of the
    backward in one Triton launch: one."""
    if uses_torchao(plan):
        return 1
    r = recipe(plan)
    if r == "delayed":
        return 1
    return TE_KERNELS_PER_TENSOR.get(r, 1) * tensors


def description(plan: ParallelPlan, gpu_name: str = "") -> str:
    r = recipe(plan, gpu_name)
    lib = "torchao float8" if uses_torchao(plan) else "Transformer Engine"
    origin = "as set" if plan.fp8_recipe else "the framework's default"
    return (f"FP8 recipe {r} ({lib}, {origin}): fprop, dgrad and wgrad GEMMs of the transformer linears in FP8, "
            f"attention, LM head and router in BF16; casts {CAST_BYTES[r]:g} B per operand element as memory-bound "
            "kernels" + ("; weights quantized every micro-batch" if uses_torchao(plan)
                         else "; weights quantized once per step"))
