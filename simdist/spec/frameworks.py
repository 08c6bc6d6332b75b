"""What ``plan.framework`` means: the defaults a training framework gives the plan fields a
scenario leaves unset, and the framework's own rules that are not plan fields (the DP gradient
bucket, what ``recompute: selective`` recomputes, the FP8 recipe it uses by default).

Each default is the framework's documented or shipped value, with its source here; a field the
scenario writes always wins. The rules themselves are applied by the analytic layer
(:mod:`simdist.analytic.overlap` for buckets, :mod:`simdist.analytic.ops` for recompute and FP8);
this module only says which rule a plan gets, so the executor and the simulator read one table.

- ``megatron``: Megatron-LM / Megatron-Core command-line defaults (megatron/training/arguments.py,
  megatron/core/distributed/distributed_data_parallel_config.py): no distributed optimizer and no
  overlap unless asked (``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
  ``--overlap-param-gather``); with bf16 the gradients accumulate and reduce in fp32
  (``accumulate_allreduce_grads_in_fp32`` is forced on for bf16); DDP buckets of
  max(40M, 1M x dp) parameters (DistributedDataParallelConfig.bucket_size: "larger DP sizes need
  larger buckets to ensure collectives do not become latency-bound"); selective recompute is the
  attention core (Korthikanti et al. 2022); attention runs Transformer Engine's cuDNN fused kernel
  (``attention_kernel`` cudnn; on Hopper a FlashAttention-3-class kernel: GpuSpec.
  fused_attention_speedup), the other frameworks FlashAttention-2 (flash2); under the
  interleaved schedule the sender does not wait for its pipeline sends (``--overlap-p2p-communication``,
  on by default for interleaving, ``overlap_p2p_comm``), though the receiver still waits for
  each one (simdist.analytic.steptime.stage_time); the loss is the unfused vocabulary-parallel
  cross-entropy (``cross_entropy_loss_fusion`` off by default); the weight-gradient GEMM adds
  into ``main_grad`` (``gradient_accumulation_fusion``, on by default); the experts' output bias of a
  model with biases (GPT-OSS) is added expert by expert in eager PyTorch (``expert_bias``
  per_expert: TEGroupedMLP._apply_bias, simdist.analytic.moe.expert_bias_ops).
- ``nemo``: NeMo 2 / Megatron-Bridge performance recipes (the configurations of NVIDIA's
  published performance summaries): Megatron-Core with the distributed optimizer, gradient
  reduce and parameter gather overlapped, fp32 gradient reduction, sequence parallelism and TP
  communication overlap whenever tp > 1, Transformer Engine fused attention.
- ``pytorch``: PyTorch DDP / FSDP defaults: 25 MiB DDP buckets (torch.nn.parallel.
  DistributedDataParallel bucket_cap_mb=25), FSDP reduces and gathers per wrapped module (one
  transformer block), forward and backward prefetch on, SDPA's FlashAttention-2 kernel; torchao float8
  (tensorwise dynamic scaling) when FP8; the loss ``F.cross_entropy`` on fp32 logits (torchtitan and
  DeepSpeed's Hugging Face models too); autograd adds each later micro-batch's gradients into
  ``.grad``, a pass of their own (torchtitan and DeepSpeed too: simdist.analytic.grad_accumulation).
- ``torchtitan``: FSDP2 over the data-parallel ranks (data_parallel_shard_degree -1), sequence
  parallelism with every TP plan, per-op selective activation checkpointing (its Llama 3
  configs' ``selective_ac_option = 'op'``: saves every matmul output but every second one, and
  the attention outputs), torchao float8 with tensorwise dynamic scaling (torchtitan
  @ba24697, torchtitan/float8.py, parallelize_llama.py); with pipeline parallelism FSDP2 neither
  reshards after forward nor reduces before the last micro-batch (torch.distributed.pipelining
  stage.backward_maybe_with_nosync); FSDP2's copies around each collective and no gather for the
  forward that full recompute reruns (simdist.analytic.fsdp2); elementwise ops eager (its train configs' ``compile = false``:
  simdist.analytic.eager); context parallelism through PyTorch's ``context_parallel`` over SDPA,
  which its Llama calls after repeating K/V to every query head (simdist.analytic.context).
- ``deepspeed``: DeepSpeed ZeRO defaults: ``reduce_bucket_size`` 5e8 elements, each submodule's
  parameters fetched on their own under ZeRO-3, ``overlap_comm`` on for ZeRO-3 only.

Full recompute (``plan.recompute_early_stop`` when unset): ``pytorch`` and ``torchtitan`` checkpoint
each block with PyTorch's non-reentrant ``torch.utils.checkpoint`` (FSDP's ``checkpoint_wrapper``
defaults to ``CheckpointImpl.NO_REENTRANT``; torchtitan's full AC wraps each block with it), which
"stops recomputation as soon as all needed intermediate activations have been recomputed", on by
default (torch.utils.checkpoint docs, ``set_checkpoint_early_stop``; PyTorch 2.1+). Megatron-LM,
NeMo and DeepSpeed run their own checkpoint function, which re-runs the whole layer (Megatron's
``CheckpointFunction``, DeepSpeed's ``activation_checkpointing.checkpoint``): no early stop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simdist.frozen import frozen

MEGATRON_BUCKET_MIN_PARAMS = 40_000_000  # Megatron-Core: max(40M, 1M x dp) parameters per bucket
MEGATRON_BUCKET_PARAMS_PER_DP = 1_000_000
DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel bucket_cap_mb=25
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed zero_optimization.reduce_bucket_size


@frozen
class Framework:
    """One framework's rules beyond plan fields."""

    name: str
    bucket_rule: str  # "megatron" | "ddp" | "deepspeed" (FSDP/ZeRO-3 reduce per wrapped module)
    selective_recompute: str  # "attention-core" | "op-level"
    fp8_recipe: str  # "te-default" (Transformer Engine's, by GPU) or a recipe name
    fsdp_pipeline_no_sync: bool = False  # FSDP under PP: gather once, reduce at the last micro-batch
    # ZeRO-3 as FSDP2 (fully_shard): per-parameter shards copied to and from flat buffers around each
    # collective (simdist.analytic.fsdp2), and no gather again for the forward that recompute reruns
    fsdp2: bool = False
    attention_kernel: str = "flash2"  # plan.attention_kernel when unset: "flash2" | "cudnn" | "triton"
    fused_elementwise: bool = True  # plan.fused_elementwise when unset (torchtitan: compile off by default)
    overlap_p2p: bool = False  # interleaved schedule: the sender does not wait for its sends (isend/irecv)
    # context parallelism through PyTorch's context_parallel over SDPA, which the model calls
    # after repeating K/V to every query head (simdist.analytic.context.torch_sdpa_core_ops)
    sdpa_context_parallel: bool = False
    # the loss kernel(s) over the logits (simdist.analytic.ops.CROSS_ENTROPY_BYTES): "fused",
    # "megatron" (Megatron-Core's unfused vocabulary-parallel one) or "torch" (F.cross_entropy on fp32)
    cross_entropy: str = "fused"
    # plan.recompute_early_stop when unset: full recompute through PyTorch's non-reentrant checkpoint,
    # which stops once backward's saved tensors are back (simdist.analytic.ops.recompute_ops)
    recompute_early_stop: bool = False
    # full passes over the rank's whole gradient buffer each step besides the reduction, when the
    # framework keeps one contiguous buffer (ZeRO 0/1): simdist.analytic.cost.grad_buffer_pass_bytes
    grad_buffer_passes: int = 0
    # plan.moe_expert_bias when unset: "per_expert" where the experts' fc2 bias is added expert by
    # expert in eager PyTorch (Megatron-Core's TEGroupedMLP: simdist.analytic.moe.expert_bias_ops)
    expert_bias: str = "fused"
    # plan.grad_accumulation_fusion when unset: the weight-gradient GEMM adds into the kept gradient
    # (Megatron's gradient_accumulation_fusion), or autograd adds each later micro-batch's gradients
    # in a pass of their own (simdist.analytic.grad_accumulation)
    grad_accumulation_fusion: bool = True
    description: str = ""


FRAMEWORKS: dict[str, Framework] = {
    "megatron": Framework("megatron", "megatron", "attention-core", "te-default", attention_kernel="cudnn", overlap_p2p=True,
                          cross_entropy="megatron", grad_buffer_passes=2, expert_bias="per_expert",
                          description="Megatron-LM / Megatron-Core argument defaults"),
    "nemo": Framework("nemo", "megatron", "attention-core", "te-default", attention_kernel="cudnn", overlap_p2p=True,
                      expert_bias="per_expert",
                      description="NeMo 2 / Megatron-Bridge performance recipes"),
    "pytorch": Framework("pytorch", "ddp", "attention-core", "tensorwise", cross_entropy="torch",
                         recompute_early_stop=True, grad_accumulation_fusion=False,
                         description="PyTorch DDP / FSDP defaults"),
    "torchtitan": Framework("torchtitan", "ddp", "op-level", "tensorwise", fsdp_pipeline_no_sync=True, fsdp2=True,
                            fused_elementwise=False, sdpa_context_parallel=True, cross_entropy="torch",
                            recompute_early_stop=True, grad_accumulation_fusion=False,
                            description="torchtitan (FSDP2, per-op selective AC, torchao float8)"),
    "deepspeed": Framework("deepspeed", "deepspeed", "attention-core", "te-default", cross_entropy="torch",
                           grad_accumulation_fusion=False,
                           description="DeepSpeed ZeRO defaults"),
}
NO_FRAMEWORK = Framework("none", "ddp", "attention-core", "te-default", description="simdist's own defaults")


def framework_of(name: str | None) -> Framework:
    return FRAMEWORKS.get(name or "", NO_FRAMEWORK)


def grad_accumulation_fusion(plan: Any) -> bool:
    """Whether the weight-gradient GEMM adds into the kept gradient (no add per micro-batch):
    ``plan.grad_accumulation_fusion`` when set, else the framework's."""
    if plan.grad_accumulation_fusion is not None:
        return plan.grad_accumulation_fusion
    return framework_of(plan.framework).grad_accumulation_fusion


def attention_kernel(plan: Any) -> str:
    """The fused attention kernel class a plan runs: ``plan.attention_kernel`` when set, else its
    framework's (Transformer Engine's cuDNN fused attention for megatron and nemo, FlashAttention-2
    through SDPA or flash-attn otherwise)."""
    return plan.attention_kernel or framework_of(plan.framework).attention_kernel


def expert_bias(plan: Any) -> str:
    """How a plan adds its experts' output bias: ``plan.moe_expert_bias`` when set, else its
    framework's (expert by expert under megatron and nemo: Megatron-Core's TEGroupedMLP)."""
    return plan.moe_expert_bias or framework_of(plan.framework).expert_bias


def recompute_early_stop(plan: Any) -> bool:
    """Whether full recompute stops early (PyTorch's non-reentrant checkpoint): ``plan.
    recompute_early_stop`` when set, else the framework's."""
    if plan.recompute_early_stop is not None:
        return bool(plan.recompute_early_stop)
    return framework_of(plan.framework).recompute_early_stop


def plan_defaults(framework: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Values of the plan fields ``given`` (the scenario's plan mapping) leaves unset, as
    ``framework`` sets them. Keys are YAML keys; conditions read the given values with the
    contract's defaults."""
    tp = given.get("tp", 1)
    tp_gt1 = isinstance(tp, int) and not isinstance(tp, bool) and tp > 1
    zero = given.get("zero_stage", 0)
    precision = given.get("precision", "bf16")
    out: dict[str, Any] = {}
    if framework == "megatron":
        out = {"flash_attention": True, "overlap_grad_reduce": False, "overlap_param_gather": False,
               "fp32_grad_accumulation": precision in ("bf16", "fp8")}
    elif framework == "nemo":
        out = {"zero_stage": 1, "flash_attention": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
               "fp32_grad_accumulation": True, "sequence_parallel": tp_gt1, "tp_comm_overlap": tp_gt1}
    elif framework == "pytorch":
        out = {"flash_attention": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
               "zero3_fetch": "layer"}
    elif framework == "torchtitan":
        out = {"zero_stage": 3, "flash_attention": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
               "sequence_parallel": tp_gt1, "zero3_fetch": "layer"}
    elif framework == "deepspeed":
        out = {"zero3_fetch": "module", "overlap_grad_reduce": zero == 3, "overlap_param_gather": zero == 3}
    return {k: v for k, v in out.items() if k not in given}
