"""The microbenchmark of DDP's reducer on the CPU: what a backward that synchronises the gradients
costs the training thread beyond one under ``no_sync`` (executor.bench runs it on every rank at
once; simdist.calibrate.fit.reducer_rates turns it into a cost per gradient tensor and per byte).

In a synchronising backward, DDP's C++ reducer runs on the thread that runs autograd (on the CPU,
the training thread): a hook per parameter marks its gradient ready and copies it into its
bucket, a full bucket is divided by the world size and its all-reduce launched, and at the end of
the backward the reduced buckets are copied back into the gradients (``gradient_as_bucket_view``
False, the default the executor keeps). Under ``no_sync`` the hooks return at once. Measured on the
2-core machine this was written on (2026-11-30, two ranks at once): 5.3 us a tensor and 0.17 ms a
MiB, about 0.5 ms a step for the tiny GPT's 69 tensors of 0.94 MB (a script of two DDP ranks of
that model measured 0.64-0.77 ms between its synchronising backward and the one before it, which
also added the gradients into the kept ones): the per-step cost a plain DDP plan's fit otherwise
spreads over its ops.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# (layers, width) of the DDP-wrapped stacks of Linear layers timed: many small tensors, then few
# large ones (2 tensors a layer, 1 MiB each at 512 wide), which tell the cost per tensor from the
# cost per byte
REDUCER_STACKS = ((32, 16), (4, 512))


def bench_reducer(quick: bool) -> list[dict[str, Any]]:
    """Rows of (gradient tensors, gradient bytes, the synchronising backward's extra CPU seconds:
    the median over alternating pairs, each backward on gradients set to None, as a step's first
    backward meets them)."""
    rows = []
    for layers, width in REDUCER_STACKS:
        torch.manual_seed(0)
        ddp = DistributedDataParallel(nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]))
        x = torch.randn(8, width)
        for _ in range(3):  # the reducer rebuilds its buckets after the first synchronising backward
            _backward(ddp, x, sync=True)
        pairs = 10 if quick else 60
        extra = [_backward(ddp, x, sync=True) - _backward(ddp, x, sync=False) for _ in range(pairs)]
        params = list(ddp.parameters())
        rows.append({"tensors": len(params), "bytes": sum(p.numel() * p.element_size() for p in params),
                     "extra_s": statistics.median(extra)})
    return rows


def _backward(ddp: DistributedDataParallel, x: torch.Tensor, sync: bool) -> float:
    """CPU seconds of one backward of ``ddp`` on ``x``, its gradients set to None before."""
    ddp.zero_grad(set_to_none=True)
    with contextlib.nullcontext() if sync else ddp.no_sync():
        loss = ddp(x).sum()
        t = time.thread_time()
        loss.backward()
        return time.thread_time() - t
