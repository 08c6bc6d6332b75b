"""Data-parallel traffic over the groups contract v1.2 adds (:mod:`simdist.spec.groups`).

- Dense parameters are replicated over dp*cp ranks when cp > 1: their gradients are reduced,
  and ZeRO shards their states, over the ``dp_cp`` group (Megatron-Core's data-parallel group
  with context parallel; torchtitan's FSDP mesh ``dp_shard_cp``).
- Routed experts are replicated over the expert-data-parallel group (``edp``: tp*cp*dp /
  (etp*ep) ranks): their gradients are reduced, and their states sharded, there, in buffers of
  their own (Megatron-Core's DDP keeps expert parameters in separate buckets). Hybrid sharding
  applies to the dense parameters only; the expert states shard over the whole edp group.

Each part is the traffic :func:`simdist.analytic.data_parallel.dp_traffic` gives for its group
size and parameter count, with its collectives moved to the group's axis.
"""

from __future__ import annotations

from dataclasses import replace

from simdist.analytic.collectives import CollectiveCall
from simdist.analytic.data_parallel import DataParallelTraffic, dp_traffic
from simdist.analytic.params import expert_params_per_rank, params_per_rank
from simdist.spec.groups import expert_data_parallel_size
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def _moved(calls: tuple[CollectiveCall, ...], axes: dict[str, str]) -> tuple[CollectiveCall, ...]:
    return tuple(replace(c, axis=axes.get(c.axis, c.axis), name=f"{c.name} ({axes.get(c.axis, c.axis)})"
                         if c.axis in axes else c.name) for c in calls)


def _on(tr: DataParallelTraffic, axes: dict[str, str]) -> DataParallelTraffic:
    if not axes:
        return tr
    return replace(tr, fwd_gathers=_moved(tr.fwd_gathers, axes), bwd_gathers=_moved(tr.bwd_gathers, axes),
                   microbatch_grad_sync=_moved(tr.microbatch_grad_sync, axes),
                   step_grad_sync=_moved(tr.step_grad_sync, axes),
                   post_step_gathers=_moved(tr.post_step_gathers, axes))


def _merged(a: DataParallelTraffic, b: DataParallelTraffic) -> DataParallelTraffic:
    """Both parts' calls, issued together (bucket k of one beside bucket k of the other)."""
    return replace(a, fwd_gathers=a.fwd_gathers + b.fwd_gathers, bwd_gathers=a.bwd_gathers + b.bwd_gathers,
                   microbatch_grad_sync=a.microbatch_grad_sync + b.microbatch_grad_sync,
                   step_grad_sync=a.step_grad_sync + b.step_grad_sync,
                   post_step_gathers=a.post_step_gathers + b.post_step_gathers,
                   step_buckets=max(a.step_buckets, b.step_buckets) if a.step_grad_sync else b.step_buckets,
                   gather_chunks=max(a.gather_chunks, b.gather_chunks),
                   post_step_behind_forward=a.post_step_behind_forward or b.post_step_behind_forward)


def data_parallel_traffic(m: ModelSpec, plan: ParallelPlan, stage: int, fsdp2: bool = False) -> DataParallelTraffic:
    """Every data-parallel collective of one GPU of ``stage`` in one step, dense and expert
    (``fsdp2``: as :func:`simdist.analytic.data_parallel.dp_traffic`)."""
    experts = expert_params_per_rank(m, plan, stage) if m.is_moe else 0
    if not experts and plan.cp == 1:
        return dp_traffic(m, plan, stage, fsdp2=fsdp2)
    n = params_per_rank(m, plan, stage)
    dense_plan = replace(plan, dp=plan.dp * plan.cp, dp_shard=plan.dp_shard * plan.cp, cp=1)
    dense_axes = {"dp": "dp_cp", "dp_shard": "dp_shard_cp"} if plan.cp > 1 else {}
    if plan.cp > 1 and not plan.hybrid_sharding:
        dense_axes["dp_shard"] = "dp_cp"
    dense = _on(dp_traffic(m, dense_plan, stage, n=n - experts, fsdp2=fsdp2), dense_axes)
    if not experts:
        return dense
    edp = expert_data_parallel_size(plan)
    expert_plan = replace(plan, dp=edp, dp_shard=edp, cp=1)
    expert = _on(dp_traffic(m, expert_plan, stage, n=experts, fsdp2=fsdp2), {"dp": "edp", "dp_shard": "edp"})
    if dense_plan.dp == 1:
        return expert
    return _merged(dense, expert)
