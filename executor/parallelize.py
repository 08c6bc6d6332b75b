"""Apply a ParallelPlan to the model with PyTorch's own APIs.

Order (as in torchtitan's ``parallelize_llama``): build the full model from one seed, keep this
rank's pipeline chunks (:func:`simdist.spec.stages.stage_layer_ranges`), tensor parallel
(DTensor ``parallelize_module``), then data parallel over the ``dp`` mesh dimension:

============  =======================================================================
zero_stage 0  ``DistributedDataParallel`` (under TP through torch's DDP x TP bridge
              ``_pre_dp_module_transform``); inside a multi-chunk or zero-bubble pipeline
              the FSDP2-based ``replicate`` (same semantics: whole parameters, gradients
              all-reduced), because DDP's reducer breaks on those schedules' backward
zero_stage 1  ``DistributedDataParallel`` + ``ZeroRedundancyOptimizer`` (optimizer states
              partitioned, whole tensors per rank); refused in those pipelines
zero_stage 2  FSDP2 ``fully_shard(reshard_after_forward=False)``
zero_stage 3  FSDP2 ``fully_shard(reshard_after_forward=True)``, False in a pipeline (as
              torchtitan: torch.distributed.pipelining keeps the parameters gathered through
              every backward and reduces at the last, ``backward_maybe_with_nosync``)
============  =======================================================================

With ``dp_shard`` < dp (hybrid sharding) FSDP2 runs on the 2-D (dp_replicate, dp_shard) mesh
(HSDP) and ZeRO-1 partitions over dp_shard; gradient compression registers a DDP communication
hook (:mod:`executor.compression`); the optimizer comes from :mod:`executor.optim`; the plan's
overlap and gather-unit knobs are :mod:`executor.knobs`.

DTensor (~0.5 s to import), FSDP2 and pipelining are imported only by the plans that use them.

Pipeline parallelism uses ``torch.distributed.pipelining.PipelineStage`` with virtual stage
``k = chunk * pp + stage`` on pipeline rank ``stage`` (Megatron's interleaved assignment) and
the schedule named by the plan (see :data:`SCHEDULES`). The mesh's rank order is
:func:`simdist.spec.plan.rank_of`'s, the grid the simulator uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from executor import expert_context, optim
from executor.knobs import apply_grad_reduce_overlap, apply_param_gather_overlap, shard_submodules
from executor.model import Transformer, build_model, lm_loss, stage_module
from executor.optim import NormSync, sharded_groups
from simdist.spec.frameworks import recompute_early_stop
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan, RankCoord, rank_coord
from simdist.spec.software_layers import runs_ddp_reducer
from simdist.spec.stages import stage_layer_ranges

# plan.schedule -> torch.distributed.pipelining schedule class. zero-bubble: ZB-H1 of Qi et al.
# 2024 (arXiv:2401.10241) as ScheduleInterleavedZeroBubble, which runs with one chunk per rank;
# ScheduleZBVZeroBubble needs exactly two chunks per rank placed in a "V" (stage r and 2pp-1-r),
# which is not the interleaved layer assignment (chunk*pp + stage) the simulator uses, and the
# scenario validation allows zero-bubble only with virtual_pipeline_stages 1.
SCHEDULES: dict[str, str] = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",
}
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "zero-bubble")  # take a list of stages


@dataclass
class ParallelModel:
    """This rank's part of the model, wrapped for the plan, with its optimizer and schedule."""

    coord: RankCoord
    chunks: list[nn.Module]  # this rank's model chunks, after TP and DP wrapping
    optimizer: torch.optim.Optimizer
    schedule: Any | None  # a pipelining schedule when pp > 1
    data_parallel: str  # none | ddp | replicate | zero1 | fsdp
    holds_input: bool  # runs the embedding (first virtual stage)
    holds_loss: bool  # runs the LM head and the loss (last virtual stage)
    mesh: DeviceMesh | None = None
    # tensor-parallel shards that DDP sees as plain tensors: id(param) -> (tp mesh, placements)
    local_shards: dict[int, tuple[DeviceMesh, tuple[Any, ...]]] = field(default_factory=dict)
    compression: Any | None = None  # executor.compression.Compression when the plan compresses
    param_names: dict[int, str] = field(default_factory=dict)  # id(param) -> name, DDP x TP only

    def parameters(self) -> list[torch.Tensor]:
        """The parameters this rank updates, as its optimizer holds them. (Not the modules'
        ``parameters()``: under DDP x TP, ``_pre_dp_module_transform`` leaves rebuilt DTensors as
        plain module attributes after a forward, so the modules no longer list them.)"""
        seen: dict[int, torch.Tensor] = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                seen.setdefault(id(p), p)
        return list(seen.values())


MESH_DIMS = ("dp", "pp", "tp")
HSDP_DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


def _group_options(backend: str, timeout: timedelta) -> tuple[str, Any]:
    opts = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    return backend, opts


def build_mesh(plan: ParallelPlan, device_type: str, backend: str, timeout: timedelta) -> DeviceMesh:
    """The (dp, pp, tp) DeviceMesh over the default process group (cp joins it when above 1).

    Its sub-groups get ``timeout`` too: without ``backend_override`` DeviceMesh gives them c10d's
    30-minute default (torch 2.13, gloo: a peer missing an all-reduce on a 2-rank sub-group
    blocked the other 12 s, against 3 s with the override), so a hung rank would stall the run.

    Hybrid sharding (``dp_shard`` < dp) splits dp into (dp_replicate, dp_shard), dp_shard inner:
    data-parallel index d = replica * dp_shard + shard, so a shard group is dp_shard consecutive
    dp ranks (inside a node, as the simulator places it) and the rank order stays that of
    simdist.spec.plan.rank_of. ``mesh["dp"]`` is the two flattened back into one dimension
    (torchtitan does the same), for DDP, the data and the loss.
    """
    if plan.dp_shard >= plan.dp:  # v1.2: experts put pp outermost, cp joins the grid (rank_of's order)
        dims = ("pp", "dp", "tp") if plan.pipeline_outermost else ("dp", "pp", "cp", "tp") if plan.cp > 1 else MESH_DIMS
        return init_device_mesh(device_type, tuple(plan.axis_size(d) for d in dims), mesh_dim_names=dims,
                                backend_override={dim: _group_options(backend, timeout) for dim in dims})
    override = {dim: _group_options(backend, timeout) for dim in HSDP_DIMS}
    mesh = init_device_mesh(device_type, (plan.dp // plan.dp_shard, plan.dp_shard, plan.pp, plan.tp),
                            mesh_dim_names=HSDP_DIMS, backend_override=override)
    mesh["dp_replicate", "dp_shard"]._flatten("dp", backend_override=_group_options(backend, timeout))
    return mesh


def shard_mesh(plan: ParallelPlan, mesh: DeviceMesh) -> DeviceMesh:
    """The mesh FSDP2 shards over: dp, or (dp_replicate, dp_shard) for HSDP (FSDP2 replicates
    over the first dimension and shards over the second, Zhao et al. VLDB 2023 sec 3.2.2)."""
    return mesh["dp_replicate", "dp_shard"] if plan.hybrid_sharding else mesh["dp"]


def zero1_group(plan: ParallelPlan, mesh: DeviceMesh) -> dist.ProcessGroup:
    """ZeRO-1 partitions the optimizer over the shard group (all of dp without hybrid sharding):
    DDP has already averaged the gradients over every dp rank."""
    return mesh["dp_shard"].get_group() if plan.hybrid_sharding else mesh["dp"].get_group()


def data_parallel_kind(plan: ParallelPlan) -> str:
    """Which data-parallel wrapper the plan gets (see the module docstring). With dp = 1 there is
    nothing to replicate or shard (every ZeRO stage holds the same states), so none."""
    if plan.dp * plan.cp == 1:
        return "none"
    if plan.shards_gradients:
        return "fsdp"
    # DDP's reducer fails with several chunks per rank ("rebuilt parameter indices" assert) and
    # gives wrong gradients with zero-bubble's split backward (measured: 5.7e-4 relative loss
    # error after 3 steps): it fires its all-reduce from hooks that assume one backward per step.
    # Those plans run on FSDP2's replicate; ZeRO-1 keeps DDP (executor.checks refuses it there).
    if not runs_ddp_reducer(plan):
        return "replicate"
    return "zero1" if plan.zero_stage == 1 else "ddp"


# --- tensor parallel ------------------------------------------------------------------------


def tensor_parallel_plan(chunk: Transformer, sequence_parallel: bool, vocab_parallel_loss: bool = False) -> dict[str, Any]:
    """Megatron-LM's layout (Shoeybi et al. 2019, sec 3) as DTensor parallel styles.

    q/k/v, fc1/gate/up column-parallel; o, fc2/down row-parallel; the token embedding
    vocabulary-parallel (RowwiseParallel on an nn.Embedding shards the vocabulary); the LM head
    column-parallel with its logits gathered. Norms and learned positions stay replicated. With
    sequence parallelism (Korthikanti et al. 2022) the norms run on sequence shards
    (SequenceParallel), the blocks all-gather their input once (PrepareModuleInput) and the row-
    parallel outputs are reduce-scattered back to sequence shards (output_layouts=Shard(1)).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq = Shard(1)
    out = seq if sequence_parallel else Replicate()
    styles: dict[str, Any] = {}
    if chunk.embed is not None:
        styles["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=out)
        if chunk.embed.pos is not None and sequence_parallel:
            styles["embed.pos"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq)
    for name, block in chunk.layers.items():
        p = f"layers.{name}"
        if sequence_parallel:
            styles[f"{p}.attn_norm"] = SequenceParallel()
            styles[f"{p}.mlp_norm"] = SequenceParallel()
            styles[f"{p}.attn"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
            styles[f"{p}.mlp"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        for proj in ("q", "k", "v"):
            styles[f"{p}.attn.{proj}"] = ColwiseParallel()
        styles[f"{p}.attn.o"] = RowwiseParallel(output_layouts=out)
        col, row = (("gate", "up"), "down") if block.mlp.swiglu else (("fc1",), "fc2")
        for proj in col:
            styles[f"{p}.mlp.{proj}"] = ColwiseParallel()
        styles[f"{p}.mlp.{row}"] = RowwiseParallel(output_layouts=out)
    if chunk.lm_head is not None:
        if sequence_parallel:
            styles["final_norm"] = SequenceParallel()
        if vocab_parallel_loss:  # Megatron's vocab-parallel cross entropy: logits stay sharded
            styles["lm_head"] = ColwiseParallel(input_layouts=out, output_layouts=Shard(-1), use_local_output=False)
        else:
            styles["lm_head"] = ColwiseParallel(input_layouts=out, output_layouts=Replicate())
    return styles


def _shard_replicated_grad(p: torch.Tensor) -> None:
    """Post-accumulate-grad hook: give a sharded parameter its gradient in the same layout.

    DTensor's backward of the vocabulary-parallel embedding returns the gradient of the
    Shard(0) weight as Replicate (the full vocab x hidden on every TP rank, measured with torch
    2.13); the optimizer still computes the right update, but each rank would hold the whole
    gradient. Replicate -> Shard is a local slice (no communication).
    """
    from torch.distributed.tensor import DTensor, Replicate

    grad = p.grad
    if (isinstance(p, DTensor) and isinstance(grad, DTensor) and grad.placements != p.placements
            and all(isinstance(g, Replicate) for g in grad.placements)):
        p.grad = grad.redistribute(p.device_mesh, p.placements)


def apply_tensor_parallel(chunk: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool,
                          vocab_parallel_loss: bool = False) -> None:
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(chunk, tp_mesh, tensor_parallel_plan(chunk, sequence_parallel, vocab_parallel_loss))
    for p in chunk.parameters():
        if isinstance(p, DTensor) and any(isinstance(x, Shard) for x in p.placements):
            p.register_post_accumulate_grad_hook(_shard_replicated_grad)
    # parallelize_module replaces each parameter; re-tie a shared LM head (both are Shard(0)).
    if chunk.spec.tie_embeddings and chunk.embed is not None and chunk.lm_head is not None:
        chunk.lm_head.weight = chunk.embed.tok.weight


# --- data parallel --------------------------------------------------------------------------


def apply_fsdp(chunk: Transformer, dp_mesh: DeviceMesh, reshard_after_forward: bool) -> nn.Module:
    """FSDP2 per transformer layer, then the rest of the chunk (embedding, head) as its root."""
    from torch.distributed.fsdp import fully_shard

    for block in chunk.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    return chunk


def apply_replicate(chunk: Transformer, dp_mesh: DeviceMesh) -> nn.Module:
    """DDP semantics on the FSDP2 machinery (``torch.distributed._composable.replicate_with_fsdp``)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for block in chunk.layers.values():
        replicate(block, mesh=dp_mesh)
    replicate(chunk, mesh=dp_mesh)
    return chunk


def localize_tensor_parallel_params(chunk: nn.Module) -> dict[int, tuple[DeviceMesh, tuple[Any, ...]]]:
    """Let DDP (and ZeroRedundancyOptimizer) see DTensor parameters as plain local tensors.

    ``torch.distributed.tensor.parallel.ddp._pre_dp_module_transform`` is PyTorch's own TP x DDP
    bridge: it swaps each DTensor parameter for its local shard and rebuilds the DTensors in a
    forward pre-hook, so DDP all-reduces the local gradients over dp. Without it DDP fails
    (``aten.cat.default got mixed torch.Tensor and DTensor``).

    Returns id(local parameter) -> (mesh, placements) of the DTensor it stands for: LAMB/LARS need
    it to sum norms over the tensor-parallel shards, and the checkpoint to save them as shards.
    """
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

    specs = {name: (p.device_mesh, tuple(p.placements)) for name, p in chunk.named_parameters()
             if hasattr(p, "placements")}
    _pre_dp_module_transform(chunk)
    return {id(p): specs[name] for name, p in chunk.named_parameters() if name in specs}


def apply_ddp(chunk: Transformer, dp_group: dist.ProcessGroup, bucket_bytes: float,
              device: torch.device) -> nn.Module:
    return DistributedDataParallel(
        chunk,
        process_group=dp_group,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_bytes / 2**20,
    )


# --- optimizer ------------------------------------------------------------------------------


def make_optimizer(params: list[nn.Parameter], plan: ParallelPlan, zero1_group: dist.ProcessGroup | None,
                   norm_sync: NormSync | None = None) -> torch.optim.Optimizer:
    """The plan's optimizer (:mod:`executor.optim`), wrapped in ZeroRedundancyOptimizer for ZeRO-1."""
    return optim.make_optimizer(params, plan.optimizer, zero1_group, norm_sync)


# --- the whole plan -------------------------------------------------------------------------


def chunk_layers(m: ModelSpec, plan: ParallelPlan, stage: int) -> list[tuple[int, list[int]]]:
    """(virtual stage index, layer ids) of each chunk held by pipeline rank ``stage``."""
    ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages)[stage]
    return [(c * plan.pp + stage, list(r)) for c, r in enumerate(ranges)]


def build_parallel_model(m: ModelSpec, plan: ParallelPlan, rank: int, mesh: DeviceMesh,
                         device: torch.device, seed: int) -> ParallelModel:
    """This rank's part of the model, parallelised per ``plan`` on ``mesh``."""
    coord = rank_coord(rank, plan)
    full = build_model(m, seed, recompute=plan.recompute, early_stop=recompute_early_stop(plan))
    n_virtual = plan.pp * plan.virtual_pipeline_stages
    parts: list[tuple[int, Transformer]] = []
    for k, layer_ids in chunk_layers(m, plan, coord.pp):
        parts.append((k, stage_module(full, layer_ids, first=k == 0, last=k == n_virtual - 1)))
    del full
    kind = data_parallel_kind(plan)
    chunks: list[nn.Module] = []
    local_shards: dict[int, tuple[DeviceMesh, tuple[Any, ...]]] = {}
    extras = expert_context.make_groups(plan, rank)  # expert / context parallelism (v1.2)
    for _, chunk in parts:
        chunk.to(device)
        expert_context.prepare_chunk(chunk, plan, rank, extras)
        if plan.tp > 1:
            # without a pipeline the loss is computed here, on vocabulary-sharded logits
            # (train.loss_context); pipeline schedules compute it on gathered logits
            apply_tensor_parallel(chunk, mesh["tp"], plan.sequence_parallel, vocab_parallel_loss=plan.pp == 1)
        if kind == "fsdp":
            if plan.zero3_fetch != "layer" and plan.shards_params:  # executor.knobs
                shard_submodules(chunk, shard_mesh(plan, mesh), reshard_after_forward=True)
            chunks.append(apply_fsdp(chunk, shard_mesh(plan, mesh), plan.shards_params and plan.pp == 1))
            apply_param_gather_overlap(chunks[-1], plan)
        elif kind == "replicate":
            chunks.append(apply_replicate(chunk, mesh["dp"]))
        elif kind in ("ddp", "zero1"):
            if plan.tp > 1:
                local_shards.update(localize_tensor_parallel_params(chunk))
            data_group = expert_context.data_group(extras, mesh["dp"].get_group())
            chunks.append(apply_ddp(chunk, data_group, plan.ddp_bucket_size_bytes, device))
            apply_grad_reduce_overlap(chunks[-1], plan, data_group)
        else:
            chunks.append(chunk)
    compression = None
    if plan.grad_compression.enabled:
        from executor.compression import Compression

        compression = Compression(plan, mesh["dp"].get_group(), seed)
        for chunk in chunks:
            compression.register(chunk)
    params: dict[int, nn.Parameter] = {}
    for chunk in chunks:
        for p in chunk.parameters():
            params.setdefault(id(p), p)
    explicit = {pid: sharded_groups(m, pls) for pid, (m, pls) in local_shards.items()}
    optimizer = make_optimizer(list(params.values()), plan,
                               zero1_group(plan, mesh) if kind == "zero1" else None, NormSync(explicit))
    expert_context.after_build(optimizer, chunks, plan, extras)
    schedule = None
    if plan.pp > 1:
        schedule = build_schedule(plan, [k for k, _ in parts], chunks, n_virtual, device,
                                  mesh["pp"].get_group())
    return ParallelModel(
        coord=coord,
        chunks=chunks,
        optimizer=optimizer,
        schedule=schedule,
        data_parallel=kind,
        holds_input=any(k == 0 for k, _ in parts),
        holds_loss=any(k == n_virtual - 1 for k, _ in parts),
        mesh=mesh,
        local_shards=local_shards,
        compression=compression,
        param_names={id(p): name for chunk in chunks for name, p in getattr(chunk, "module", chunk).named_parameters()}
        if local_shards else {},
    )


def build_schedule(plan: ParallelPlan, stage_ids: list[int], chunks: list[nn.Module], n_virtual: int,
                   device: torch.device, pp_group: dist.ProcessGroup) -> Any:
    """PipelineStage per chunk and the plan's schedule; gradients are divided by the number of
    micro-batches (``scale_grads=True``) since :func:`executor.model.lm_loss` is a mean."""
    import torch.distributed.pipelining as pipelining  # ~0.5 s to import: only when pp > 1

    stages = [pipelining.PipelineStage(chunk, k, n_virtual, device, group=pp_group)
              for k, chunk in zip(stage_ids, chunks, strict=True)]
    cls = getattr(pipelining, SCHEDULES[plan.schedule])
    first = stages if plan.schedule in MULTI_STAGE_SCHEDULES else stages[0]
    return cls(first, n_microbatches=plan.num_microbatches, loss_fn=lm_loss, scale_grads=True)


def set_gradient_sync(pm: ParallelModel, enabled: bool) -> None:
    """Whether FSDP2 reduces this micro-batch's gradients (gradient accumulation: executor.train)."""
    for chunk in pm.chunks:
        if hasattr(chunk, "set_requires_gradient_sync"):  # an FSDPModule (fully_shard, replicate)
            chunk.set_requires_gradient_sync(enabled)
