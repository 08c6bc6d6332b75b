"""The copies FSDP2 runs beside its collectives, on the stream (or thread) that computes.

FSDP2 (``fully_shard``, per-parameter sharding; torch.distributed.fsdp._fully_shard, torch 2.13)
keeps every parameter as its own shard, so each all-gather and reduce-scatter of a module's
parameters is wrapped in copies between the per-parameter tensors and one flat buffer:

- all-gather copy-in (``foreach_all_gather``): the rank's shards copied into the flat input,
  on the all-gather copy-in stream;
- copy-out (``FSDPParamGroup.wait_for_unshard`` -> ``foreach_all_gather_copy_out``,
  ``split_with_sizes_copy``): the gathered output copied into each parameter's unsharded storage,
  on the current stream, the one that computes, which waits for it;
- reduce-scatter copy-in (``foreach_reduce`` -> ``foreach_reduce_scatter_copy_in``,
  ``chunk_cat``): the unsharded gradients copied into the reduce-scatter input, on the
  reduce-scatter stream.

Each reads and writes its bytes once. On a GPU only the copy-out is on the compute stream; on a
CPU there are no streams and all three run on the training thread (measured with torch.profiler
on ``scenarios/local-zero3-fit.yaml``, 2 ranks on gloo: ``fsdp::split_with_sizes_copy``,
``fsdp::all_gather_copy_in`` and ``fsdp::chunk_cat`` took 25, 26 and 17 ms of its 0.45 s step).
On a CPU they copy data out of the cache (gathered by gloo's thread, or written a layer's
backward ago): 8-24 GB/s each on the 2-core guest simdist was calibrated on, where the in-cache
passes of the memory microbenchmark reach 160 GB/s and a 3 MiB copy after a 64 MiB pass 20 GB/s,
so a CPU profile prices them at its cold-copy curve (``memory.cold``, executor.bench).
A micro-batch gathers a module before its forward and again before its backward; the forward
that full recompute runs again inside backward does not gather (FSDP2's pre-forward hook returns
at once in the pre-backward state; the executor's census counts two gathers per micro-batch).

Flat-parameter implementations (FSDP1, DeepSpeed ZeRO-3, Megatron-FSDP) gather into the buffer
the parameters are views of and copy nothing, so this applies to the plans that run FSDP2:
torchtitan's (``framework: torchtitan``) and the executor's, whose CPU runs a gloo profile prices.
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.compression import grad_wire_bytes, param_wire_bytes
from simdist.analytic.memory import shard_group
from simdist.analytic.ops import Compute
from simdist.analytic.params import (
    ParamCount,
    embedding_params,
    head_params,
    layer_params,
    routed_params,
)
from simdist.spec.frameworks import framework_of
from simdist.spec.profile import on_cpu
from simdist.spec.software_layers import replicates_with_fsdp2


def runs_fsdp2(plan: Any, profile: Any) -> bool:
    """Whether the plan's ZeRO-3 runs as FSDP2: torchtitan's, or the executor's (a gloo profile,
    :func:`simdist.spec.profile.on_cpu`), whose ZeRO-2 is FSDP2 too (``reshard_after_forward=
    False``: gathered before each micro-batch's forward, resharded after its backward)."""
    if plan.zero_stage < 2 or shard_group(plan) <= 1 or plan.uses_parameter_servers:
        return False
    return on_cpu(profile) or (plan.zero_stage == 3 and framework_of(plan.framework).fsdp2)


def reduces_in_line(plan: Any, profile: Any) -> bool:
    """Whether the backward waits for each module's gradient reduction: FSDP2 on a CPU profile,
    the executor's ZeRO-2 and ZeRO-3 and its FSDP2 ``replicate`` (simdist.spec.profile.
    replicates_with_fsdp2, which reduces once a step, after the stage's last backward).

    ``foreach_reduce`` (torch.distributed.fsdp._fully_shard._fsdp_collectives, torch 2.13) calls
    the reduce-scatter, and HSDP's all-reduce across replicas, without ``async_op``. With NCCL
    that returns once the collective is queued on the reduce-scatter stream; gloo's returns when
    it is done, so on a CPU each module's post-backward hook holds the training thread for its
    whole reduction (gloo's ``_reduce_scatter_base`` clones the input on the calling thread, then
    all-reduces it on its worker thread). Measured with torch.profiler on
    ``scenarios/local-zero3-fit.yaml`` (2 ranks, 2026-11-29): ``FSDP::post_backward_reduce``
    held the thread 3.1-5.7 ms per module and micro-batch, 22 ms of a micro-batch's 96 ms
    backward, where the reduce-scatters of a layer's 3 MiB take 4.4 ms by the microbenchmark."""
    fsdp = plan.shards_gradients or replicates_with_fsdp2(plan)
    return on_cpu(profile) and fsdp and plan.dp * plan.cp > 1 and not plan.uses_parameter_servers


def input_copies_s(traffic: Any, cost: Any) -> float:
    """The training thread's CPU time in one micro-batch's in-line reduce-scatters that the
    executor counts as backward, not communication: gloo's reduce-scatter copies its input on
    the calling thread before it all-reduces the copy on its worker thread (torch.profiler on
    local-zero3-fit: ``aten::clone`` under ``c10d::_reduce_scatter_base_``, 12.7 ms of its 0.53 s
    step, 8-35 GB/s). The collectives microbenchmark times the copy with the collective, so the
    step's time is the model's either way; only the phases a calibration fits differ."""
    if not traffic.in_line:
        return 0.0
    return sum(c.calls * cost.time(Compute("gloo reduce-scatter input copy", "copy", bytes=2 * c.bytes))
               for c in traffic.microbatch_grad_sync if c.kind == "reducescatter")


def copy_ops(plan: Any, params: int, on_cpu: bool) -> tuple[tuple[Compute, ...], tuple[Compute, ...]]:
    """The copies of one FSDP2 module holding ``params`` parameters on this rank (before
    sharding) that run where it computes in a micro-batch: (before its forward, before its
    backward); ZeRO-2 gathers for the forward only."""
    unsharded = params * param_wire_bytes(plan)
    if not on_cpu:
        out = Compute("fsdp2 copy-out", "memory", bytes=2 * unsharded)
        return (out,), (out,)
    out = Compute("fsdp2 copy-out", "copy", bytes=2 * unsharded)
    shard = Compute("fsdp2 copy-in", "copy", bytes=2 * unsharded / shard_group(plan))
    grads = Compute("fsdp2 grad copy-in", "copy", bytes=2 * params * grad_wire_bytes(plan, sharded=True))
    return (shard, out), ((shard, out, grads) if plan.shards_params else (grads,))


def layer_params_on_rank(m: Any, plan: Any, moe: bool) -> int:
    """One layer's parameters on one rank before sharding: dense ones split over tp, routed
    experts over ep and etp (simdist.analytic.params.params_per_rank's rule)."""
    whole = layer_params(m, moe)
    if not moe:
        return whole.per_tp_rank(plan.tp)
    routed = routed_params(m)
    dense = ParamCount(whole.sharded - routed.sharded, whole.replicated - routed.replicated)
    return dense.per_tp_rank(plan.tp) + routed.per_tp_rank(plan.etp) // plan.ep


def root_params_on_rank(m: Any, plan: Any) -> int:
    """The embedding and the LM head on one rank without a pipeline: the root module that
    FSDP2 gathers besides the layers (a pipeline's are gathered once a step, copies unpriced)."""
    return embedding_params(m).per_tp_rank(plan.tp) + head_params(m, separate_copy=False).per_tp_rank(plan.tp)
