"""How each training framework lays out memory, picked by ``plan.framework``.

The same plan holds different bytes in different frameworks. Unset (``framework`` absent) keeps
simdist's own accounting: the ZeRO paper's model states and Korthikanti et al.'s activations,
which is also Megatron-LM's (NeMo runs Megatron-Core) and DeepSpeed's apart from DeepSpeed's
buffers. ``pytorch`` and ``torchtitan`` (FSDP2, DDP, torch.distributed.pipelining, torchao):

- FSDP2 mixed precision keeps the sharded parameters in fp32 (they are the optimizer's master
  weights), all-gathers them in the compute dtype and reduce-scatters gradients in
  ``reduce_dtype`` (torchtitan: float32), so the sharded gradients are fp32 too
  (torch.distributed.fsdp.MixedPrecisionPolicy; torchtitan parallelize_llama.apply_fsdp);
- under pipeline parallelism torchtitan keeps every layer unsharded after forward
  (``reshard_after_forward=False``, "to avoid per-microbatch all-gathers") and the pipeline stage
  turns gradient sync off until the last micro-batch (torch.distributed.pipelining.stage,
  ``set_requires_gradient_sync(False)``), so FSDP2 accumulates unsharded gradients in
  ``reduce_dtype`` (FSDPParam.to_accumulated_grad_if_needed);
- the loss materialises the logits: ``cross_entropy(pred.float())`` (torchtitan train.py) keeps a
  bf16 copy, an fp32 copy and the fp32 log-softmax; with tensor parallelism torchtitan shards it
  over the vocabulary (loss_parallel) and DTensor's log-softmax adds the shifted logits and their
  exponential;
- the last pipeline stage keeps every micro-batch's output for the step's return value
  (``output_chunks``), and every stage pre-allocates a receive buffer per micro-batch;
- torch.optim.AdamW defaults to the foreach implementation, whose step allocates one fp32 list
  the size of the parameters (``torch._foreach_sqrt`` of the second moments);
- DDP copies gradients into its buckets unless ``gradient_as_bucket_view=True`` ("the saved
  memory size will be equal to the total gradients size", DDP docs);
- torchtitan's ``selective`` recompute is the per-op policy (``selective_ac_option = 'op'``:
  save the outputs of every other matmul and of attention, recompute the rest);
- FP8 through torchao Float8Linear (tensorwise dynamic scaling by default) with FSDP2's float8
  all-gather (``enable_fsdp_float8_all_gather``).

DeepSpeed (its memory estimator, docs/code-docs/source/memory.rst): ZeRO-2 keeps full 16-bit
gradients plus an fp32 gradient partition (4 B + 16 B / N per parameter); ZeRO-3 holds
18 B / N per parameter.
"""

from __future__ import annotations

from functools import cache

from simdist.frozen import frozen
from simdist.spec.plan import ParallelPlan

TORCH_FRAMEWORKS = ("pytorch", "torchtitan")


@frozen(slots=True)
class MemoryConventions:
    family: str  # "simdist" | "megatron" | "torch" | "deepspeed"
    fsdp2_fp32_shards: bool  # ZeRO-3: fp32 sharded params and gradients (FSDP2 mixed precision)
    loss: str  # "fp32-logits" (Megatron/Korthikanti) | "torch"
    foreach_optimizer: bool  # the optimizer step allocates an fp32 copy of the parameters
    selective: str  # "attention-core" (Megatron) | "every-other-matmul" (torchtitan op SAC)
    fp8_stack: str  # "te" (Transformer Engine) | "torchao"
    pipeline_keeps_outputs: bool  # torch.distributed.pipelining: last stage keeps its outputs
    pp_fsdp_unsharded: bool  # PP + FSDP2: unsharded params kept, gradients accumulated unsharded
    ddp_bucket_copy: bool  # DDP buckets hold a second copy of the gradients
    deepspeed_buffers: bool


def conventions(plan: ParallelPlan) -> MemoryConventions:
    return _conventions(plan.framework, plan.mixed_precision)


@cache  # the memory model asks it many times per stage
def _conventions(fw: str | None, mixed_precision: bool) -> MemoryConventions:
    torch = fw in TORCH_FRAMEWORKS
    return MemoryConventions(
        family="torch" if torch else ("megatron" if fw in ("megatron", "nemo") else (fw or "simdist")),
        fsdp2_fp32_shards=torch and mixed_precision,
        loss="torch" if torch else "fp32-logits",
        foreach_optimizer=torch,
        selective="every-other-matmul" if fw == "torchtitan" else "attention-core",
        fp8_stack="torchao" if torch else "te",
        pipeline_keeps_outputs=torch,
        pp_fsdp_unsharded=torch,
        ddp_bucket_copy=torch,
        deepspeed_buffers=fw == "deepspeed",
    )


def fp8_recipe(plan: ParallelPlan) -> str | None:
    """The FP8 recipe in effect: the plan's, else the stack's default (Transformer Engine's
    DelayedScaling; torchao's dynamic tensorwise scaling). None outside FP8 training."""
    if plan.precision != "fp8":
        return None
    if plan.fp8_recipe is not None:
        return plan.fp8_recipe
    return "tensorwise" if conventions(plan).fp8_stack == "torchao" else "delayed"
