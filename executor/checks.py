"""Plans the executor refuses before it launches anything (no torch import here).

The scenario loader already rejects what no system could run (degrees that do not multiply to
the cluster's GPUs, tp not dividing the heads, more pipeline chunks than layers, a batch that
does not split into micro-batches, ...). This module adds what this executor cannot run, or
cannot run on ``--nproc`` processes, each problem naming its field in the contract's style.
"""

from __future__ import annotations

from typing import Any

from executor.layouts import v12_problems
from simdist.errors import Problem
from simdist.spec.frameworks import framework_of, grad_accumulation_fusion
from simdist.spec.scenario import Scenario

SUPPORTED_OPTIMIZERS = ("adam", "adamw", "sgd", "lamb", "lars")  # executor.optim
SUPPORTED_PRECISIONS = ("fp32", "bf16")
SUPPORTED_COMPRESSION = ("fp16", "bf16", "topk", "powersgd")  # executor.compression


def split_backward_pipeline(pp: int, virtual_pipeline_stages: int, schedule: str) -> bool:
    """Several chunks per rank, or zero-bubble's split backward (see executor.parallelize)."""
    return pp > 1 and (virtual_pipeline_stages > 1 or schedule == "zero-bubble")


def run_problems(scenario: Scenario, nproc: int) -> list[Problem]:
    """Every reason the executor cannot run ``scenario`` on ``nproc`` local processes."""
    m, plan = scenario.model, scenario.plan
    out: list[Problem] = []

    def add(f: str, msg: str) -> None:
        out.append(Problem(f, msg))

    if nproc < 1:
        add("--nproc", f"must be a positive whole number, got {nproc}")
    elif plan.world_size != nproc:
        add("--nproc", f"{nproc} processes, but the plan's degrees tp*pp*cp*dp = "
            f"{plan.tp}*{plan.pp}*{plan.cp}*{plan.dp} = {plan.world_size}")
    if scenario.world_size != nproc and nproc >= 1:
        add("cluster.gpus_per_node", f"the cluster has {scenario.world_size} GPUs but --nproc is {nproc} "
            f"(use cluster: {{preset: local, num_nodes: 1, gpus_per_node: {nproc}}})")
    # --- model features the executor's model does not build
    if m.position_embedding == "alibi":
        add("model.position_embedding", "alibi is not implemented by the executor (learned, rope)")
    if m.position_embedding == "rope" and m.head_dim % 2:
        add("model.hidden_size", f"RoPE needs an even head dimension, got {m.head_dim}")
    if getattr(m, "dropout", False):
        add("model.dropout", "the executor trains without dropout so that every plan computes the "
            "same losses; set dropout: false")
    if m.tie_embeddings and plan.pp > 1:
        add("model.tie_embeddings", "a tied LM head on another pipeline stage than the embedding "
            "needs a synchronised copy, which the executor does not implement; use pp 1 or untie")
    if m.tie_embeddings and plan.tp > 1 and plan.dp > 1 and not plan.shards_gradients:
        add("model.tie_embeddings", "a tied LM head under tensor parallelism does not run with DDP "
            "(torch's DDP x TP bridge handles each shared parameter under one name only); use "
            "zero_stage 2 or 3, or untie")
    # --- plan features
    out.extend(v12_problems(scenario))  # experts, context parallelism and the other 1.2 fields
    if plan.precision not in SUPPORTED_PRECISIONS:
        add("plan.precision", f"{plan.precision} is not supported by the executor "
            f"({', '.join(SUPPORTED_PRECISIONS)}; fp16 needs loss scaling, fp8 Transformer Engine)")
    if plan.optimizer not in SUPPORTED_OPTIMIZERS:
        add("plan.optimizer", f"{plan.optimizer} is not supported by the executor "
            f"({', '.join(SUPPORTED_OPTIMIZERS)})")
    if plan.offload.any:
        add("plan.offload", "offloading is not implemented by the executor")
    if plan.uses_parameter_servers:
        out.extend(_parameter_server_problems(scenario))
    if plan.grad_compression.enabled:
        method = plan.grad_compression.method
        if method not in SUPPORTED_COMPRESSION:
            add("plan.grad_compression.method", f"{method} is not implemented by the executor "
                f"({', '.join(SUPPORTED_COMPRESSION)})")
        if not plan.uses_parameter_servers and plan.dp > 1 and (
                plan.zero_stage != 0 or split_backward_pipeline(plan.pp, plan.virtual_pipeline_stages, plan.schedule)):
            add("plan.grad_compression", "the executor compresses with DDP communication hooks: it needs "
                "zero_stage 0 and a schedule with one backward per step (not interleaved or zero-bubble)")
    if plan.zero_quantized_weights:
        add("plan.zero_quantized_weights", "quantized weight gathers are not implemented by the executor")
    if plan.pipeline_layout is not None:
        add("plan.pipeline_layout", "uneven pipeline layouts are not implemented by the executor (it splits the "
            "layers evenly); leave it unset")
    if plan.zero_hpz_partition_size:
        add("plan.zero_hpz_partition_size", "ZeRO++ hierarchical partitioning (hpZ) is not implemented by the executor")
    if plan.tp_comm_overlap and plan.tp > 1:
        add("plan.tp_comm_overlap", "overlapping TP collectives with GEMMs is not implemented by the executor "
            "(PyTorch's async tensor parallel needs CUDA symmetric memory and torch.compile); set it to false")
    if plan.tp > 1 and m.vocab_size % plan.tp:
        add("plan.tp", f"{plan.tp} does not divide model.vocab_size ({m.vocab_size}), which the "
            "vocabulary-parallel embedding and LM head split (pad the vocabulary as Megatron-LM does)")
    if plan.sequence_parallel and plan.tp > 1 and m.seq_length % plan.tp:
        add("plan.sequence_parallel", f"tp ({plan.tp}) does not divide model.seq_length ({m.seq_length})")
    if plan.zero_stage == 1 and plan.dp > 1 and split_backward_pipeline(
            plan.pp, plan.virtual_pipeline_stages, plan.schedule):
        add("plan.zero_stage", f"zero_stage 1 (DDP + ZeroRedundancyOptimizer) does not run under the "
            f"{plan.schedule} schedule with {plan.virtual_pipeline_stages} chunk(s) per rank, because "
            "DDP's reducer does not support its backward; use zero_stage 2 (FSDP2) there")
    if plan.pp > 1:
        n = plan.num_microbatches
        if plan.schedule == "1f1b" and n < plan.pp:
            add("plan.global_batch_size", f"1f1b needs at least pp ({plan.pp}) micro-batches per "
                f"pipeline, got {n}")
        if plan.schedule in ("interleaved-1f1b", "zero-bubble"):
            rounds = max(1, n // plan.pp)
            if n % rounds:
                add("plan.global_batch_size", f"{plan.schedule} needs the micro-batches per pipeline "
                    f"({n}) to be a multiple of {rounds} (rounds of pp micro-batches)")
    return out


def _parameter_server_problems(scenario: Scenario) -> list[Problem]:
    """What the executor's parameter server (executor.ps) does not run."""
    plan, cluster = scenario.plan, scenario.cluster
    out: list[Problem] = []
    if plan.tp > 1 or plan.pp > 1:
        out.append(Problem("plan.gradient_sync", f"{plan.gradient_sync} runs data parallelism only in the "
                           "executor (tp 1, pp 1): each worker holds the whole model"))
    if plan.grad_compression.enabled:
        out.append(Problem("plan.grad_compression", "the executor's parameter server sends uncompressed "
                           "fp32 gradients and parameters; use method none"))
    servers = plan.parameter_servers or cluster.num_nodes
    if servers % cluster.num_nodes:
        out.append(Problem("plan.parameter_servers", f"{servers} servers do not spread evenly over "
                           f"{cluster.num_nodes} nodes (torchrun starts as many processes on every node)"))
    if (plan.async_parameter_servers and servers > 1
            and plan.optimizer in ("lamb", "lars")):
        out.append(Problem("plan.optimizer", f"{plan.optimizer} needs whole-tensor norms, which "
                           f"{servers} asynchronous servers (each updating on its own) cannot agree on; "
                           "use one server or another optimizer"))
    return out


# --- fields run another way (executor.fields) ---------------------------------------------


def _data_parallel(plan: Any) -> str:
    if plan.uses_parameter_servers or plan.dp == 1:
        return "none"
    if plan.shards_gradients:
        return "fsdp"
    if plan.zero_stage == 0 and split_backward_pipeline(plan.pp, plan.virtual_pipeline_stages, plan.schedule):
        return "replicate"
    return "ddp"


def as_run(scenario: Any, device: str = "cpu") -> dict[str, Any]:
    """Plan fields the executor runs another way than the scenario says: key -> value run."""
    plan = scenario.plan
    out: dict[str, Any] = {}
    if plan.precision == "bf16" and not plan.fp32_grad_accumulation:
        out["plan.fp32_grad_accumulation"] = True
    dp = _data_parallel(plan)
    if not plan.overlap_grad_reduce and (dp in ("fsdp", "replicate") or (dp == "ddp" and plan.grad_compression.enabled)):
        out["plan.overlap_grad_reduce"] = True
    if plan.ep_comm_overlap and plan.ep > 1:
        out["plan.ep_comm_overlap"] = False
    if _fused(plan) and _has_composite_elementwise(scenario.model):
        out["plan.fused_elementwise"] = False
    if plan.num_microbatches > 1 and grad_accumulation_fusion(plan):
        out["plan.grad_accumulation_fusion"] = False
    return out


def _fused(plan: Any) -> bool:
    """The elementwise fusion the plan asks for (its framework's default when unset)."""
    return plan.fused_elementwise if plan.fused_elementwise is not None else framework_of(plan.framework).fused_elementwise


def _has_composite_elementwise(model: Any) -> bool:
    """RMSNorm, RoPE or SwiGLU: ops the executor's eager PyTorch runs as several kernels where a
    fused kernel runs one (simdist.analytic.eager); LayerNorm and GELU are one kernel either way."""
    return model.norm == "rmsnorm" or model.mlp == "swiglu" or model.position_embedding == "rope"


_WHY = {
    "plan.fp32_grad_accumulation": "bf16 autocast keeps fp32 parameters, so gradients accumulate in fp32",
    "plan.overlap_grad_reduce": "FSDP2 (and DDP with a compression hook) reduces each unit's gradients as its "
                                "backward ends",
    "plan.ep_comm_overlap": "its expert all-to-all dispatch is synchronous, nothing overlaps it",
    "plan.fused_elementwise": "it runs eager PyTorch, RMSNorm, RoPE and SwiGLU as several kernels each (no "
                              "torch.compile or fused kernels)",
    "plan.grad_accumulation_fusion": "autograd adds each later micro-batch's gradients into .grad, one add per "
                                     "parameter tensor",
}


def field_warnings(scenario: Any, device: str = "cpu") -> list[Problem]:
    """One line per plan field the executor runs another way (see :func:`as_run`)."""
    out = []
    for key, value in as_run(scenario, device).items():
        out.append(Problem(key, f"runs as {str(value).lower()} in the executor ({_WHY[key]}); the measurement "
                           "records it, and simdist compare predicts what ran"))
    return out
