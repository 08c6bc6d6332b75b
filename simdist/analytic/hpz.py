"""ZeRO++ hierarchical partitioning (hpZ, ``plan.zero_hpz_partition_size``).

Wang et al., "ZeRO++: Extremely Efficient Collective Communication for Giant Model Training"
(arXiv:2306.10209) sec 4.2: ZeRO-3 keeps its primary partition (16-bit weights, gradients and
the optimizer states sharded over all data-parallel ranks) and adds a secondary copy of the
16-bit weights sharded only within groups of ``zero_hpz_partition_size`` ranks (a node). The
forward all-gather still spans all ranks and refreshes the secondary copy; the backward
all-gather reads the secondary copy inside the group, so it never leaves the node. Cost: the
secondary partition, 2 B per parameter / group size on every GPU (the paper's "memory overhead
... of M/group bytes").

What this module offers: the memory of the secondary partition, and the group the backward
all-gather runs over, for the data-parallel traffic model.
"""

from __future__ import annotations

from simdist.spec.plan import ParallelPlan


def hpz_enabled(plan: ParallelPlan) -> bool:
    return plan.shards_params and plan.zero_hpz_partition_size > 1


def secondary_partition_bytes(params_per_gpu: float, plan: ParallelPlan) -> float:
    """The secondary 16-bit weight partition one GPU holds: its ``params_per_gpu`` (after tensor
    and pipeline parallelism, before ZeRO) over the hpZ group size."""
    if not hpz_enabled(plan):
        return 0.0
    return params_per_gpu * plan.element_bytes / plan.zero_hpz_partition_size


def backward_gather_group(plan: ParallelPlan) -> int:
    """Ranks the backward parameter all-gather spans: the hpZ group with hpZ, else the shard group
    (the forward all-gather always spans the shard group). Collective cost of the backward gather
    of P 16-bit parameters: an all-gather of P x 2 B over this many ranks, which stays inside a
    node when the group is a node."""
    return plan.zero_hpz_partition_size if hpz_enabled(plan) else plan.dp_shard
