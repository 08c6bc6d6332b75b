"""Elementwise ops run eagerly: PyTorch without ``torch.compile`` runs every op of a composite
module as its own kernel, each reading its inputs from HBM and writing its output back, where a
fused kernel (Transformer Engine's, Megatron's, or torch.compile's Inductor output) reads the
input once and writes the result once. :func:`traffic_factor` is how many times the fused HBM
traffic the eager op list moves, per op of a Llama-style block, counted from the ops the models
run (torchtitan's llama3 model @ the 2024-12 benchmarks, the Llama reference implementation's
RMSNorm and complex-number RoPE); per element, bf16 = 2 B, fp32 = 4 B:

- RMSNorm ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight``:
  float() 2+4, pow 4+4, mean 4, the product 4+4, type_as 4+2, * weight 2+2 = 36 B against the
  fused 2+2 = 4 B: 9x forward. Backward differentiates each of those kernels (about two reads
  and one write each): the same ratio is used.
- RoPE (``view_as_complex(x.float())``, the complex product with the frequencies, back to bf16):
  float() 2+4, the product 4+4, type_as 4+2 = 20 B against 2+2: 5x, backward alike.
- SwiGLU ``silu(w1 x) * w3 x``: silu 2+2, the product 2+2+2 = 10 B against the fused
  2+2+2 = 6 B forward; backward the product's 2+2+2+2+2 and silu's 2+2+2 = 16 B against 12 B.
- LayerNorm and GELU are one ATen kernel each (native_layer_norm, gelu) eager or not: 1x.
"""

from __future__ import annotations

from simdist.spec.frameworks import framework_of
from simdist.spec.plan import ParallelPlan

RMSNORM = 36.0 / 4.0
ROPE = 20.0 / 4.0
SWIGLU = {"fwd": 10.0 / 6.0, "bwd": 16.0 / 12.0}


def fused(plan: ParallelPlan) -> bool:
    """Whether the elementwise ops run fused: ``plan.fused_elementwise`` when set, else the
    framework's (torchtitan's llama3 train configs leave ``compile`` off; Megatron-Core and
    Transformer Engine ship fused kernels)."""
    if plan.fused_elementwise is not None:
        return plan.fused_elementwise
    return framework_of(plan.framework).fused_elementwise


def traffic_factor(plan: ParallelPlan, op: str, phase: str, norm: str = "rmsnorm") -> float:
    """HBM traffic of the eager op list over the fused kernel's for ``op`` ("norm", "rope",
    "swiglu"), 1 when the plan runs fused kernels."""
    if fused(plan):
        return 1.0
    if op == "norm":
        return RMSNORM if norm == "rmsnorm" else 1.0
    if op == "rope":
        return ROPE
    if op == "swiglu":
        return SWIGLU[phase]
    return 1.0


def mlp_hidden_saved(mlp: str, plan: ParallelPlan) -> tuple[str, ...]:
    """The f-wide tensors of the MLP's activation that backward keeps, before the last GEMM's
    input (the activation's output, saved by that GEMM).

    GELU saves its input (``fc1 output``) eager or fused (one ATen kernel; Megatron's fused
    bias-GELU saves its input). SwiGLU eager, ``silu(w1 x) * w3 x``: silu saves its input
    (``gate``), the product both of its operands (``silu(gate)`` and ``up``). A fused SwiGLU
    recomputes silu in its backward and saves only its input, gate and up (Megatron-Core's
    fused bias-SwiGLU autograd function and Transformer Engine's swiglu save the fc1 output
    alone; torch.compile's partitioner recomputes the pointwise silu rather than save it)."""
    if mlp != "swiglu":
        return ("fc1 output",)
    return ("gate", "up") if fused(plan) else ("gate", "up", "silu(gate)")
