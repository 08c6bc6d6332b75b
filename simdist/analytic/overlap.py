"""How much of a transfer hides behind the compute that runs beside it, in closed form.

Two patterns cover the data-parallel and host traffic of every plan: gradient buckets reduced
one after the other as backward fills them (:func:`bucketed_exposed`, and
:func:`chunked_buckets_exposed` when a pipeline stage's model chunks finish their backward at
different times), and pieces prefetched one ahead of the compute that needs them
(:func:`prefetch_exposed`). :func:`grad_buckets` says how many buckets a gradient buffer is
reduced in, by the framework's bucket rule (:func:`bucket_bytes`). A collective running beside
compute slows that compute down (:func:`contended_buckets`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from simdist.spec.frameworks import (
    DDP_BUCKET_BYTES,
    DEEPSPEED_REDUCE_BUCKET_ELEMENTS,
    MEGATRON_BUCKET_MIN_PARAMS,
    MEGATRON_BUCKET_PARAMS_PER_DP,
    framework_of,
)
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import CalibrationProfile, on_cpu


def bucket_bytes(plan: ParallelPlan) -> float:
    """Bytes of one gradient bucket: ``ddp_bucket_size`` when the scenario sets it, else the
    framework's rule (simdist/spec/frameworks.py):

    - Megatron-Core (megatron, nemo): max(40M, 1M x dp) parameters of the gradient buffer's type
      (DistributedDataParallelConfig.bucket_size; dp counts the context-parallel ranks, which
      reduce gradients together);
    - DeepSpeed: reduce_bucket_size = 5e8 elements;
    - PyTorch DDP and no framework: 25 MiB (bucket_cap_mb). FSDP and ZeRO-2/3 reduce per wrapped
      module (one layer) instead: data_parallel.dp_traffic."""
    if plan.ddp_bucket_size_bytes != DDP_BUCKET_BYTES:
        return plan.ddp_bucket_size_bytes
    rule = framework_of(plan.framework).bucket_rule
    if rule == "megatron":
        params = max(MEGATRON_BUCKET_MIN_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP * plan.dp * plan.cp)
        return float(params * plan.grad_buffer_bytes)
    if rule == "deepspeed":
        return float(DEEPSPEED_REDUCE_BUCKET_ELEMENTS * plan.grad_buffer_bytes)
    return plan.ddp_bucket_size_bytes


def bucket_rule_text(plan: ParallelPlan) -> str:
    """The bucket rule the plan runs under, in words (for the prediction's assumptions)."""
    if plan.ddp_bucket_size_bytes != DDP_BUCKET_BYTES:
        return "ddp_bucket_size as set"
    rule = framework_of(plan.framework).bucket_rule
    if rule == "megatron":
        return f"Megatron-Core max(40M, 1M x dp) parameters = {bucket_bytes(plan) / 2**20:.0f} MiB"
    if rule == "deepspeed":
        return f"DeepSpeed reduce_bucket_size 5e8 elements = {bucket_bytes(plan) / 2**20:.0f} MiB"
    return "PyTorch DDP 25 MiB"


def grad_buckets(nbytes: float, plan: ParallelPlan) -> int:
    """Buckets a gradient buffer of ``nbytes`` is reduced in: buckets of :func:`bucket_bytes`
    when the reduction overlaps backward, one collective over the contiguous buffer otherwise
    (Megatron-LM without --overlap-grad-reduce: Megatron-Core then sets no bucket size)."""
    if not plan.overlap_grad_reduce or nbytes <= 0:
        return 1
    return max(1, math.ceil(nbytes / bucket_bytes(plan)))


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


# Compute slows down while a collective runs beside it on the same GPU: NCCL's kernels occupy SMs
# (one CTA per channel) and HBM bandwidth. Lee et al., "Characterizing Compute-Communication
# Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv:2507.03114, 2025) measure an
# average compute slowdown of 18.9% (max 40.0%) under overlap, over GPT and LLaMA models on
# A100, H100, MI250 and MI210, against the same compute with no communication beside it.
OVERLAP_COMPUTE_SLOWDOWN = 0.189


def contended_buckets(t_bucket: float, n_buckets: int, t_overlap: float,
                      slowdown: float | None = None) -> tuple[float, float]:
    """(stretch, exposed) of gradient buckets reduced beside a backward pass of ``t_overlap``
    seconds (:func:`bucketed_exposed`) that runs ``1 + slowdown`` times slower while they do
    (default :data:`OVERLAP_COMPUTE_SLOWDOWN`).

    The collectives run beside the backward for n t_b minus what is exposed after it (at most
    the backward itself); the compute of that window takes ``slowdown`` times it longer
    (``stretch``), so the backward lasts t_overlap + stretch, its buckets are ready that much
    later, and what is exposed after it is :func:`bucketed_exposed` over the longer backward.
    Both engines stretch the backward by the same seconds (the closed form here, the event
    engine by lengthening the task that fills the buckets: simdist.sim.lowering)."""
    if n_buckets <= 0 or t_bucket <= 0:
        return 0.0, 0.0
    return _stretched(n_buckets * t_bucket, t_overlap, slowdown,
                      lambda t: bucketed_exposed(t_bucket, n_buckets, t))


def contended_prefetch(t_comm: float, chunks: int, t_compute: float,
                       slowdown: float | None = None) -> tuple[float, float]:
    """(stretch, exposed) of :func:`prefetch_exposed` when the compute runs ``1 + slowdown``
    times slower while the prefetched pieces run beside it: the pieces after the first run
    beside the compute for t minus what is exposed (at most the compute), that window of
    compute takes ``slowdown`` times it longer, and the longer compute hides more."""
    if t_comm <= 0:
        return 0.0, 0.0
    return _stretched(t_comm, t_compute, slowdown, lambda t: prefetch_exposed(t_comm, chunks, t))


def _stretched(t_comm: float, t_compute: float, slowdown: float | None,
               exposed: Callable[[float], float]) -> tuple[float, float]:
    """(stretch, exposed) of communication of ``t_comm`` seconds beside ``t_compute`` of
    compute, ``exposed(t)`` what it leaves exposed after t of compute: it runs beside the
    compute for t_comm minus what it exposes (at most the compute), which stretches that window
    of compute by ``slowdown``, and the longer compute hides more."""
    slowdown = OVERLAP_COMPUTE_SLOWDOWN if slowdown is None else slowdown
    stretch = slowdown * max(0.0, min(t_compute, t_comm - exposed(t_compute)))
    return stretch, exposed(t_compute + stretch)


def compute_slowdown(profile: CalibrationProfile | None) -> float:
    """The slowdown of compute beside a collective for a scenario priced with ``profile``: none
    under a profile measured with gloo on CPUs (no SMs are shared), else NCCL's
    (:data:`OVERLAP_COMPUTE_SLOWDOWN`)."""
    return 0.0 if on_cpu(profile) else OVERLAP_COMPUTE_SLOWDOWN


def chunked_buckets_exposed(t_bucket: float, groups: Sequence[tuple[float, float, int]]) -> float:
    """Exposed time after the backward ends of gradient buckets reduced one after the other
    (first in, first out), in groups that fill during different intervals: group j's
    ``buckets`` become ready evenly over [start, end] (seconds before the backward's end,
    ``start`` > ``end`` >= 0), listed in the order they fill.

    Megatron's interleaved schedule: each model chunk has its own buckets, reduced as that
    chunk's last backward produces them, and chunk c's last backward ends c*pp chunk-backwards
    before the stage's last one, so the reductions of the later chunks hide in the pipeline's
    cool-down (Megatron-Core DistributedDataParallel per model chunk, finish_grad_sync).

    A group's last bucket leaves the FIFO at max(previous + n t_b, first ready + n t_b,
    last ready + t_b) (its linear max sits at an end, as in :func:`bucketed_exposed`); one group
    ending at 0 reproduces :func:`bucketed_exposed`."""
    done = -math.inf
    for start, end, n in groups:
        if n <= 0:
            continue
        a, b = -start, -end
        done = max(done + n * t_bucket, a + (b - a) / n + n * t_bucket, b + t_bucket)
    return max(0.0, done) if done > -math.inf else 0.0


def prefetch_exposed(t_comm: float, chunks: int, t_compute: float) -> float:
    """Exposed time of communication split into ``chunks`` equal pieces prefetched one chunk
    ahead of the compute that needs them (ZeRO-3 / FSDP parameter all-gathers, Zhao et al. VLDB
    2023 sec 3.3.2): the first piece waits in full, the rest hides unless communication is
    longer than the compute: max(t/chunks, t - t_compute)."""
    if t_comm <= 0:
        return 0.0
    return max(t_comm / max(1, chunks), t_comm - t_compute)
