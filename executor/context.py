"""Context parallelism in the executor: the sequence split over ``cp`` ranks, attention that
sees every earlier token, the three methods of ``plan.cp_method``.

Layout (as Megatron-Core / Transformer Engine and torchtitan balance causal work): the sequence
is cut into 2*cp chunks and rank i holds chunks i and 2cp-1-i (:func:`positions`); its tokens,
targets, learned positions and rotary angles are those of its chunks. Attention compares
positions, not indices, so the causal mask stays exact across the split:

- ``ring``: the K/V blocks travel around the cp ranks by point-to-point send/receive, cp-1
  steps; each rank ends with every block and attends to the earlier positions among them
  (backward sends the gradients around the other way);
- ``allgather``: one all-gather of K and V over the cp ranks (Llama 3); backward all-reduces
  their gradients and keeps this rank's part;
- ``ulysses``: an all-to-all turns sequence shards into head shards (each rank attends over the
  whole sequence for heads/cp heads) and another turns the output back.

The dense gradients are averaged over dp*cp (the loss of a replica is the mean of its cp ranks'
equal-sized shards): DDP runs over the ``dp_cp`` group of :mod:`simdist.spec.groups`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.model import Attention, Embedding, apply_rope, rope_cos_sin
from simdist.spec.groups import group_ranks
from simdist.spec.plan import ParallelPlan, rank_coord


def positions(seq_length: int, cp: int, rank: int) -> torch.Tensor:
    """Token positions of cp rank ``rank``: chunks rank and 2cp-1-rank of 2cp."""
    c = seq_length // (2 * cp)
    a, b = rank * c, (2 * cp - 1 - rank) * c
    return torch.cat([torch.arange(a, a + c), torch.arange(b, b + c)])


def shard(plan: ParallelPlan, cp_rank: int, inputs: torch.Tensor, targets: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's part of a (batch, seq) batch (unchanged with cp = 1)."""
    if plan.cp == 1:
        return inputs, targets
    pos = positions(inputs.shape[1], plan.cp, cp_rank)
    return inputs[:, pos].contiguous(), targets[:, pos].contiguous()


class _Rotate(torch.autograd.Function):
    """Send to the next cp rank, receive from the previous one; backward the other way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, nxt: int, prev: int, group: Any) -> torch.Tensor:
        ctx.nxt, ctx.prev, ctx.group = nxt, prev, group
        return _exchange(x, nxt, prev, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchange(grad, ctx.prev, ctx.nxt, ctx.group), None, None, None


def _exchange(x: torch.Tensor, dst: int, src: int, group: Any) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, dst, group), dist.P2POp(dist.irecv, out, src, group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out


class _Gather(torch.autograd.Function):
    """All-gather along dim 2 (the sequence of (b, heads, s, d)); backward keeps this rank's part
    of the all-reduced gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cp: int, index: int, group: Any) -> torch.Tensor:
        ctx.cp, ctx.index, ctx.group, ctx.s = cp, index, group, x.shape[2]
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(cp)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[:, :, ctx.index * ctx.s:(ctx.index + 1) * ctx.s].contiguous(), None, None, None


class _HeadsToSequence(torch.autograd.Function):
    """Ulysses: (b, heads, s/cp, d) on each rank -> (b, heads/cp, s, d); backward the reverse."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
        ctx.cp, ctx.group = cp, group
        return _swap(x, cp, group, to_sequence=True)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _swap(grad, ctx.cp, ctx.group, to_sequence=False), None, None


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cp: int, group: Any) -> torch.Tensor:
        ctx.cp, ctx.group = cp, group
        return _swap(x, cp, group, to_sequence=False)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _swap(grad, ctx.cp, ctx.group, to_sequence=True), None, None


def _swap(x: torch.Tensor, cp: int, group: Any, to_sequence: bool) -> torch.Tensor:
    b, h, s, d = x.shape
    if to_sequence:  # send head group j to rank j; receive every rank's sequence part of mine
        send = x.reshape(b, cp, h // cp, s, d).permute(1, 0, 2, 3, 4).contiguous()
        out = torch.empty_like(send)
        dist.all_to_all_single(out, send, group=group)
        return out.permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)
    send = x.reshape(b, h, cp, s // cp, d).permute(2, 0, 1, 3, 4).contiguous()
    out = torch.empty_like(send)
    dist.all_to_all_single(out, send, group=group)
    return out.permute(1, 0, 2, 3, 4).reshape(b, cp * h, s // cp, d)


class ContextParallelAttention(Attention):
    """Attention over this rank's chunks with keys and values from every cp rank."""

    cp: int
    cp_index: int
    cp_group: Any
    cp_ranks: tuple[int, ...]
    method: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        total = s * self.cp
        mine = positions(total, self.cp, self.cp_index)
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.rope:
            cos, sin = rope_cos_sin(total, self.head_dim, q.device)
            q, k = apply_rope(q, cos[mine], sin[mine]), apply_rope(k, cos[mine], sin[mine])
        group = q.shape[1] // k.shape[1]
        every = torch.cat([positions(total, self.cp, j) for j in range(self.cp)])
        if self.method == "ulysses":  # GQA: every query head's K/V before the heads are split
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            q, k, v = (_HeadsToSequence.apply(t, self.cp, self.cp_group) for t in (q, k, v))
            mask = every.unsqueeze(1) >= every.unsqueeze(0)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out = _SequenceToHeads.apply(out, self.cp, self.cp_group)
        else:
            if self.method == "allgather":
                keys, values = _Gather.apply(k, self.cp, self.cp_index, self.cp_group), \
                    _Gather.apply(v, self.cp, self.cp_index, self.cp_group)
            else:  # ring: cp-1 rotations; block from rank index-j arrives at step j
                ks, vs, kb, vb = [k] * self.cp, [v] * self.cp, k, v
                nxt = self.cp_ranks[(self.cp_index + 1) % self.cp]
                prev = self.cp_ranks[(self.cp_index - 1) % self.cp]
                for j in range(1, self.cp):
                    kb, vb = _Rotate.apply(kb, nxt, prev, self.cp_group), _Rotate.apply(vb, nxt, prev, self.cp_group)
                    src = (self.cp_index - j) % self.cp
                    ks[src], vs[src] = kb, vb
                ks[self.cp_index], vs[self.cp_index] = k, v
                keys, values = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
            if group > 1:  # GQA: the kv heads travel, each query head's copy is made here
                keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            mask = mine.unsqueeze(1) >= every.unsqueeze(0)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class ContextParallelEmbedding(Embedding):
    """Token embedding plus the learned positions of this rank's chunks."""

    cp: int
    cp_index: int

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            mine = positions(tokens.shape[1] * self.cp, self.cp, self.cp_index).to(tokens.device)
            x = x + self.pos(mine).unsqueeze(0)
        return x


def cp_group(plan: ParallelPlan, rank: int, timeout: Any) -> tuple[Any, tuple[int, ...]]:
    """Create every cp group and every dp*cp group (each rank, one order); return this rank's
    cp group with its ranks and its dp*cp group."""
    mine: dict[str, Any] = {}
    for axis in ("cp", "dp_cp"):
        seen: set[tuple[int, ...]] = set()
        for r in range(plan.world_size):
            ranks = group_ranks(plan, axis, r)
            if ranks in seen:
                continue
            seen.add(ranks)
            g = dist.new_group(list(ranks), timeout=timeout)
            if rank in ranks:
                mine[axis] = (g, ranks)
    return mine["cp"], mine["dp_cp"][0]


def apply_context_parallel(module: Any, plan: ParallelPlan, rank: int, group: Any, ranks: tuple[int, ...]) -> None:
    """Turn a chunk's attention and embedding modules into their context-parallel forms."""
    index = rank_coord(rank, plan).cp
    for sub in module.modules():
        if type(sub) is Attention:
            sub.__class__ = ContextParallelAttention
            sub.cp, sub.cp_index, sub.cp_group, sub.cp_ranks, sub.method = plan.cp, index, group, ranks, plan.cp_method
        elif type(sub) is Embedding:
            sub.__class__ = ContextParallelEmbedding
            sub.cp, sub.cp_index = plan.cp, index
