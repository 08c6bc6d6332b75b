"""How much of a transfer hides behind the compute that runs beside it, in closed form.

Two patterns cover the data-parallel and host traffic of every plan: gradient buckets reduced
one after the other as backward fills them (:func:`bucketed_exposed`), and pieces prefetched one
ahead of the compute that needs them (:func:`prefetch_exposed`). :func:`grad_buckets` says how
many buckets a gradient buffer is reduced in.
"""

from __future__ import annotations

import math

from simdist.spec.plan import ParallelPlan


def grad_buckets(nbytes: float, plan: ParallelPlan) -> int:
    """Buckets a gradient buffer of ``nbytes`` is reduced in: ddp_bucket_size buckets when the
    reduction overlaps backward, one collective over the contiguous buffer otherwise (Megatron-LM
    without --overlap-grad-reduce)."""
    if not plan.overlap_grad_reduce or nbytes <= 0:
        return 1
    return max(1, math.ceil(nbytes / plan.ddp_bucket_size_bytes))


def bucketed_exposed(t_bucket: float, n_buckets: int, t_overlap: float, overlap: bool = True) -> float:
    """Exposed time of ``n_buckets`` gradient buckets of ``t_bucket`` seconds each, reduced one
    after the other as a backward pass of ``t_overlap`` seconds fills them at an even rate
    (PyTorch DDP, Li et al. VLDB 2020 sec 3.2.3; Horovod tensor fusion, Sergeev & Del Balso 2018).

    Bucket i is ready at (i+1) T/n and the comm stream runs them in order, so the last one ends
    at max_i [(i+1) T/n + (n-i) t_b]; the maximum of this linear function sits at an end:
      exposed = max(t_b, n t_b - T (n-1)/n).
    Smaller buckets start earlier but pay the collective latency more often; the last bucket
    is always exposed. Without overlap the buckets run after backward: n t_b.
    """
    if n_buckets <= 0 or t_bucket <= 0:
        return 0.0
    if not overlap:
        return n_buckets * t_bucket
    return max(t_bucket, n_buckets * t_bucket - t_overlap * (n_buckets - 1) / n_buckets)


def prefetch_exposed(t_comm: float, chunks: int, t_compute: float) -> float:
    """Exposed time of communication split into ``chunks`` equal pieces prefetched one chunk
    ahead of the compute that needs them (ZeRO-3 / FSDP parameter all-gathers, Zhao et al. VLDB
    2023 sec 3.3.2): the first piece waits in full, the rest hides unless communication is
    longer than the compute: max(t/chunks, t - t_compute)."""
    if t_comm <= 0:
        return 0.0
    return max(t_comm / max(1, chunks), t_comm - t_compute)
