"""The optimizer step as the CPU executor runs it: a loop over parameter tensors.

PyTorch's Adam/AdamW/SGD on CPU tensors take the per-tensor ("for-loop") path: the multi-tensor
``foreach`` and ``fused`` implementations are the defaults on CUDA only (torch.optim docs,
"Algorithms": foreach is chosen when all tensors are on CUDA). So each parameter tensor costs a
handful of small ops whatever its size, and under DTensor (TP, FSDP2) each of those ops also
goes through DTensor's dispatch. A calibration profile that fitted it (``optimizer_tensor_s``,
plus ``optimizer_layer_tensor_s`` of the plan's software layers) prices the step as the bytes it
streams (memory-bound, cost.py) plus that cost per tensor the rank holds; other profiles, and
the catalog GPUs, keep the fused-kernel pricing of :func:`simdist.analytic.stage.gpu_optimizer_time`.

Under tensor parallelism the parameters are DTensors, except where the executor wraps the model
in DDP (ZeRO 0 or 1 with data parallelism, outside a multi-chunk pipeline): torch's TP x DDP
bridge (``_pre_dp_module_transform``, executor.parallelize.localize_tensor_parallel_params) swaps
each DTensor parameter for its local shard and rebuilds the DTensors in a forward pre-hook, so
the optimizer steps plain tensors and does not pay the TP layer's per-tensor term (measured
2026-11-28: the `tiny` model at TP 2, 1.7 ms of optimizer CPU time per step with DDP over 2
replicas against 9.1 ms without).

The tensor count follows the executor's model (executor/model.py, executor/moe.py): per block
the q, k, v, o projections and two (GELU) or three (SwiGLU) MLP projections, each with a bias
when the model has biases, two norms (weight, and bias for LayerNorm); an MoE block holds a
router and two expert weights (each with a bias when the model has biases) in place of its MLP;
the first stage the token (and learned position) embedding, the last the final norm and the LM
head. Sharding (ZeRO, FSDP, TP) splits tensors but does not change their count.
"""

from __future__ import annotations

from typing import Any

from simdist.spec.software_layers import profile_layers, runs_ddp_reducer
from simdist.spec.stages import stage_layer_ranges


def block_tensors(model: Any, layer: int) -> int:
    """Parameter tensors of one transformer block of the executor's model."""
    bias = 2 if model.bias else 1
    norms = 2 * (1 if model.norm == "rmsnorm" else 2)
    attention = 4 * bias
    if model.num_experts > 1 and layer >= model.first_dense_layers:
        mlp = bias + 2 * bias + (3 if model.mlp == "swiglu" else 2) * bias * model.num_shared_experts
    else:
        mlp = (3 if model.mlp == "swiglu" else 2) * bias
    return norms + attention + mlp


def stage_tensors(model: Any, plan: Any, stage: int) -> int:
    """Parameter tensors one rank of pipeline ``stage`` holds (every chunk of it)."""
    chunks = stage_layer_ranges(model.num_layers, plan.pp, plan.virtual_pipeline_stages)[stage]
    n = sum(block_tensors(model, i) for r in chunks for i in r)
    if stage == 0:
        n += 2 if model.position_embedding == "learned" else 1
    if stage == plan.pp - 1:
        n += (1 if model.norm == "rmsnorm" else 2) + (0 if model.tie_embeddings and plan.pp == 1 else 1)
    return n


def per_tensor_optimizer_time(sc: Any, profile: Any, stage: int) -> float | None:
    """Seconds of the optimizer step spent per tensor on one rank of ``stage``, or None when the
    profile has no such term (a GPU, or a profile fitted before version 3)."""
    if profile is None or profile.optimizer_tensor_s is None:
        return None
    per = profile.optimizer_tensor_s + layer_tensor_s(profile, optimizer_layers(sc.plan))
    return stage_tensors(sc.model, sc.plan, stage) * max(0.0, per)  # a layer's term may be negative


# The layers whose per-tensor term is DTensor's dispatch on the parameters: TP's DTensors and
# FSDP2's sharded ones. A parameter that both shard (FSDP2 over TP, on a 2-D mesh) is still one
# DTensor, each of the optimizer's ops on it dispatched once: it pays the dearer of their terms,
# not their sum. Summed, tiny-3d's optimizer (TP 2 under FSDP2, about 20 tensors a rank) was priced
# 5.0 ms a step against 2.5 ms measured (2026-12-07, q65; the dearer alone: 3.2 ms).
DTENSOR_PARAM_LAYERS = ("tp", "zero2", "zero3")


def layer_tensor_s(profile: Any, layers: tuple[str, ...]) -> float:
    """The software layers' extra optimizer seconds per parameter tensor (``optimizer_layer_tensor_s``):
    the dearest of :data:`DTENSOR_PARAM_LAYERS` among them plus the others' sum."""
    terms = profile.optimizer_layer_tensor_s
    dtensor = [terms.get(k, 0.0) for k in layers if k in DTENSOR_PARAM_LAYERS]
    return max(dtensor, default=0.0) + sum(terms.get(k, 0.0) for k in layers if k not in DTENSOR_PARAM_LAYERS)


def optimizer_layers(plan: Any) -> tuple[str, ...]:
    """The software layers whose per-tensor terms the optimizer step pays: the plan's, less TP's
    where DDP hands the optimizer plain local shards (module docstring; the executor's DDP:
    simdist.spec.software_layers.runs_ddp_reducer)."""
    layers = profile_layers(plan)
    return tuple(k for k in layers if k != "tp") if runs_ddp_reducer(plan) else layers


def ps_worker_time(sc: Any, profile: Any, stage: int) -> float:
    """A parameter-server worker's own step on a CPU profile: no optimizer runs there, but the
    executor's client (executor.ps.PSClient.step) gathers the gradients into one message and
    copies the pulled values back, tensor by tensor: the plan's layers' per-tensor terms
    (``optimizer_layer_tensor_s`` of "ps", and "async"), without the optimizer's own. 0 on
    profiles without the per-tensor term."""
    if profile is None or profile.optimizer_tensor_s is None:
        return 0.0
    per = sum(profile.optimizer_layer_tensor_s.get(k, 0.0) for k in profile_layers(sc.plan))
    return stage_tensors(sc.model, sc.plan, stage) * max(0.0, per)
