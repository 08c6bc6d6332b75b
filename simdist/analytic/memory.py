"""Memory per GPU: model states (ZeRO paper accounting, or the framework's own layout), saved
activations (simdist.analytic.activations), working buffers (simdist.analytic.transients) and
what the process holds beyond tensors (simdist.analytic.runtime_memory). The caching allocator's
reserved-over-allocated gap is simdist.analytic.allocation_trace.

Sources
- Rajbhandari et al., "ZeRO" (SC'20, arXiv:1910.02054) sec 3 and Fig. 1: mixed-precision Adam
  holds 2 B (16-bit params) + 2 B (16-bit grads) + K=12 B (fp32 master, momentum, variance)
  per parameter; ZeRO-1/2/3 shard the optimizer states / + gradients / + parameters over N_d.
- Megatron-Core shards its distributed optimizer and reduces gradients over the data-parallel
  group *with* context parallelism (parallel_state.get_data_parallel_group(
  with_context_parallel=True)); torchtitan applies FSDP over the flattened ``dp_shard_cp`` mesh.
  So ZeRO shards over dp_shard x cp.
- Framework layouts (FSDP2's fp32 shards, DeepSpeed's buffers, DDP's bucket copy, pipelines
  with FSDP): simdist.analytic.memory_conventions. FP8 weight copies: simdist.analytic.fp8_memory.
  ZeRO++ hpZ's secondary partition: simdist.analytic.hpz.
"""

from __future__ import annotations

import math
from dataclasses import field

from simdist.analytic.activations import (  # noqa: F401 (re-exported: the memory API in one place)
    activation_bytes,
    head_activation_bytes,
    in_flight,
    layer_activation_bytes,
    layers_held,
)
from simdist.analytic.collectives import node_gpus
from simdist.analytic.fp8_memory import (
    gathered_weight_bytes,
    linear_weight_params,
    scaling_state_bytes,
    weight_cache_bytes_per_param,
)
from simdist.analytic.hpz import secondary_partition_bytes
from simdist.analytic.memory_conventions import conventions
from simdist.analytic.overlap import bucket_bytes
from simdist.analytic.param_server import ps_server_count
from simdist.analytic.params import matrix_shapes, params_per_rank, stage_num_layers, total_params
from simdist.analytic.runtime_memory import RuntimeMemory, runtime_memory
from simdist.analytic.transients import transient_bytes, transient_parts  # noqa: F401
from simdist.analytic.variant_memory import state_params  # contract v1.2: experts, cp
from simdist.frozen import frozen
from simdist.spec.cluster import ClusterSpec
from simdist.spec.frameworks import framework_of
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


@frozen(slots=True)
class StateBytes:
    """Bytes per parameter for each model state (before any ZeRO sharding)."""

    params: float
    grads: float
    optimizer: float  # optimizer states incl. the fp32 master copy in mixed precision


def optimizer_state_bytes_per_param(m: ModelSpec, optimizer: str) -> float:
    """fp32 optimizer states per parameter (without the master copy).

    adam/adamw/lamb: momentum + variance, 8 B (Kingma & Ba 2015; You et al. 2020 for LAMB);
    sgd (with momentum) and lars: momentum, 4 B (You et al. 2017 for LARS);
    adafactor with momentum: 4 B + factored second moments, 4(r+c) B per r x c matrix
    (Shazeer & Stern 2018), i.e. "slightly more than 4" as the Hugging Face docs say.
    """
    if optimizer in ("adam", "adamw", "lamb"):
        return 8.0
    if optimizer in ("sgd", "lars"):
        return 4.0
    if optimizer == "adafactor":
        entries = sum(r * c * n for r, c, n in matrix_shapes(m))
        factored = sum(4 * (r + c) * n for r, c, n in matrix_shapes(m))
        return 4.0 + factored / entries
    raise ValueError(optimizer)


def state_bytes(m: ModelSpec, plan: ParallelPlan) -> StateBytes:
    """The working weights (fp32, or 16-bit: FP8 weights are transient casts of 16-bit
    parameters), the gradient buffer, and the optimizer states with the fp32 master copy that
    mixed-precision training keeps (none in fp32 training). What the optimizer step reads and
    writes; where the bytes sit per framework is :func:`resident_state_bytes`."""
    master = 4.0 if plan.mixed_precision else 0.0
    return StateBytes(float(plan.element_bytes), float(plan.grad_buffer_bytes),
                      master + optimizer_state_bytes_per_param(m, plan.optimizer))


def resident_state_bytes(m: ModelSpec, plan: ParallelPlan) -> StateBytes:
    """Bytes per parameter each state takes in the plan's framework (memory_conventions):
    FSDP2/DDP mixed precision keeps fp32 parameters (the master weights) and fp32 gradients,
    DeepSpeed its estimator's 18 B under ZeRO-3; otherwise :func:`state_bytes`."""
    b = state_bytes(m, plan)
    conv = conventions(plan)
    if conv.fsdp2_fp32_shards:
        return StateBytes(4.0, 4.0, b.optimizer - 4.0)
    if conv.deepspeed_buffers and plan.zero_stage == 3 and plan.mixed_precision:
        return StateBytes(b.params, 4.0, b.optimizer)
    return b


def shard_group(plan: ParallelPlan) -> int:
    """Ranks ZeRO/FSDP shards over: the shard group (all of dp without hybrid sharding) times
    the context-parallel ranks, which hold the same weights."""
    return plan.dp_shard * plan.cp


def optimizer_shard_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters whose optimizer states one GPU of ``stage`` owns (its ZeRO partition)."""
    return state_params(m, plan, stage, plan.shards_optimizer)


def model_state_bytes(m: ModelSpec, plan: ParallelPlan, stage: int = 0,
                      cluster: ClusterSpec | None = None) -> dict[str, float]:
    """Bytes of params, grads and optimizer states on one GPU of ``stage``, and what the plan
    keeps off the GPU: ``host_params`` / ``host_optimizer`` (host memory, per GPU) and
    ``nvme`` (NVMe, per GPU).

    ZeRO stage z shards, over the shard group (:func:`shard_group`; FSDP HYBRID_SHARD / HSDP
    replicate across dp/dp_shard groups, Zhao et al. VLDB 2023 sec 3.2.2): z>=1 the optimizer
    states, z>=2 the gradients, z=3 the parameters, so the model states of mixed-precision Adam
    take 16P/dp_shard per GPU under ZeRO-3. ``params`` also holds the working copies a framework
    keeps beside the sharded ones: FP8 weight caches, hpZ's secondary partition, the gathered
    layers a pipeline keeps under FSDP2; ``grads`` the extra gradient copies (DDP buckets,
    DeepSpeed's fp32 partition, FSDP2's unsharded accumulation under a pipeline).
    Offload (plan.offload):
    - optimizer on cpu (ZeRO-Offload, Ren et al. USENIX ATC'21 sec 4.1): the fp32 master weights
      and optimizer states of the GPU's partition move to host memory with an fp32 gradient
      buffer for the CPU step (16 B per parameter for Adam, DeepSpeed's
      estimate_zero2_model_states_mem_needs); the GPU keeps its 16-bit parameters and, for the
      gradients, only the buckets in flight to the host;
    - optimizer on nvme (ZeRO-Infinity, Rajbhandari et al. SC'21): the same states on NVMe;
    - params on cpu/nvme (ZeRO-Infinity; FSDP CPUOffload): the 16-bit parameter shard leaves the
      GPU; the gathered layers in use stay in the transient buffers.
    Parameter servers (plan.gradient_sync) keep the fp32 parameters, the optimizer states and an
    fp32 gradient sum on the servers' hosts (Li et al. OSDI'14); the workers hold no optimizer
    states. Their host share is reported per GPU when ``cluster`` is given.
    """
    n = params_per_rank(m, plan, stage)
    b = resident_state_bytes(m, plan)
    out = {  # dense states sharded over dp_shard*cp, experts over their own group (v1.2)
        "params": state_params(m, plan, stage, _shards_resident_params(plan)) * b.params,
        "grads": state_params(m, plan, stage, plan.shards_gradients) * b.grads,
        "optimizer": state_params(m, plan, stage, plan.shards_optimizer) * b.optimizer,
        "host_params": 0.0,
        "host_optimizer": 0.0,
        "nvme": 0.0,
    }
    _framework_copies(m, plan, stage, n, out)
    if plan.offload.optimizer != "none":
        offloaded = out["optimizer"] + 4.0 * optimizer_shard_params(m, plan, stage)  # + fp32 gradients
        out["host_optimizer" if plan.offload.optimizer == "cpu" else "nvme"] = offloaded
        out["optimizer"] = 0.0
        out["grads"] = min(out["grads"], 2 * bucket_bytes(plan))  # the framework's bucket rule
    if plan.offload.params != "none":
        out["host_params" if plan.offload.params == "cpu" else "nvme"] += out["params"]
        out["params"] = 0.0
    if plan.uses_parameter_servers:
        out["optimizer"] = 0.0
        if cluster is not None:
            servers = ps_server_count(plan, cluster)
            per_node = math.ceil(servers / cluster.num_nodes)
            per_server = total_params(m) * (state_bytes(m, plan).optimizer + 4.0) / servers
            out["host_optimizer"] = per_server * per_node / node_gpus(cluster)
    return out


def _shards_resident_params(plan: ParallelPlan) -> bool:
    """Whether the resident parameters are sharded. FSDP always shards its flat (FSDP1) or
    DTensor (FSDP2) parameters, which under mixed precision are the fp32 master weights; ZeRO-2
    style FSDP (FSDP1 ``ShardingStrategy.SHARD_GRAD_OP``, FSDP2 ``reshard_after_forward=False``)
    differs from ZeRO-3 only in keeping the gathered compute-dtype weights from forward to
    backward (PyTorch FSDP docs, ShardingStrategy; Zhao et al. VLDB 2023 sec 3.2). Those
    gathered weights are added by :func:`_framework_copies`."""
    return plan.shards_params or _shard_grad_op(plan)


def _shard_grad_op(plan: ParallelPlan) -> bool:
    """ZeRO-2 run by FSDP (``ShardingStrategy.SHARD_GRAD_OP``, FSDP2 ``reshard_after_forward=False``)."""
    return conventions(plan).fsdp2_fp32_shards and plan.zero_stage == 2


def _framework_copies(m: ModelSpec, plan: ParallelPlan, stage: int, n: int, out: dict[str, float]) -> None:
    """Weight and gradient copies beyond the ZeRO partition (see :func:`model_state_bytes`)."""
    conv = conventions(plan)
    layers = stage_num_layers(m, plan, stage)
    out["params"] += layers * (linear_weight_params(m, plan) * weight_cache_bytes_per_param(plan)
                               + scaling_state_bytes(1, plan))
    out["params"] += secondary_partition_bytes(n, plan)
    if plan.shards_params and plan.pp > 1 and conv.pp_fsdp_unsharded and conv.fsdp2_fp32_shards:
        out["params"] += n * gathered_weight_bytes(plan)  # reshard_after_forward=False
        out["grads"] += n * 4.0  # unsharded gradients accumulated in reduce_dtype (fp32)
    if _shard_grad_op(plan):
        out["params"] += n * plan.element_bytes  # SHARD_GRAD_OP keeps the gathered weights
        # under a pipeline, torchtitan's stage defers the reduction to the last micro-batch and
        # accumulates unsharded fp32 gradients; elsewhere each micro-batch's gradients are
        # reduce-scattered as backward makes them (the data-parallel timing's own rule)
        if plan.pp > 1 and framework_of(plan.framework).fsdp_pipeline_no_sync:
            out["grads"] += n * 4.0
    if conv.ddp_bucket_copy and plan.zero_stage in (0, 1) and plan.dp > 1 and not plan.uses_parameter_servers:
        out["grads"] += n * resident_state_bytes(m, plan).grads  # gradient_as_bucket_view=False
    if conv.deepspeed_buffers and plan.zero_stage in (1, 2) and plan.mixed_precision:
        out["grads"] = n * plan.element_bytes + 4.0 * n / shard_group(plan)  # full 16-bit + fp32 partition


@frozen(slots=True)
class StageMemory:
    """One GPU of one pipeline stage at its peak. ``other`` holds the working buffers
    (``other_parts``: gathered weights, logit buffers, buckets, ...) and the runtime's context,
    NCCL buffers and cuBLAS workspaces; ``runtime`` says how much of it lives outside PyTorch's
    caching allocator (context and NCCL)."""

    stage: int
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    host: float = 0.0  # offloaded states on the host (per GPU)
    nvme: float = 0.0  # offloaded states on NVMe (per GPU)
    runtime: RuntimeMemory = field(default_factory=RuntimeMemory)
    other_parts: tuple[tuple[str, float], ...] = ()
    step_peak: bool = False  # the peak is the optimizer step's (activations freed)

    @property
    def peak(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other

    @property
    def allocator_peak(self) -> float:
        """What PyTorch's caching allocator has allocated at the peak (the peak without the
        context and NCCL buffers)."""
        return self.peak - self.runtime.outside_allocator


def stage_memory(m: ModelSpec, plan: ParallelPlan, stage: int, cluster: ClusterSpec | None = None,
                 states: dict[str, float] | None = None, rt: RuntimeMemory | None = None,
                 act: float | None = None) -> StageMemory:
    """The peak of one GPU of ``stage``; with ``cluster``, its runtime overheads too (none for
    host processes, none without a cluster). ``states``, ``rt`` and ``act``: :func:`model_state_bytes`,
    :func:`runtime_memory` and :func:`activation_bytes` of the same arguments, when the caller has
    them already (a search shares them between plans that differ only in what they ignore)."""
    if states is None:
        states = model_state_bytes(m, plan, stage, cluster)
    if act is None:
        act = activation_bytes(m, plan, stage)
    parts, step_peak = transient_parts(m, plan, stage, act)
    if rt is None:
        rt = runtime_memory(plan, cluster)
    parts = parts + [(name, v) for name, v in rt.parts().items() if v]
    return StageMemory(
        stage=stage,
        params=states["params"],
        grads=states["grads"],
        optimizer=states["optimizer"],
        activations=0.0 if step_peak else act,
        other=sum(v for _, v in parts),
        host=states["host_params"] + states["host_optimizer"],
        nvme=states["nvme"],
        runtime=rt,
        other_parts=tuple(parts),
        step_peak=step_peak,
    )


def memory_per_stage(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> list[StageMemory]:
    return [stage_memory(m, plan, s, cluster) for s in range(plan.pp)]
