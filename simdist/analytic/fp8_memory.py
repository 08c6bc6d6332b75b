"""FP8 training's own memory: weight copies in FP8 and their transposes, scaling state, the width
of saved GEMM inputs, and the width of FSDP's all-gathered weights (``plan.fp8_recipe``).

The fp32 master weights, the 16-bit working weights and the gradients are unchanged by FP8
(both stacks keep 16-bit parameters and cast them); what FP8 adds or shrinks:

Transformer Engine (Megatron-Core, NeMo; recipes delayed = DelayedScaling, tensorwise =
Float8CurrentScaling, blockwise = Float8BlockScaling, mxfp8 = MXFP8BlockScaling):
- Hopper's FP8 tensor cores take only the TN layout, so TE keeps each weight in FP8 and its FP8
  transpose, and caches both across the micro-batches of a step (``is_first_microbatch``:
  "the weights are cast to FP8 once and the cached copy is reused"; TE docs, "Using FP8 with
  Transformer Engine"): 2 B per weight. MXFP8 (Blackwell) keeps row-wise and column-wise
  copies, each with one E8M0 scale per 32 values: 2 x (1 + 1/32) B. Block scaling keeps both
  with an fp32 scale per 128 x 128 weight block: 2 x (1 + 4/16384) B.
- Delayed scaling keeps an amax history per tensor: ``amax_history_len`` 1024 by default
  (transformer_engine.common.recipe.DelayedScaling) for the input, weight and gradient of each
  GEMM, plus scale and inverse scale, in fp32.
- Linear layers save their input in FP8 for the weight-gradient GEMM (the column-wise copy):
  1 B per element instead of 2 (MXFP8 + 1/32 for its scales, 1x128 blocks + 4/128).

torchao Float8Linear (torchtitan; tensorwise dynamic scaling by default, rowwise = axiswise):
- tensorwise saves the FP8 input and the FP8 weight for backward
  (``manual_float8_matmul_with_args_in_float8``); with FSDP2 the weights are all-gathered in FP8
  (``enable_fsdp_float8_all_gather``, torchao.float8.fsdp_utils), so the saved weight is the
  gathered one and nothing is cached across micro-batches; the gathered weights take 1 B;
- rowwise saves the high-precision input and weight and casts again in backward
  (``manual_float8_matmul_with_args_in_hp``): no FP8 copies, 16-bit saved inputs.
"""

from __future__ import annotations

from simdist.analytic.memory_conventions import conventions, fp8_recipe
from simdist.analytic.params import attention_params, expert_mlp_params, mlp_params
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

AMAX_HISTORY_LEN = 1024  # transformer_engine DelayedScaling default
TE_GEMMS_PER_LAYER = 4  # QKV (LayerNormLinear), projection, FC1 and FC2 (LayerNormMLP)


def linear_weight_params(m: ModelSpec, plan: ParallelPlan) -> int:
    """Weights of one layer's linear layers on one GPU (what FP8 GEMMs read): attention and MLP
    matrices, without norms and biases. In a mixture of experts the GPU holds num_experts / ep
    routed experts of each MoE layer, each split over etp, and the shared experts split over tp
    (Megatron-Core's expert layout); the mean over the model's dense and MoE layers."""
    att, mlp = attention_params(m), mlp_params(m)
    dense = (att.sharded + mlp.sharded) // plan.tp
    if not m.is_moe:
        return dense
    expert = expert_mlp_params(m).sharded
    moe = (att.sharded + expert * m.num_shared_experts) // plan.tp \
        + expert * m.num_experts // (plan.ep * plan.etp)
    n_moe = m.num_layers - min(m.first_dense_layers, m.num_layers)
    return round((n_moe * moe + (m.num_layers - n_moe) * dense) / m.num_layers)


def weight_cache_bytes_per_param(plan: ParallelPlan) -> float:
    """FP8 copies of each linear weight kept across the step's micro-batches (bytes per weight)."""
    recipe = fp8_recipe(plan)
    if recipe is None or conventions(plan).fp8_stack == "torchao":
        return 0.0
    if recipe == "mxfp8":
        return 2 * (1 + 1 / 32)
    if recipe == "blockwise":
        return 2 * (1 + 4 / (128 * 128))
    return 2.0  # FP8 weight and its transpose


def scaling_state_bytes(layers: int, plan: ParallelPlan) -> float:
    """Delayed scaling's amax histories, scales and inverse scales for ``layers`` layers."""
    if fp8_recipe(plan) != "delayed" or conventions(plan).fp8_stack != "te":
        return 0.0
    return layers * TE_GEMMS_PER_LAYER * 3 * (AMAX_HISTORY_LEN + 2) * 4.0


def saved_input_bytes(plan: ParallelPlan) -> float:
    """Bytes per element of a saved GEMM input: FP8 where the recipe saves FP8 (with its
    scales), else the 16-bit element."""
    recipe = fp8_recipe(plan)
    if recipe is None or (recipe == "rowwise" and conventions(plan).fp8_stack == "torchao"):
        return float(plan.element_bytes)
    if recipe == "mxfp8":
        return 1 + 1 / 32
    if recipe == "blockwise":
        return 1 + 4 / 128
    return 1.0


def gathered_weight_bytes(plan: ParallelPlan) -> float:
    """Bytes per parameter that ZeRO-3/FSDP all-gathers: FP8 under torchao's float8 all-gather
    (tensorwise), int8 plus a block scale under ZeRO++ qwZ, else the working precision."""
    if fp8_recipe(plan) in ("tensorwise", "delayed") and conventions(plan).fp8_stack == "torchao":
        return 1.0
    return float(plan.element_bytes)


def saved_fp8_weight_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """torchao tensorwise without FSDP's float8 all-gather and without recomputation: the FP8
    weights each layer saves for backward, per layer and micro-batch."""
    if (fp8_recipe(plan) != "tensorwise" or conventions(plan).fp8_stack != "torchao"
            or plan.shards_params or plan.recompute != "none"):
        return 0.0
    return float(linear_weight_params(m, plan))


def describe_fp8(plan: ParallelPlan) -> str | None:
    """One clause for the memory assumptions, or None outside FP8."""
    recipe = fp8_recipe(plan)
    if recipe is None:
        return None
    stack = conventions(plan).fp8_stack
    copies = weight_cache_bytes_per_param(plan)
    cached = f"{copies:.2f} B per weight of cached FP8 copies" if copies else "no cached FP8 weight copies"
    gathered = ", FSDP all-gathers weights in FP8" if plan.shards_params and gathered_weight_bytes(plan) == 1 else ""
    return (f"FP8 {recipe} ({'Transformer Engine' if stack == 'te' else 'torchao'}): {cached}, saved GEMM "
            f"inputs at {saved_input_bytes(plan):.2f} B{gathered}")
