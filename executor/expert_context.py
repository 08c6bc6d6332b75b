"""Expert and context parallelism applied to one rank's model chunks (what
:func:`executor.parallelize.build_parallel_model` calls for a plan with ep > 1 or cp > 1).

- groups: every expert-parallel, expert-data-parallel, context-parallel and dp*cp group is
  created by every rank in one order (:mod:`executor.moe`, :mod:`executor.context`);
- each chunk keeps its local experts and leaves them out of DDP, its attention and embedding
  take their context-parallel forms;
- the data-parallel wrapper runs over dp*cp with context parallelism;
- the optimizer sums the expert gradients over the expert-data-parallel group before it steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from executor import context, moe
from simdist.spec.plan import ParallelPlan


@dataclass
class Extras:
    ep: moe.ExpertGroups | None = None
    edp: Any = None
    cp: tuple[Any, tuple[int, ...]] | None = None
    dp_cp: Any = None  # the data-parallel group with the context-parallel ranks


def make_groups(plan: ParallelPlan, rank: int) -> Extras | None:
    """Create the groups (collective: every rank calls it); None for a plan without ep or cp."""
    if plan.ep == 1 and plan.cp == 1:
        return None
    out = Extras()
    if plan.ep > 1:
        out.ep = moe.expert_groups(plan, rank, None)
        out.edp = moe.expert_data_group(plan, rank, None)
    if plan.cp > 1:
        out.cp, out.dp_cp = context.cp_group(plan, rank, None)
    return out


def prepare_chunk(chunk: nn.Module, plan: ParallelPlan, rank: int, extras: Extras | None) -> None:
    """Local experts (left out of DDP), context-parallel attention and embedding."""
    if extras is None:
        return
    if extras.ep is not None:
        moe.shard_experts(chunk, extras.ep)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(chunk, moe.expert_param_names(chunk))
    if extras.cp is not None:
        context.apply_context_parallel(chunk, plan, rank, *extras.cp)


def data_group(extras: Extras | None, default: Any) -> Any:
    """The group the DDP wrapper reduces over: dp*cp with context parallelism, else dp."""
    return extras.dp_cp if extras is not None and extras.dp_cp is not None else default


def after_build(optimizer: torch.optim.Optimizer, chunks: list[nn.Module], plan: ParallelPlan,
                extras: Extras | None) -> None:
    """Reduce the expert gradients before every optimizer step (expert parallelism)."""
    if extras is None or extras.ep is None:
        return
    modules = [getattr(c, "module", c) for c in chunks]
    optimizer.register_step_pre_hook(lambda _opt, _args, _kwargs: moe.sync_expert_grads(modules, extras.edp, plan.dp))
