"""Gradient compression as DDP communication hooks, and the bytes they put on the wire.

``plan.grad_compression.method`` registers one hook on every DDP model chunk
(``DistributedDataParallel.register_comm_hook``, Li et al. VLDB 2020 sec 3.2; the hook gets each
gradient bucket and must return a future of its average):

- ``fp16``: torch's ``default_hooks.fp16_compress_hook`` (cast, all-reduce, cast back);
- ``bf16``: :func:`bf16_hook`, written here: torch's ``bf16_compress_hook`` refuses to run
  without NCCL (torch 2.13, measured on CPU), while gloo all-reduces bf16 tensors;
- ``powersgd``: torch's ``powerSGD_hook`` (Vogels et al., "PowerSGD: Practical Low-Rank Gradient
  Compression for Distributed Optimization", NeurIPS 2019) at the plan's rank, with
  ``use_error_feedback`` as the plan says and ``start_powerSGD_iter=2``: torch's default (1000)
  runs plain all-reduce for the first 1000 steps, and 2 is the smallest it accepts with error
  feedback or warm start (DDP rebuilds its buckets after the first step);
- ``topk``: :func:`topk_hook`, written here: each rank sends the ``ratio`` x n entries of
  largest magnitude as (value, int32 index) pairs, all-gathered since sparse vectors do not sum
  in an all-reduce (Aji & Heafield, EMNLP 2017; Lin et al., "Deep Gradient Compression", ICLR
  2018), with error feedback: what was not sent is added to the next step's gradient (Seide et
  al. 2014; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019).

Bytes are counted where the hooks call ``torch.distributed.all_reduce`` /
``all_gather_into_tensor`` with the data-parallel group, as the size of the buffer (all-reduce:
the tensor, all-gather: the gathered output), the S of nccl-tests and of
``simdist.analytic.data_parallel.dp_traffic``. They are counted by wrapping those two functions (calls
with other groups pass straight through): PowerSGD issues its P and Q all-reduces from future
callbacks, which run on gloo's threads, where the thread-local TorchDispatchMode of
:class:`executor.measure.CollectiveCensus` does not see them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from simdist.spec.plan import ParallelPlan

POWERSGD_START_ITER = 2


class WireCounter:
    """Bytes and calls of the data-parallel group's collectives issued through the wrapped
    ``torch.distributed`` functions (thread-safe: hooks' callbacks run on other threads)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.bytes[kind] = self.bytes.get(kind, 0) + nbytes
            self.calls[kind] = self.calls.get(kind, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.bytes)

    def total(self) -> int:
        with self._lock:
            return sum(self.bytes.values())


_COUNTERS: list[WireCounter] = []
_INSTALLED = False


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _install_wrappers() -> None:
    """Wrap dist.all_reduce and dist.all_gather_into_tensor once per process (see the module
    docstring); a call whose group belongs to a registered WireCounter is counted there."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True

    def wrap(name: str, kind: str, size: Callable[..., int]) -> None:
        original = getattr(dist, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            for c in _COUNTERS:
                if group is not None and group is c.group:
                    c.add(kind, size(*args, **kwargs))
            return original(*args, **kwargs)

        counted.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(dist, name, counted)

    wrap("all_reduce", "all_reduce", lambda tensor, *a, **k: _nbytes(tensor))
    wrap("all_gather_into_tensor", "all_gather", lambda output, *a, **k: _nbytes(output))


# --- hooks written here --------------------------------------------------------------------------


class HookState:
    """State of the hooks written here: the group and, per bucket, the error-feedback residual."""

    def __init__(self, group: dist.ProcessGroup, ratio: float = 0.01, error_feedback: bool = True):
        self.group = group
        self.world = dist.get_world_size(group)
        self.ratio = ratio
        self.error_feedback = error_feedback
        self.residuals: dict[int, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:  # DDP may pickle hook states; groups do not pickle
        return {k: v for k, v in self.__dict__.items() if k != "group"}


def bf16_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in bfloat16: cast, divide by the world size, all-reduce, cast back (the
    shape of torch's fp16_compress_hook, with bf16's 8-bit exponent: no overflow to guard)."""
    compressed = bucket.buffer().to(torch.bfloat16).div_(state.world)
    fut = dist.all_reduce(compressed, group=state.group, async_op=True).get_future()  # type: ignore[union-attr]

    def decompress(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        out = bucket.buffer()
        out.copy_(f.value()[0])
        return out

    return fut.then(decompress)


def topk_count(n: int, ratio: float) -> int:
    """Entries sent of an n-entry bucket: ratio x n, at least 1 (simdist.analytic.compression.topk_elements)."""
    return max(1, min(n, round(ratio * n)))


def topk_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k sparsification with error feedback (see the module docstring).

    Each rank sends k values and their int32 indices in one fp32 message (the indices' bits
    reinterpreted), all-gathered into a (world x 2k) buffer; the average is the scatter-add of
    every rank's entries over the world size.
    """
    grad = bucket.buffer()
    n = grad.numel()
    k = topk_count(n, state.ratio)
    acc = grad.clone()
    residual = state.residuals.get(bucket.index())
    if state.error_feedback and residual is not None and residual.numel() == n:
        acc.add_(residual)
    idx = acc.abs().topk(k, sorted=False).indices
    values = acc[idx]
    if state.error_feedback:
        acc[idx] = 0.0
        state.residuals[bucket.index()] = acc  # what this rank did not send
    msg = torch.cat([values.float(), idx.to(torch.int32).view(torch.float32)])
    gathered = torch.empty(state.world * 2 * k, dtype=torch.float32, device=grad.device)
    fut = dist.all_gather_into_tensor(gathered, msg, group=state.group, async_op=True).get_future()  # type: ignore[union-attr]

    def decompress(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        f.wait()  # (gloo's future holds the input; the gathered rows are in ``gathered``)
        rows = gathered.view(state.world, 2 * k)
        vals = rows[:, :k].reshape(-1)
        where = rows[:, k:].contiguous().view(torch.int32).reshape(-1).long()
        out = bucket.buffer()
        out.zero_()
        out.index_add_(0, where, vals.to(out.dtype))
        return out.div_(state.world)

    return fut.then(decompress)


def _ddp_annotations(hook: Callable[..., Any]) -> None:
    """DDP compares a hook's annotations with the real types; under ``from __future__ import
    annotations`` they are strings, so put the types back."""
    hook.__annotations__.update(bucket=dist.GradBucket, state=HookState,
                                **{"return": torch.futures.Future[torch.Tensor]})


_ddp_annotations(bf16_hook)
_ddp_annotations(topk_hook)


# --- registration -----------------------------------------------------------------------------


class Compression:
    """Registers the plan's hook on DDP chunks and counts their wire bytes."""

    def __init__(self, plan: ParallelPlan, group: dist.ProcessGroup, seed: int):
        c = plan.grad_compression
        self.method = c.method
        self.group = group
        self.counter = WireCounter(group)
        _install_wrappers()
        _COUNTERS.append(self.counter)
        self.states: list[Any] = []
        self._plan, self._seed = plan, seed

    def _hook(self) -> tuple[Any, Callable[..., Any]]:
        c = self._plan.grad_compression
        if self.method == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            return self.group, default_hooks.fp16_compress_hook
        if self.method == "bf16":
            return HookState(self.group), bf16_hook
        if self.method == "topk":
            return HookState(self.group, c.ratio, c.error_feedback), topk_hook
        if self.method == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            state = psgd.PowerSGDState(process_group=self.group, matrix_approximation_rank=c.rank,
                                       start_powerSGD_iter=POWERSGD_START_ITER,
                                       use_error_feedback=c.error_feedback, warm_start=True,
                                       random_seed=self._seed)
            return state, psgd.powerSGD_hook
        raise ValueError(f"grad_compression {self.method!r} is not implemented by the executor")

    def register(self, chunk: nn.Module) -> None:
        if not hasattr(chunk, "register_comm_hook"):
            raise ValueError("gradient compression needs DDP (zero_stage 0 or 1)")
        state, hook = self._hook()
        self.states.append(state)
        chunk.register_comm_hook(state, hook)  # type: ignore[operator]
