"""The plan's performance knobs, done with PyTorch's own mechanisms (executor.fields lists them).

- ``flash_attention``: scaled_dot_product_attention's backend. True allows only the fused
  kernels (FlashAttention, memory-efficient, cuDNN; on the CPU PyTorch's flash kernel), which
  keep no s x s score matrix; False forces the math backend, which materialises and saves the
  scores as unfused attention does (``torch.nn.attention.sdpa_kernel``).
- ``overlap_grad_reduce`` (DDP, ZeRO-1): True is DDP's own bucketed all-reduce, launched as each
  bucket's gradients are ready during backward (Li et al. VLDB 2020 sec 3.2.3). False holds
  every bucket until the last is ready and then all-reduces them one after another
  (:class:`DeferredAllReduce`, a DDP communication hook): the sync after backward, not beside it.
- ``overlap_param_gather`` (FSDP2): True makes each block's all-gather asynchronous and issues
  the next block's in forward as the current one starts (``set_modules_to_forward_prefetch``;
  backward prefetches the previous block by default), so gathering overlaps compute, as
  torchtitan's explicit prefetching does; False gathers each block when it is needed and
  prefetches nothing (on the CPU FSDP2's own default, whose all-gathers are synchronous there).
- ``zero3_fetch: module``: DeepSpeed ZeRO-3 gathers each submodule's parameters with its own
  collective; the executor shards every linear layer, norm and embedding as its own FSDP2 unit
  inside the block units, which makes as many gathers.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from simdist.spec.plan import ParallelPlan


def attention_kernels(plan: ParallelPlan) -> contextlib.AbstractContextManager[None]:
    """The SDPA backends ``flash_attention`` allows, for the whole step."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if plan.flash_attention:
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                            SDPBackend.CUDNN_ATTENTION])
    return sdpa_kernel([SDPBackend.MATH])


class DeferredAllReduce:
    """DDP communication hook: all-reduce every gradient bucket once the last one is ready.

    DDP launches buckets in index order and waits for every hook's future when backward ends, so
    holding the futures until the last bucket (``GradBucket.is_last``) moves the whole sync after
    the backward compute; each bucket is then averaged with one all-reduce, as DDP would."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.pending: list[tuple[torch.Tensor, torch.futures.Future]] = []

    def __call__(self, state: Any, bucket: Any) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self.pending.append((bucket.buffer(), fut))
        if bucket.is_last():
            pending, self.pending = self.pending, []
            size = dist.get_world_size(self.group)
            for buf, f in pending:
                buf.div_(size)
                dist.all_reduce(buf, group=self.group)
                f.set_result(buf)
        return fut


def apply_grad_reduce_overlap(ddp: nn.Module, plan: ParallelPlan, group: dist.ProcessGroup) -> None:
    """``overlap_grad_reduce: false`` on a DDP module (True is DDP's default)."""
    if not plan.overlap_grad_reduce and not plan.grad_compression.enabled:
        ddp.register_comm_hook(None, DeferredAllReduce(group))


def shard_submodules(chunk: nn.Module, mesh: Any, reshard_after_forward: bool) -> None:
    """``zero3_fetch: module``: every leaf module with parameters is its own FSDP2 unit."""
    from torch.distributed.fsdp import fully_shard

    for module in list(chunk.modules()):
        if module is chunk or not any(True for _ in module.parameters(recurse=False)):
            continue
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward)


def apply_param_gather_overlap(chunk: nn.Module, plan: ParallelPlan) -> None:
    """``overlap_param_gather`` on an FSDP2-sharded chunk (see the module docstring)."""
    from torch.distributed.fsdp import FSDPModule

    blocks = [b for b in getattr(chunk, "layers", {}).values() if isinstance(b, FSDPModule)]
    if not isinstance(chunk, FSDPModule):
        return
    # asynchronous all-gathers on the compute stream: on CUDA this also turns off FSDP2's implicit
    # prefetching on side streams, so that only the explicit prefetch below overlaps
    chunk._set_unshard_async_op(True)
    if plan.overlap_param_gather:
        for current, following in itertools.pairwise(blocks):
            current.set_modules_to_forward_prefetch([following])
    else:
        for block in [*blocks, chunk]:
            # an explicit list replaces the default prefetch of the previous block; a unit
            # "prefetching" itself is a no-op, since it is already gathered when it runs
            block.set_modules_to_backward_prefetch([block])
