"""Working buffers a GPU holds at its peak beyond the model states and the saved activations:
gathered parameters, the loss's logit buffers, gradient buckets, pipeline receive buffers, the
compressor's error feedback, and the optimizer step's temporaries (a peak of its own, after
backward has freed the activations).

Sources
- ZeRO-3 / FSDP: the current and the prefetched unit's gathered parameters and one unit's
  unsharded gradients before their reduce-scatter (Rajbhandari et al. SC'20 sec 5.3; FSDP2
  reduce-scatters from an fp32 copy when ``reduce_dtype`` is fp32: torch FSDP2 foreach_reduce);
  DeepSpeed ZeRO-3: 4 B per parameter of the largest submodule (gathered 16-bit weights and
  their gradients; DeepSpeed's estimator, estimate_zero3_model_states_mem_needs).
- The loss: Megatron's vocabulary-parallel cross entropy keeps fp32 logits and writes their
  gradient (Korthikanti sec 4.3: 4·sbv/t each); PyTorch's ``cross_entropy(pred.float())`` has,
  in backward, the saved fp32 log-softmax, nll_loss's dense fp32 gradient and log_softmax's
  fp32 gradient (12 B per logit; 10 B in forward: bf16 logits, fp32 copy, log-softmax); with
  torchtitan's loss_parallel, DTensor's log-softmax also materialises the shifted logits and
  their exponential (14 B in forward, 16 B in backward).
- DeepSpeed ZeRO-1/2: the contiguous-gradients buffer of ``reduce_bucket_size`` elements, and
  the ``allgather_bucket_size`` buffer (default 5e8 elements) after the optimizer step.
- torch.distributed.pipelining: one receive buffer per micro-batch for the stage's input and one
  for its output's gradient, allocated once (``_prepare_forward_infra``/``_backward_infra``).
- PyTorch's foreach Adam: one fp32 list the size of the parameters during the step.
"""

from __future__ import annotations

from simdist.analytic.activations import logits_elements
from simdist.analytic.compression import error_feedback_bytes
from simdist.analytic.fp8_memory import gathered_weight_bytes
from simdist.analytic.memory_conventions import conventions
from simdist.analytic.overlap import bucket_bytes
from simdist.analytic.params import params_per_rank
from simdist.analytic.variant_memory import buffer_bytes, layer_state_params
from simdist.analytic.variants import plain
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

Parts = list[tuple[str, float]]  # (id, bytes); PART_NAMES says what each id holds
PART_NAMES = {
    "gathered_weights": "ZeRO-3/FSDP gathered weights (current and prefetched unit)",
    "unsharded_grads": "one unit's unsharded gradients before their reduce-scatter",
    "logit_buffers": "the loss's logit buffers (fp32 copies and gradients)",
    "pipeline_recv_buffers": "pipeline receive buffers (one per micro-batch)",
    "error_feedback": "gradient compression error feedback",
    "reduce_bucket": "DeepSpeed's contiguous reduce bucket",
    "optimizer_step_temporaries": "the optimizer step's fp32 temporaries (peak after backward)",
    "allgather_bucket": "DeepSpeed's parameter all-gather bucket (after the step)",
    "moe_cp_buffers": "token dispatcher buffers and context-parallel K/V blocks",
}
DEEPSPEED_ALLGATHER_BUCKET_ELEMENTS = 5e8  # zero_optimization.allgather_bucket_size default


def largest_matrix_params(m: ModelSpec, plan: ParallelPlan) -> float:
    """The largest single weight on one GPU: the embedding table or an MLP matrix."""
    return max(m.vocab_size * m.hidden_size, m.hidden_size * m.ffn_hidden_size) / plan.tp


def gather_buffer_parts(m: ModelSpec, plan: ParallelPlan) -> Parts:
    """ZeRO-3/FSDP buffers while a unit runs: gathered weights and unsharded gradients."""
    if not plan.shards_params:
        return []
    conv = conventions(plan)
    layer = layer_state_params(m, plan)  # the largest gather unit (an MoE layer's local experts)
    e = plan.element_bytes
    if conv.deepspeed_buffers:
        return [("gathered_weights", 4.0 * largest_matrix_params(m, plan))]
    if conv.fsdp2_fp32_shards:
        grads = layer * (e + 4.0)  # 16-bit unsharded gradients and the fp32 reduce-scatter input
        if plan.pp > 1 and conv.pp_fsdp_unsharded:  # weights stay gathered (states), gradients accumulate
            return [("unsharded_grads", layer * e)]
        return [("gathered_weights", 2 * layer * gathered_weight_bytes(plan)),
                ("unsharded_grads", grads)]
    grad_bytes = 4.0 if plan.fp32_grad_accumulation or plan.precision == "fp32" else 2.0
    return [("gathered_weights", 2 * layer * float(e)),
            ("unsharded_grads", layer * grad_bytes)]


def loss_parts(m: ModelSpec, plan: ParallelPlan, stage: int) -> Parts:
    """The last stage's logit buffers beyond the saved ones (activations.head_saved_tensors)."""
    if stage != plan.pp - 1:
        return []
    n = logits_elements(m, plan)
    if conventions(plan).loss == "torch":
        per_logit = 12.0 if plan.tp > 1 else 8.0
        return [("logit_buffers", per_logit * n)]
    return [("logit_buffers", 4.0 * n)]


def pipeline_buffer_parts(m: ModelSpec, plan: ParallelPlan, stage: int) -> Parts:
    if plan.pp == 1 or not conventions(plan).pipeline_keeps_outputs:
        return []
    act = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size * plan.element_bytes / plan.tp
    directions = (stage > 0) + (stage < plan.pp - 1)
    return [("pipeline_recv_buffers", plan.num_microbatches * directions * act)]


def bucket_parts(plan: ParallelPlan) -> Parts:
    conv = conventions(plan)
    if conv.deepspeed_buffers and plan.zero_stage in (1, 2) and plan.dp > 1:
        return [("reduce_bucket", bucket_bytes(plan))]  # DeepSpeed: reduce_bucket_size
    return []


def step_temporaries(m: ModelSpec, plan: ParallelPlan, stage: int) -> Parts:
    """Buffers that exist only during the optimizer step (the activations are freed by then)."""
    conv = conventions(plan)
    out: Parts = []
    if plan.offload.optimizer != "none" or plan.uses_parameter_servers:
        return out
    n = params_per_rank(m, plan, stage)
    if conv.foreach_optimizer and plan.optimizer in ("adam", "adamw"):
        shard = plan.dp_shard * plan.cp if plan.shards_optimizer else 1
        out.append(("optimizer_step_temporaries", 4.0 * n / shard))
    if conv.deepspeed_buffers and plan.zero_stage in (1, 2) and plan.dp > 1:
        out.append(("allgather_bucket", min(n, DEEPSPEED_ALLGATHER_BUCKET_ELEMENTS) * plan.element_bytes))
    return out


def transient_parts(m: ModelSpec, plan: ParallelPlan, stage: int, activations: float) -> tuple[Parts, bool]:
    """Named buffers held at the stage's peak (their sum is the transient part of other_gib), and
    whether that peak is the optimizer step's: its temporaries count only where the step, with the
    activations and backward's buffers gone, would peak higher than backward."""
    persistent: Parts = []
    if plan.dp > 1 or plan.uses_parameter_servers:
        ef = error_feedback_bytes(m, plan, stage)
        if ef:
            persistent.append(("error_feedback", ef))
    persistent += pipeline_buffer_parts(m, plan, stage)
    if not plain(m, plan):  # dispatcher buffers, context parallelism's K/V blocks (v1.2)
        persistent.append(("moe_cp_buffers", buffer_bytes(m, plan)))
    main = gather_buffer_parts(m, plan) + loss_parts(m, plan, stage) + bucket_parts(plan)
    step = step_temporaries(m, plan, stage)
    main_bytes, step_bytes = sum(n for _, n in main), sum(n for _, n in step)
    if step_bytes > activations + main_bytes:
        return persistent + step, True
    return persistent + main, False


def transient_bytes(m: ModelSpec, plan: ParallelPlan, stage: int, activations: float = 0.0) -> float:
    parts, step_peak = transient_parts(m, plan, stage, activations)
    return sum(n for _, n in parts) - (activations if step_peak else 0.0)
