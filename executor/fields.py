"""Every plan field, and what the executor does with it (no torch here).

A predicted-versus-measured comparison means something only if the executor ran what the
scenario says. So every field of the plan (``simdist.spec.plan.ParallelPlan``, nested sections
as dotted keys) is listed here exactly once:

- :data:`EXECUTOR_READS`: the executor runs it (how, in a few words), or refuses the values it
  cannot run before anything starts (:mod:`executor.checks`, naming the field);
- :data:`SIMULATOR_ONLY`: fields that change nothing a run does (they fill defaults when the
  scenario is read, or only matter together with a value the executor refuses).

Where PyTorch runs a field another way than the scenario says, :func:`executor.checks.as_run`
gives the value that ran, :func:`executor.checks.field_warnings` says so before launch, and the
measurement keeps it (``as_run``), so that ``simdist compare`` predicts the plan that actually ran. The test
``tests/executor/test_executor_fields.py`` checks that this list covers every field and that
each field in EXECUTOR_READS is read by the executor's code.
"""

from __future__ import annotations

from simdist.spec.fields import spec_fields
from simdist.spec.plan import ParallelPlan

EXECUTOR_READS: dict[str, str] = {
    "plan.tp": "DTensor tensor parallel (Megatron's column/row layout)",
    "plan.pp": "torch.distributed.pipelining stages",
    "plan.dp": "data-parallel replicas (the dp mesh dimension)",
    "plan.cp": "context parallelism over its own mesh dimension (executor.context), with DP only",
    "plan.virtual_pipeline_stages": "chunks per pipeline rank (interleaved stages)",
    "plan.schedule": "the pipelining schedule class; dualpipe and dualpipev refused",
    "plan.zero_stage": "DDP, DDP + ZeroRedundancyOptimizer, FSDP2 without / with resharding",
    "plan.sequence_parallel": "SequenceParallel norms, sequence-sharded activations",
    "plan.recompute": "torch.utils.checkpoint of the layer or of the attention core",
    "plan.micro_batch_size": "the micro-batch split",
    "plan.global_batch_size": "sequences per step",
    "plan.precision": "fp32, or bf16 autocast; fp16 and fp8 refused",
    "plan.optimizer": "torch's Adam, AdamW, SGD; LAMB and LARS in executor.optim; adafactor refused",
    "plan.fp32_grad_accumulation": "bf16 autocast keeps fp32 parameters and gradients: always fp32 (as run)",
    "plan.flash_attention": "SDPA backend: fused kernels, or the math backend (executor.knobs)",
    "plan.overlap_grad_reduce": "DDP buckets during backward, or all after it (executor.knobs)",
    "plan.overlap_param_gather": "FSDP2 asynchronous all-gathers with explicit prefetch, or none (executor.knobs)",
    "plan.tp_comm_overlap": "refused when true (PyTorch's async TP needs CUDA symmetric memory and torch.compile)",
    "plan.zero3_fetch": "FSDP2 units per block (layer) or per submodule (module) (executor.knobs)",
    "plan.dp_shard": "HSDP: FSDP2 on the (dp_replicate, dp_shard) mesh; ZeRO-1 over dp_shard",
    "plan.zero_quantized_weights": "refused when true",
    "plan.offload.optimizer": "refused unless none",
    "plan.offload.params": "refused unless none",
    "plan.gradient_sync": "collectives, or the parameter server on point-to-point gloo",
    "plan.parameter_servers": "server processes beside the workers",
    "plan.grad_compression.method": "DDP communication hooks (fp16, bf16, topk, powersgd); int8 refused",
    "plan.grad_compression.ratio": "top-k fraction",
    "plan.grad_compression.rank": "PowerSGD rank",
    "plan.grad_compression.error_feedback": "residual carried to the next step",
    "plan.ddp_bucket_size": "DDP's bucket_cap_mb",
    "plan.ep": "expert parallelism over the data-parallel ranks, all-to-all dispatch (executor.moe)",
    "plan.etp": "refused above 1 (executor.layouts)",
    "plan.moe_dispatcher": "alltoall runs (executor.moe); the others are refused (executor.layouts)",
    "plan.cp_method": "ring, all-gather or Ulysses attention (executor.context)",
    "plan.ep_comm_overlap": "runs as false: the executor's all-to-all dispatch is synchronous (executor.checks.as_run)",
    "plan.zero_hpz_partition_size": "refused when set (ZeRO++ hpZ)",
    "plan.fused_elementwise": "runs as false with RMSNorm, RoPE or SwiGLU: eager PyTorch, no torch.compile "
                              "(executor.checks.as_run)",
    "plan.pipeline_layout": "refused when set (the executor splits the layers evenly)",
    "plan.grad_accumulation_fusion": "runs as false with several micro-batches: autograd's add into .grad "
                                     "(executor.checks.as_run)",
    "plan.recompute_early_stop": "torch.utils.checkpoint's early stop on or off under full recompute "
                                 "(set_checkpoint_early_stop; executor.model.Block)",
}
SIMULATOR_ONLY: dict[str, str] = {
    "plan.fp8_recipe": "only with precision fp8, which the executor refuses",
    "plan.framework": "fills unset fields with a framework's defaults when the scenario is read; nothing left to run",
    "plan.attention_kernel": "names a GPU attention kernel class; on CPU SDPA has one fused kernel (flash_attention)",
    "plan.moe_expert_bias": "how a GPU framework adds the experts' output bias (kernels and HBM passes, not "
                            "values); the executor adds its stacked expert biases with one op either way",
}
ATTRIBUTES = {"plan.ddp_bucket_size": "ddp_bucket_size_bytes"}  # YAML key -> attribute, where they differ


def plan_field_keys(cls: type = ParallelPlan, prefix: str = "plan.") -> list[str]:
    """Every field of the plan as a dotted scenario key (``plan.grad_compression.method``)."""
    out: list[str] = []
    for fs in spec_fields(cls):
        if not fs.key:
            continue
        if fs.kind == "spec" and fs.nested is not None:
            out += plan_field_keys(fs.nested, f"{prefix}{fs.key}.")
        else:
            out.append(prefix + fs.key)
    return out


def attribute(key: str) -> str:
    """The Python attribute a dotted plan key is read by (its last part, unless renamed)."""
    return ATTRIBUTES.get(key, key.rsplit(".", 1)[-1])
