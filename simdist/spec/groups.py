"""Communication groups of a plan beyond the rank grid's own axes: Megatron-Core's expert
layout and the data-parallel group that includes the context-parallel ranks.

The rank grid (:func:`simdist.spec.plan.rank_of`) orders a rank's coordinates tp, cp, pp, dp
(tp fastest), or tp, cp, dp, pp with expert parallelism (Megatron-Core's order, so that an
expert group takes consecutive ranks). Inside one pipeline stage the tp*cp*dp ranks have the
*stage index*
``l = t + tp*(c + cp*d)``. Megatron-Core lays the experts of a stage over the same ranks with
expert tensor parallelism fastest, then expert parallelism, then expert data parallelism
(megatron/core/parallel_state.py: the expert RankGenerator's order "tp-ep-dp" with etp, ep and
expert_data_parallel_size = tp*cp*dp / (etp*ep)): ``l = et + etp*(e + ep*ed)``. So an
expert-parallel group is ``ep`` stage indices ``etp`` apart, which crosses the tensor- and
context-parallel ranks first and the data-parallel ones after.

Groups (:data:`GROUP_AXES`):

- ``ep``: the ranks a token all-to-all goes between (the experts of one layer);
- ``etp``: the ranks one expert's FFN is split over;
- ``edp``: the expert weights' data-parallel group, over which expert gradients are reduced
  and expert optimizer states sharded (ZeRO / distributed optimizer);
- ``dp_cp``: the dense weights' data-parallel group when cp > 1 (Megatron-Core's
  data-parallel group "with context parallel"; torchtitan's FSDP mesh ``dp_shard_cp``), over
  which dense gradients are reduced and dense states sharded;
- ``dp_shard_cp``: the same under hybrid sharding, the shard group with its context-parallel
  ranks.
"""

from __future__ import annotations

from simdist.spec.plan import ParallelPlan, RankCoord, rank_coord, rank_of

GROUP_AXES = ("ep", "etp", "edp", "dp_cp", "dp_shard_cp")


def stage_index(rank: int, plan: ParallelPlan) -> tuple[int, int]:
    """(pipeline stage, index of the rank among its stage's tp*cp*dp ranks)."""
    c = rank_coord(rank, plan)
    return c.pp, c.tp + plan.tp * (c.cp + plan.cp * c.dp)


def rank_of_stage_index(stage: int, index: int, plan: ParallelPlan) -> int:
    """The global rank of stage index ``index`` in pipeline stage ``stage``."""
    t, rest = index % plan.tp, index // plan.tp
    c, d = rest % plan.cp, rest // plan.cp
    return rank_of(RankCoord(d, stage, c, t), plan)


def expert_coord(rank: int, plan: ParallelPlan) -> tuple[int, int, int]:
    """(etp, ep, edp) coordinates of ``rank`` in Megatron-Core's expert layout."""
    _, index = stage_index(rank, plan)
    et, rest = index % plan.etp, index // plan.etp
    return et, rest % plan.ep, rest // plan.ep


def expert_data_parallel_size(plan: ParallelPlan) -> int:
    return max(1, plan.tp * plan.cp * plan.dp // (plan.etp * plan.ep))


def local_experts(num_experts: int, plan: ParallelPlan, rank: int) -> range:
    """The routed experts (global indices) whose weights ``rank`` holds: expert-parallel rank e
    holds the e-th contiguous block of num_experts / ep (Megatron-Core's local experts)."""
    per = num_experts // plan.ep
    _, e, _ = expert_coord(rank, plan)
    return range(e * per, (e + 1) * per)


def group_ranks(plan: ParallelPlan, axis: str, rank: int = 0) -> tuple[int, ...]:
    """The ranks of ``rank``'s group along ``axis`` (a rank-grid axis or one of
    :data:`GROUP_AXES`), in the order of their index in the group."""
    if axis not in GROUP_AXES:
        c = rank_coord(rank, plan)
        stride, size = plan.axis_stride(axis), plan.axis_size(axis)
        index = {"tp": c.tp, "cp": c.cp, "pp": c.pp, "dp": c.dp, "dp_shard": c.dp % plan.dp_shard,
                 "dp_replica": c.dp // plan.dp_shard}[axis]
        first = rank - index * stride
        return tuple(first + k * stride for k in range(size))
    stage, index = stage_index(rank, plan)
    if axis in ("dp_cp", "dp_shard_cp"):
        t, rest = index % plan.tp, index // plan.tp
        d = rest // plan.cp
        if axis == "dp_cp":
            ds = range(plan.dp)
        else:
            base = d // plan.dp_shard * plan.dp_shard
            ds = range(base, base + plan.dp_shard)
        return tuple(rank_of(RankCoord(dd, stage, cc, t), plan) for dd in ds for cc in range(plan.cp))
    et, e, ed = expert_coord(rank, plan)
    etp, ep = plan.etp, plan.ep
    if axis == "etp":
        indices = [k + etp * (e + ep * ed) for k in range(etp)]
    elif axis == "ep":
        indices = [et + etp * (k + ep * ed) for k in range(ep)]
    else:  # edp
        indices = [et + etp * (e + ep * k) for k in range(expert_data_parallel_size(plan))]
    return tuple(rank_of_stage_index(stage, i, plan) for i in indices)


def group_size(plan: ParallelPlan, axis: str) -> int:
    if axis == "ep":
        return plan.ep
    if axis == "etp":
        return plan.etp
    if axis == "edp":
        return expert_data_parallel_size(plan)
    if axis == "dp_cp":
        return plan.dp * plan.cp
    if axis == "dp_shard_cp":
        return plan.dp_shard * plan.cp
    return plan.axis_size(axis)
