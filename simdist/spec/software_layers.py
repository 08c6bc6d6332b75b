"""The software layers of the executor's PyTorch a plan runs through, each with its own fitted
terms in a calibration profile (:mod:`simdist.spec.profile`), and where each layer's waits are paid."""

from __future__ import annotations

from typing import Any


def profile_layers(plan: Any) -> tuple[str, ...]:
    """The software layers of the executor's PyTorch that a plan runs through, each with its
    own fitted terms in a profile (``framework_overheads_s`` per compute op and
    ``sync_wait_fractions`` of compute): "tp" (DTensor tensor parallelism), "zero1"
    (ZeroRedundancyOptimizer), "zero2" (FSDP2 keeping parameters gathered, and FSDP2's replicate, which the executor
    runs for plain data parallelism under several chunks per rank or a split backward), "zero3" (FSDP2
    resharding them), "hsdp" (FSDP2 on a 2-D mesh), "pipeline" (torch.distributed.pipelining),
    "multichunk" (several chunks per rank), "split_backward" (zero-bubble's backward split in
    an input and a weight pass: torch.distributed.pipelining's own autograd traversals),
    "compression" (DDP communication hooks), "ps" (the parameter server; "async" besides
    for the asynchronous one: executor.ps's workers and server threads), "cp"
    (context parallelism: the ring's point-to-point exchanges, executor.context) and "ep" (expert
    parallelism: the executor's all-to-all dispatch and its loop over local experts, executor.moe)."""
    out: list[str] = []
    if plan.tp > 1:
        out.append("tp")
    if plan.cp > 1:
        out.append("cp")
    if plan.ep > 1:
        out.append("ep")
    if plan.uses_parameter_servers:
        return (*out, "ps", *(() if plan.sync_parameter_servers else ("async",)),
                *(("zero3",) if plan.zero_stage == 3 else ()))
    if plan.dp > 1:
        if plan.zero_stage == 1:
            out.append("zero1")
        elif plan.zero_stage == 2:
            out.append("zero2")
        elif plan.zero_stage == 3:
            out.append("zero3")
        if plan.zero_stage >= 2 and plan.dp_shard < plan.dp:
            out.append("hsdp")
        if plan.grad_compression.enabled:
            out.append("compression")
    elif plan.zero_stage == 3:  # the simulator shards even at dp 1 (nothing to shard; kept for old profiles)
        out.append("zero3")
    if plan.pp > 1:
        out.append("pipeline")
        if plan.virtual_pipeline_stages > 1:
            out.append("multichunk")
        if plan.schedule == "zero-bubble":
            out.append("split_backward")
        if replicates_with_fsdp2(plan):  # whole parameters behind per-block hooks, as "zero2" keeps them
            out.append("zero2")
    return tuple(out)


def replicates_with_fsdp2(plan: Any) -> bool:
    """Plain data parallelism that the executor runs on FSDP2's ``replicate``: several chunks per
    rank or zero-bubble's split backward, which DDP's reducer cannot run (executor.parallelize.
    data_parallel_kind); under torch.distributed.pipelining it reduces once a step, after the
    stage's last backward (``backward_maybe_with_nosync``)."""
    split = plan.virtual_pipeline_stages > 1 or plan.schedule == "zero-bubble"
    return plan.zero_stage == 0 and plan.pp > 1 and split and plan.dp * plan.cp > 1


def runs_ddp_reducer(plan: Any) -> bool:
    """Whether the executor wraps the plan in DDP (executor.parallelize.data_parallel_kind "ddp"
    or "zero1", which reads it here, as do the reducer's price, simdist.analytic.reducer, and the
    optimizer's per-tensor terms, simdist.analytic.cpu_optimizer): replicas (dp x cp > 1) of plain
    or ZeRO-1 data parallelism, neither on parameter servers nor on FSDP2's replicate
    (:func:`replicates_with_fsdp2`)."""
    return (plan.dp * plan.cp > 1 and plan.zero_stage <= 1 and not plan.uses_parameter_servers
            and not replicates_with_fsdp2(plan))


BASE_TERMS = "base"  # the plain plans' terms (sync_wait_fractions: their waits at the gradient sync)
# the layers whose fixed waits are per pipeline transfer (the stages' sends and receives: several
# chunks per rank add transfers, a split backward adds none), whatever each micro-batch computes
TRANSFER_TERMS = ("pipeline", "multichunk", "split_backward")
# FSDP2's layers: their cost is in the hooks around each wrapped module's passes, which skip the
# forward activation checkpointing runs again (FSDP2's pre-forward hook returns at once in the
# pre-backward state), so recomputed ops do not pay their per-op terms; their fixed waits are at
# FSDP2's own collectives
HOOK_LAYERS = ("zero2", "zero3", "hsdp")


def sync_points(layer: str) -> str:
    """Where ``layer``'s fixed waits (``sync_point_waits_s``) are paid: "transfer" (a pipeline's
    sends and receives), "gather" (FSDP2's own collectives) or "call" (its op lists' collectives)."""
    return "transfer" if layer in TRANSFER_TERMS else "gather" if layer in HOOK_LAYERS else "call"


def wait_keys(plan: Any) -> tuple[str, ...]:
    """The keys of ``sync_wait_fractions`` a plan pays: its layers', and the plain plans' (fitted
    at their gradient all-reduce) where it has a data-parallel gradient sync. A plan without one
    (dp = 1) waits only at its layers' own sync points (a pipeline's transfers, where a stage
    with slack behind the busiest one absorbs its neighbour's jitter)."""
    return ((BASE_TERMS,) if plan.dp > 1 else ()) + profile_layers(plan)


LAYER_TERMS = ("framework_overheads_s", "sync_wait_fractions", "sync_point_waits_s", "optimizer_layer_tensor_s")  # by layer
# a layer's terms are relative to plain DDP's and may be below zero (cheaper per op); a plan's sum
# is held at or above zero where it is used (simdist.analytic.passes, cpu_optimizer)
RELATIVE_TERMS = ("framework_overheads_s.", "optimizer_layer_tensor_s.")
