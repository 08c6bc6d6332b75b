"""Microbenchmarks, run by torchrun on every rank at once (so compute and communication see
the same contention as a real run): GEMMs from tiny to model-sized, attention, memory-bound
ops (in and out of the cache), pointwise ops that compute, top-k selection, DDP's reducer
(executor.bench_reducer) and collectives over message sizes at every available group size.
Rank 0 writes the raw timings as JSON (atomically); simdist.calibrate.fit turns them into a
profile. Started by `simdist calibrate` through the executor's launcher
(:func:`executor.launch.microbenchmarks`); imports torch.

    torchrun --standalone --nproc-per-node N -m executor.bench --run-dir DIR --out FILE [--quick]

The device is chosen as for a run (:mod:`executor.devices`): on a node with a GPU per rank the
GEMMs run in bf16 on CUDA over LLM-shaped (m, n, k) (:data:`GPU_GEMM_SHAPES`; the fit keeps the
efficiency of each shape) and the collectives on NCCL up to 1 GiB, timed between
``torch.cuda.synchronize`` calls (nccl-tests' method: the bus bandwidth of each size follows);
on the CPU, fp32 GEMMs (and the same GEMMs under bf16 autocast, ``gemm_bf16``) and gloo. The JSON also records the cores the ranks could use
(``os.sched_getaffinity``) and how many ranks ran at once, which the profile keeps.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executor.bench_reducer import bench_reducer
from executor.devices import choose
from executor.faults import pid_path
from executor.hostload import cores, last_level_cache_bytes, scheduler_tick_s
from simdist.spec.files import write_json_atomic

GEMM_SHAPES = [(m, n, k) for m, n, k in [  # from a tiny plan's 32 tokens x width 64 up
    (32, 64, 64), (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 256, 256), (512, 512, 512),
    (512, 768, 256), (512, 1024, 256), (1024, 1024, 1024), (1024, 3072, 768), (2048, 2048, 2048),
]]
ATTENTION = [(b, h, s, d) for b, h, s, d in [(1, 4, 32, 16), (1, 4, 64, 16), (2, 4, 128, 32), (4, 8, 128, 32),
                                              (4, 8, 256, 64), (8, 8, 512, 64)]]
MEMORY_SIZES = [2**p for p in range(12, 28, 2)]  # 4 KiB .. 64 MiB per tensor
COLD_SIZES = [2**p for p in range(20, 27)]  # 1 .. 64 MiB per tensor: an FSDP2 module's parameters
EVICT_BYTES = 128 * 2**20  # passed over between copies: four times the largest L3 of the machines in view (32 MiB)
# a layer's GEMM with its weight in the cache and out of it: the local GPT's projections (weights of
# 0.25-2 MiB at 256 tokens) and a wider one (4 MiB), fp32 (simdist.analytic.cache_residency)
COLD_GEMM_SHAPES = [(256, 256, 256), (256, 1024, 256), (256, 256, 1024), (512, 768, 256), (256, 2048, 256),
                    (512, 1024, 1024)]
SELECT_SIZES = [2**p for p in range(14, 24, 2)]  # 16 Ki .. 4 Mi fp32 entries: a tiny model's bucket to DDP's 25 MiB
# the shares top-k compression keeps that it times: two where torch heap-selects (k <= n/64), one where
# it runs nth_element (5%: scenarios/tiny-compress-topk.yaml); simdist.spec.selection
SELECT_SHARES = (0.001, 0.01, 0.05)
MESSAGE_SIZES = [2**p for p in range(12, 29, 2)]  # 4 KiB .. 256 MiB
# GPU: the projections of 7B-70B decoders per micro-batch of 1-8 x 4096 tokens (tokens x hidden
# -> hidden, 3x hidden for fused QKV, the MLP's 3.5x), and square sizes for the peak
GPU_GEMM_SHAPES = [(m, n, k) for m in (1024, 4096, 16384) for n, k in
                   ((4096, 4096), (12288, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192))]
GPU_GEMM_SHAPES += [(s, s, s) for s in (512, 1024, 2048, 8192)]
GPU_MESSAGE_SIZES = [2**p for p in range(12, 31, 2)]  # 4 KiB .. 1 GiB


_SYNC = None  # torch.cuda.synchronize on a GPU
# torch 2.13's names (the *_tensor ones warn that they are deprecated), the old ones before
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _time(fn, reps: int, warmup: int = 2, cpu_clock: bool = False) -> float:
    """Median seconds of ``fn``: wall time, or with ``cpu_clock`` the calling thread's CPU time.

    Compute on the CPU is timed by CPU time (each rank computes on its one thread): a wall clock
    also counts the time another process held the core, which grows with the op (measured on a
    shared 2-core host: GEMMs of 0.2 GFLOP and more fell to 40% of the small ones' rate by the
    wall clock, while their CPU-time rate stayed within 5% from 64^3 to 1024^3). Collectives
    keep the wall clock: waiting for the peer is part of them."""
    sync = _SYNC or (lambda: None)
    clock = time.thread_time if cpu_clock and _SYNC is None else time.perf_counter
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        sync()
        times.append(clock() - t0)
    return statistics.median(times)


def _reps(seconds_each: float, budget: float) -> int:
    return max(3, min(20, int(budget / max(seconds_each, 1e-6))))


def bench_gemm(dtype: torch.dtype, quick: bool, device: str = "cpu") -> list[dict[str, Any]]:
    out = []
    shapes = GPU_GEMM_SHAPES if device == "cuda" else GEMM_SHAPES
    for m, n, k in shapes[: 6 if quick else None]:
        a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
        once = _time(lambda a=a, b=b: a @ b, 1, 1, cpu_clock=True)
        t = _time(lambda a=a, b=b: a @ b, _reps(once, 0.3), cpu_clock=True)
        out.append({"m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "seconds": t})
    return out


BF16_MAX_FLOPS = 2.2e9  # the CPU's bf16 GEMMs run 10-100x slower than fp32 without AVX512-BF16/AMX: bounded


def bench_gemm_autocast(quick: bool) -> list[dict[str, Any]]:
    """The CPU's GEMMs under bf16 autocast (what a bf16 plan runs: fp32 weights cast to bf16,
    the product in bf16), on the fp32 shapes up to :data:`BF16_MAX_FLOPS`. Without AVX512-BF16
    or AMX the bf16 kernel is a slow path (measured on the 2-core EPYC this was written on:
    11x fp32's time at 32x64x64, 10-30x from 64^3 to 512^3), which the profile must know."""
    out = []
    for m, n, k in [s for s in GEMM_SHAPES[: 6 if quick else None] if 2.0 * s[0] * s[1] * s[2] <= BF16_MAX_FLOPS]:
        x, w = torch.randn(m, k), torch.randn(n, k)

        def op(x=x, w=w):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return F.linear(x, w)

        once = _time(op, 1, 1, cpu_clock=True)
        out.append({"m": m, "n": n, "k": k, "flops": 2.0 * m * n * k,
                    "seconds": _time(op, _reps(once, 0.3), cpu_clock=True)})
    return out


def bench_attention(dtype: torch.dtype, quick: bool, device: str = "cpu") -> list[dict[str, Any]]:
    out = []
    for b, h, s, d in ATTENTION[: 3 if quick else None]:
        q, k, v = (torch.randn(b, h, s, d, dtype=dtype, device=device, requires_grad=True) for _ in range(3))

        def fwd_bwd(q=q, k=k, v=v):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        def call(q=q):  # starting a backward pass at all (autograd's engine): once per step in training
            q.sum().backward()

        once = _time(fwd_bwd, 1, 1, cpu_clock=True)
        t = _time(fwd_bwd, _reps(once, 0.3), cpu_clock=True)
        t = max(t / 2, t - _time(call, _reps(once, 0.3), cpu_clock=True))  # measured on CPU: 54 us of 164 at s=32
        # full-square FLOPs, forward 4*b*s*s*h*d, backward 2x (simdist's attention convention)
        flops = 3 * 4.0 * b * s * s * h * d
        out.append({"b": b, "heads": h, "s": s, "d": d, "flops": flops, "seconds": t})
    return out


def bench_memory(dtype: torch.dtype, quick: bool, device: str = "cpu") -> list[dict[str, Any]]:
    out = []
    esize = torch.tensor([], dtype=dtype).element_size()
    for nbytes in MEMORY_SIZES[: 6 if quick else None]:
        x, y = (torch.randn(nbytes // esize, dtype=dtype, device=device) for _ in range(2))
        once = _time(lambda x=x, y=y: x.add_(y), 1, 1, cpu_clock=True)
        t = _time(lambda x=x, y=y: x.add_(y), _reps(once, 0.2), cpu_clock=True)
        out.append({"bytes": 3.0 * nbytes, "seconds": t})  # read x, read y, write x
    return out


POINTWISE_ELEMENTS = (4096, 32768, 262144)  # a tiny plan's norm to the local GPT's GELU, 256 wide
POINTWISE_WIDTH = 256  # the last dimension: a norm's hidden size, the loss's vocabulary


def _pointwise(op: str, rows: int) -> Any:
    """The forward of one pointwise op as the executor's model runs it (executor.model), on ``rows``
    rows of :data:`POINTWISE_WIDTH` that autograd tracks."""
    x = torch.randn(rows, POINTWISE_WIDTH, requires_grad=True)
    if op == "swiglu":
        up = torch.randn(rows, POINTWISE_WIDTH, requires_grad=True)
        return lambda: F.silu(x) * up
    if op in ("layernorm", "rmsnorm"):
        norm = nn.LayerNorm(POINTWISE_WIDTH) if op == "layernorm" else nn.RMSNorm(POINTWISE_WIDTH, eps=1e-5)
        return lambda: norm(x)
    if op == "cross_entropy":
        target = torch.randint(0, POINTWISE_WIDTH, (rows,))
        return lambda: F.cross_entropy(x, target)
    return lambda: F.gelu(x)


def bench_pointwise(quick: bool) -> list[dict[str, Any]]:
    """The CPU's pointwise ops that compute per element (GELU, SwiGLU, the norms, the loss), forward
    and backward (forward + backward less forward), by size: one thread evaluates erf, exp and the
    norms' reductions at 0.3-1 ns per element on the 2-core EPYC this was written on, several times
    the memory-bound price of their bytes. The fit keeps the time per element (simdist.calibrate.fit)."""
    out = []
    for op in ("gelu", "swiglu", "layernorm", "rmsnorm", "cross_entropy"):
        for n in POINTWISE_ELEMENTS[: 2 if quick else None]:
            forward = _pointwise(op, n // POINTWISE_WIDTH)

            def both(forward=forward):
                y = forward()
                y.backward(torch.ones_like(y))

            reps = _reps(_time(both, 1, 1, cpu_clock=True), 0.1)
            fwd = _time(forward, reps, cpu_clock=True)
            out += [{"op": f"{op} fwd", "elements": float(n), "seconds": fwd},
                    {"op": f"{op} bwd", "elements": float(n), "seconds": max(0.0, _time(both, reps, cpu_clock=True) - fwd)}]
    return out


def bench_cold_copy(quick: bool) -> list[dict[str, Any]]:
    """Copies of data out of the cache (the CPU's FSDP2 copies, simdist.analytic.fsdp2): each copy
    timed after a pass over :data:`EVICT_BYTES`, which evicts its operands; the in-cache passes of
    :func:`bench_memory` run several times faster at the same sizes. Every rank copies at once, as
    FSDP2's ranks do in a step: they share the memory bandwidth. Unsynchronised, a rank's copies
    met whatever the others ran then, and the curve moved 2x between calibrations (13-16 GB/s in
    one, 26-36 in the next, 2026-11-29)."""
    evict = torch.zeros(EVICT_BYTES // 4)
    out = []
    for nbytes in COLD_SIZES[: 3 if quick else None]:
        src, dst = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
        if dist.is_initialized():
            dist.barrier()
        times = []
        for _ in range(3 if quick else 7):
            evict.add_(1.0)
            t0 = time.thread_time()
            dst.copy_(src)
            times.append(time.thread_time() - t0)
        out.append({"bytes": 2.0 * nbytes, "seconds": statistics.median(times)})  # read src, write dst
    return out


def bench_cold_gemm(quick: bool) -> list[dict[str, Any]]:
    """Each of :data:`COLD_GEMM_SHAPES` timed with its weight in the cache (just used) and out of
    it (after a pass over :data:`EVICT_BYTES`; the input is read again first, as a layer's input
    is fresh from the op before it), in alternation. Every rank times each GEMM at once, after a
    barrier: they share the memory bandwidth and the last-level cache, as a run's ranks do, and
    one rank's eviction pass must not overlap another's GEMM (unsynchronised, the 2-rank medians
    of 9 moved by +-0.5 ms); each pair's difference cancels what drifts slower than a pair.
    Measured on the 2-core EPYC this was written on: 0.03-0.21 ms more a GEMM, growing with the
    weight's size to 2 MiB (the core's L2), 5-30% of the GEMM."""
    evict = torch.zeros(EVICT_BYTES // 4)
    barrier = dist.barrier if dist.is_initialized() else (lambda: None)

    def timed(x: torch.Tensor, w: torch.Tensor) -> float:
        x.add_(0.0)
        barrier()
        t0 = time.thread_time()
        x @ w
        return time.thread_time() - t0

    out = []
    for m, n, k in COLD_GEMM_SHAPES[: 3 if quick else None]:
        x, w = torch.randn(m, k), torch.randn(k, n)
        hot, cold = [], []
        for _ in range(3 if quick else 21):
            hot.append(timed(x, w))
            evict.add_(1.0)
            cold.append(timed(x, w))
        out.append({"m": m, "n": n, "k": k, "weight_bytes": 4.0 * k * n, "hot_s": statistics.median(hot),
                    "cold_s": statistics.median(cold),  # the fetch: the median of each pair's difference
                    "fetch_s": statistics.median(c - h for h, c in zip(hot, cold, strict=True))})
    return out


def bench_select(quick: bool, device: str = "cpu") -> list[dict[str, Any]]:
    """Top-k of a gradient-like bucket's magnitudes (what the top-k compression hook runs,
    executor.compression), by size and share kept (:data:`SELECT_SHARES`: torch's CPU kernel
    heap-selects small shares and runs ``std::nth_element`` on larger ones, simdist.spec.selection).
    The calls take turns over several tensors, as steps bring new gradients: the selection takes a
    time that depends on the data, 1.2 to 2.4 ms for one 235,000-entry tensor of normal
    magnitudes against another on the 2-core guest simdist was calibrated on (5% kept); the
    median over several stands for a step's."""
    out = []
    for n, share in itertools.product(SELECT_SIZES[: 3 if quick else None], SELECT_SHARES):
        data = itertools.cycle([torch.randn(n, device=device).abs() for _ in range(8)])
        k = max(1, round(share * n))

        def op(data=data, k=k):
            next(data).topk(k, sorted=False)

        once = _time(op, 1, 1, cpu_clock=True)
        out.append({"elements": float(n), "k": k, "seconds": _time(op, _reps(once, 0.2), cpu_clock=True)})
    return out


def bench_collectives(quick: bool, progress, device: str = "cpu") -> list[dict[str, Any]]:
    world, rank = dist.get_world_size(), dist.get_rank()
    out: list[dict[str, Any]] = []
    sizes = (GPU_MESSAGE_SIZES if device == "cuda" else MESSAGE_SIZES)[: 6 if quick else None]
    for n in range(2, world + 1):
        group = dist.new_group(list(range(n)))
        if rank >= n:
            dist.barrier()
            continue
        for kind in ("allreduce", "allgather", "reducescatter", "sendrecv", "alltoall"):
            for nbytes in sizes:
                numel = max(n, nbytes // 4 // n * n)
                buf = torch.ones(numel, device=device)
                shard = torch.ones(numel // n, device=device)

                def op(kind=kind, buf=buf, shard=shard, group=group):
                    if kind == "allreduce":
                        dist.all_reduce(buf, group=group)
                    elif kind == "allgather":
                        _ALL_GATHER(buf, shard, group=group)
                    elif kind == "reducescatter":
                        try:
                            _REDUCE_SCATTER(shard, buf, group=group)
                        except (RuntimeError, NotImplementedError, ValueError):
                            dist.all_reduce(buf, group=group)  # gloo: a full-size all-reduce
                    elif kind == "alltoall":  # S bytes per rank, S/n to every peer (expert dispatch)
                        dist.all_to_all_single(torch.empty_like(buf), buf, group=group)
                    elif rank in (0, 1):  # sendrecv between ranks 0 and 1
                        if rank == 0:
                            dist.send(buf, 1)
                            dist.recv(buf, 1)
                        else:
                            dist.recv(buf, 0)
                            dist.send(buf, 0)

                if kind == "sendrecv" and n != 2:
                    continue
                reps = 3 if nbytes >= 2**26 else 7
                dist.barrier(group=group)
                t = _time(op, reps, 1)
                if kind == "sendrecv":
                    t /= 2  # a round trip is two transfers
                t_all = torch.tensor([t], device=device)
                dist.all_reduce(t_all, op=dist.ReduceOp.MAX, group=group)
                out.append({"kind": kind, "ranks": n, "bytes": float(numel * 4), "seconds": float(t_all)})
                if progress is not None:
                    progress.update(1)
        dist.barrier()
    return out


def main(argv: list[str] | None = None) -> int:
    global _SYNC
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--run-dir", help="the launcher's run directory: each rank records its pid there")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller sizes (tests)")
    ap.add_argument("--dtype", default=None, choices=("fp32", "bf16"), help="default: bf16 on a GPU, fp32 on the CPU")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = ap.parse_args(argv)
    rank = int(os.environ["RANK"])
    if args.run_dir:  # the launcher kills a worker left behind by its pid
        pid_path(args.run_dir, rank).write_text(str(os.getpid()))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device, backend = choose(args.device, gpus, local_rank, local_world)
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        _SYNC = torch.cuda.synchronize
        dist.init_process_group(backend, timeout=timedelta(seconds=120), device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=120))
    world = dist.get_world_size()
    dtype_name = args.dtype or ("bf16" if device == "cuda" else "fp32")
    dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
    progress = None
    if rank == 0:
        from tqdm import tqdm

        sizes = len((GPU_MESSAGE_SIZES if device == "cuda" else MESSAGE_SIZES)[: 6 if args.quick else None])
        n_coll = sum(5 if n == 2 else 4 for n in range(2, world + 1)) * sizes
        progress = tqdm(total=4 + n_coll, desc="microbenchmarks", file=sys.stderr, leave=False)
    result: dict[str, Any] = {"world_size": world, "threads": torch.get_num_threads(), "dtype": dtype_name,
                              "torch_version": torch.__version__, "device": device, "backend": backend,
                              "cores": cores(), "local_ranks": local_world,
                              "gpu": torch.cuda.get_device_name(local_rank) if device == "cuda" else None}
    for name, fn in (("gemm", bench_gemm), ("attention", bench_attention), ("memory", bench_memory)):
        result[name] = fn(dtype, args.quick, device)
        if progress is not None:
            progress.update(1)
    result["select"] = bench_select(args.quick, device)
    if device == "cpu":
        result["memory_cold"] = bench_cold_copy(args.quick)
        result["pointwise"] = bench_pointwise(args.quick)
        result["cold_gemm"] = bench_cold_gemm(args.quick)
        result["reducer"] = bench_reducer(args.quick) if world > 1 else []
        result["llc_bytes"] = last_level_cache_bytes()
        if rank == 0:  # the tick that delays a pipeline's sends (simdist.analytic.transport_wake)
            result["scheduler_tick_s"] = scheduler_tick_s()
    if device == "cpu" and dtype == torch.float32:
        result["gemm_bf16"] = bench_gemm_autocast(args.quick)
    if progress is not None:
        progress.update(1)
    result["collectives"] = bench_collectives(args.quick, progress, device)
    if rank == 0:
        progress.close()
        write_json_atomic(args.out, result)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
