"""Mixture-of-experts layers and expert parallelism in the executor.

The layer (the block :mod:`simdist.analytic.moe` prices): a router (hidden -> experts), a
softmax (or sigmoid, renormalised over the chosen ones) top-k gate, routed experts of
``moe_ffn_hidden_size`` and shared experts of num_shared_experts x moe_ffn_hidden_size. Every
token's k expert outputs are summed with its gate weights. Routing is dropless, so a run
computes exactly what one process computes, whatever the plan.

Expert parallelism (Megatron-Core's layout, :mod:`simdist.spec.groups`): expert-parallel rank e
of a stage holds experts e*E/ep .. (e+1)*E/ep - 1 (the routed weights are stacked per expert,
``experts_w1`` [E, h, n_in*f] and ``experts_w2`` [E, f, h]; a rank keeps its slice after every
rank has drawn the full model from the seed). A forward:

1. route the rank's tokens, copy each once per chosen expert and sort the copies by expert;
2. all-gather the per-expert counts over the expert-parallel group (small metadata);
3. ``all_to_all_single`` the copies to their experts' ranks (dispatch);
4. run each local expert on the copies it received from every source;
5. ``all_to_all_single`` the outputs back (combine) and sum each token's k outputs.

Both all-to-alls are autograd functions whose backward is the reverse all-to-all. Expert
weights are left out of DDP (``_set_params_and_buffers_to_ignore_for_model``); their gradients
are summed over the expert-data-parallel group and divided by dp before the optimizer steps
(the loss is the mean over the dp replicas, and each expert already holds the gradient of every
token its expert-parallel group routed to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from simdist.spec.groups import group_ranks
from simdist.spec.layers import layer_kind
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; backward sends the gradients back the other way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


@dataclass
class ExpertGroups:
    """This rank's expert-parallel group (its ranks in order) and index in it."""

    group: Any
    size: int
    index: int


class SharedExperts(nn.Module):
    """The shared experts: one dense FFN of num_shared_experts x moe_ffn_hidden_size."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.swiglu = m.mlp == "swiglu"
        h, f = m.hidden_size, m.num_shared_experts * m.moe_ffn_hidden_size
        if self.swiglu:
            self.gate, self.up, self.down = nn.Linear(h, f, bias=m.bias), nn.Linear(h, f, bias=m.bias), \
                nn.Linear(f, h, bias=m.bias)
        else:
            self.fc1, self.fc2 = nn.Linear(h, f, bias=m.bias), nn.Linear(f, h, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """A mixture-of-experts FFN (see the module docstring); ``ep`` set by :func:`shard_experts`."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.spec = m
        h, f, e = m.hidden_size, m.moe_ffn_hidden_size, m.num_experts
        self.n_in = 2 if m.mlp == "swiglu" else 1
        self.router = nn.Linear(h, e, bias=m.bias)
        self.experts_w1 = nn.Parameter(torch.empty(e, h, self.n_in * f))
        self.experts_w2 = nn.Parameter(torch.empty(e, f, h))
        self.experts_b1 = nn.Parameter(torch.zeros(e, self.n_in * f)) if m.bias else None
        self.experts_b2 = nn.Parameter(torch.zeros(e, h)) if m.bias else None
        self.shared = SharedExperts(m) if m.num_shared_experts else None
        self.ep: ExpertGroups | None = None
        self.first = 0  # global index of the first local expert

    @property
    def local_experts(self) -> int:
        return self.experts_w1.shape[0]

    def _expert(self, j: int, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.experts_w1[j]
        if self.experts_b1 is not None:
            y = y + self.experts_b1[j]
        if self.n_in == 2:
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y)
        y = y @ self.experts_w2[j]
        return y + self.experts_b2[j] if self.experts_b2 is not None else y

    def _run_local(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows grouped by source rank, then by local expert (``counts`` [sources, local]): each
        local expert on its rows, the outputs in the same layout.

        Every local expert runs, on zero rows when none were routed to it: the output then still
        depends on ``rows`` and on every expert weight, so the backward of the dispatch
        all-to-all (a collective of the whole expert-parallel group) runs on this rank whatever
        the routing, and every expert weight gets a gradient (zero) for the expert-data-parallel
        all-reduce. Skipping an empty expert left a rank whose experts received nothing out of
        the dispatch's backward while its peers waited in it (the EP+PP deadlock: a pipeline
        stage's shape inference runs on uninitialised activations, which route every token to
        one rank)."""
        sources, n = counts.shape
        starts = torch.zeros(sources * n, dtype=torch.long)
        flat = counts.reshape(-1)
        starts[1:] = torch.cumsum(flat, 0)[:-1]
        out = rows.new_zeros(rows.shape[0], self.spec.hidden_size)
        for j in range(n):
            idx = torch.cat([torch.empty(0, dtype=torch.long)]
                            + [torch.arange(int(starts[s * n + j]), int(starts[s * n + j] + counts[s, j]))
                               for s in range(sources)])
            out = out.index_copy(0, idx, self._expert(j, rows[idx]))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.spec
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = self.router(flat)
        k = m.experts_per_token
        if m.router == "sigmoid":
            w, idx = torch.sigmoid(logits).topk(k, dim=-1)
            w = w / w.sum(dim=-1, keepdim=True)
        else:
            w, idx = torch.softmax(logits, dim=-1).topk(k, dim=-1)
        expert = idx.reshape(-1)
        order = torch.argsort(expert, stable=True)
        rows = flat[order // k]
        counts = torch.bincount(expert, minlength=m.num_experts)
        if self.ep is None or self.ep.size == 1:
            back = self._run_local(rows, counts.view(1, -1))
        else:
            ep = self.ep
            everyone = [torch.zeros_like(counts) for _ in range(ep.size)]
            dist.all_gather(everyone, counts, group=ep.group)  # metadata: counts of every source
            table = torch.stack(everyone).view(ep.size, ep.size, -1)  # [source, dest, local expert]
            send = table[ep.index].sum(-1).tolist()
            mine = table[:, ep.index, :]  # what every source sends me, per local expert
            recv = mine.sum(-1).tolist()
            received = _AllToAll.apply(rows, send, recv, ep.group)
            done = self._run_local(received, mine)
            back = _AllToAll.apply(done, recv, send, ep.group)
        copies = back.new_empty(back.shape).index_copy(0, order, back)
        y = (copies.view(-1, k, shape[-1]) * w.unsqueeze(-1).to(copies.dtype)).sum(1)
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.view(shape)


def build_ffn(m: ModelSpec, index: int) -> nn.Module | None:
    """The FFN of layer ``index`` when it is a mixture of experts, else None (a dense MLP)."""
    return MoE(m) if layer_kind(m, index).moe else None


# --- expert parallelism -------------------------------------------------------------------


def expert_groups(plan: ParallelPlan, rank: int, timeout: Any) -> ExpertGroups | None:
    """Create every expert-parallel group (every rank calls new_group for each, in one order)
    and return this rank's."""
    if plan.ep == 1:
        return None
    mine = None
    seen: set[tuple[int, ...]] = set()
    for r in range(plan.world_size):
        ranks = group_ranks(plan, "ep", r)
        if ranks in seen:
            continue
        seen.add(ranks)
        g = dist.new_group(list(ranks), timeout=timeout)
        if rank in ranks:
            mine = ExpertGroups(g, len(ranks), ranks.index(rank))
    return mine


def expert_data_group(plan: ParallelPlan, rank: int, timeout: Any) -> Any:
    """This rank's expert-data-parallel group (created for every rank, in one order)."""
    mine = None
    seen: set[tuple[int, ...]] = set()
    for r in range(plan.world_size):
        ranks = group_ranks(plan, "edp", r)
        if ranks in seen:
            continue
        seen.add(ranks)
        g = dist.new_group(list(ranks), timeout=timeout) if len(ranks) > 1 else None
        if rank in ranks:
            mine = g
    return mine


def expert_param_names(module: nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters() if ".mlp.experts_" in f".{n}" or n.startswith("mlp.experts_")]


def shard_experts(module: nn.Module, groups: ExpertGroups) -> None:
    """Keep this rank's slice of every MoE layer's routed experts (after the full init)."""
    for sub in module.modules():
        if isinstance(sub, MoE):
            per = sub.spec.num_experts // groups.size
            lo = groups.index * per
            sub.ep, sub.first = groups, lo
            for name in ("experts_w1", "experts_w2", "experts_b1", "experts_b2"):
                p = getattr(sub, name)
                if p is not None:
                    setattr(sub, name, nn.Parameter(p.detach()[lo:lo + per].clone()))


def sync_expert_grads(modules: list[nn.Module], group: Any, dp: int) -> None:
    """Sum the expert gradients over the expert-data-parallel group in one all-reduce of one
    flat buffer (a bucket, as Megatron-Core's DDP keeps the expert gradients in their own buffer
    and DDP buckets the dense ones; simdist.analytic.dp_groups prices it so), divide by dp."""
    grads = [p.grad for module in modules for name, p in module.named_parameters()
             if "experts_" in name and p.grad is not None]
    if group is not None and grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    for g in grads:
        g.div_(dp)
