"""Microbenchmarks, run by torchrun on every rank at once (so compute and communication see
the same contention as a real run): GEMMs from tiny to model-sized, attention, memory-bound
ops, and collectives over message sizes at every available group size. Rank 0 writes the raw
timings as JSON (atomically); simdist.calibrate.fit turns them into a profile. Started by
`simdist calibrate` through the executor's launcher (:func:`executor.launch.microbenchmarks`);
imports torch.

    torchrun --standalone --nproc-per-node N -m executor.bench --run-dir DIR --out FILE [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from executor.faults import pid_path
from simdist.spec.files import write_json_atomic

GEMM_SHAPES = [(m, n, k) for m, n, k in [
    (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 256, 256), (512, 512, 512),
    (512, 768, 256), (512, 1024, 256), (1024, 1024, 1024), (1024, 3072, 768), (2048, 2048, 2048),
]]
ATTENTION = [(b, h, s, d) for b, h, s, d in [(1, 4, 64, 16), (2, 4, 128, 32), (4, 8, 128, 32),
                                              (4, 8, 256, 64), (8, 8, 512, 64)]]
MEMORY_SIZES = [2**p for p in range(12, 28, 2)]  # 4 KiB .. 64 MiB per tensor
MESSAGE_SIZES = [2**p for p in range(12, 29, 2)]  # 4 KiB .. 256 MiB


def _time(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _reps(seconds_each: float, budget: float) -> int:
    return max(3, min(20, int(budget / max(seconds_each, 1e-6))))


def bench_gemm(dtype: torch.dtype, quick: bool) -> list[dict[str, Any]]:
    out = []
    for m, n, k in GEMM_SHAPES[: 6 if quick else None]:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        once = _time(lambda a=a, b=b: a @ b, 1, 1)
        t = _time(lambda a=a, b=b: a @ b, _reps(once, 0.3))
        out.append({"m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "seconds": t})
    return out


def bench_attention(dtype: torch.dtype, quick: bool) -> list[dict[str, Any]]:
    out = []
    for b, h, s, d in ATTENTION[: 3 if quick else None]:
        q, k, v = (torch.randn(b, h, s, d, dtype=dtype, requires_grad=True) for _ in range(3))

        def fwd_bwd(q=q, k=k, v=v):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        once = _time(fwd_bwd, 1, 1)
        t = _time(fwd_bwd, _reps(once, 0.3))
        # full-square FLOPs, forward 4*b*s*s*h*d, backward 2x (simdist's attention convention)
        flops = 3 * 4.0 * b * s * s * h * d
        out.append({"b": b, "heads": h, "s": s, "d": d, "flops": flops, "seconds": t})
    return out


def bench_memory(dtype: torch.dtype, quick: bool) -> list[dict[str, Any]]:
    out = []
    esize = torch.tensor([], dtype=dtype).element_size()
    for nbytes in MEMORY_SIZES[: 6 if quick else None]:
        x, y = torch.randn(nbytes // esize, dtype=dtype), torch.randn(nbytes // esize, dtype=dtype)
        once = _time(lambda x=x, y=y: x.add_(y), 1, 1)
        t = _time(lambda x=x, y=y: x.add_(y), _reps(once, 0.2))
        out.append({"bytes": 3.0 * nbytes, "seconds": t})  # read x, read y, write x
    return out


def bench_collectives(quick: bool, progress) -> list[dict[str, Any]]:
    world, rank = dist.get_world_size(), dist.get_rank()
    out: list[dict[str, Any]] = []
    sizes = MESSAGE_SIZES[: 6 if quick else None]
    for n in range(2, world + 1):
        group = dist.new_group(list(range(n)))
        if rank >= n:
            dist.barrier()
            continue
        for kind in ("allreduce", "allgather", "reducescatter", "sendrecv"):
            for nbytes in sizes:
                numel = max(n, nbytes // 4 // n * n)
                buf = torch.ones(numel)
                shard = torch.ones(numel // n)

                def op(kind=kind, buf=buf, shard=shard, group=group):
                    if kind == "allreduce":
                        dist.all_reduce(buf, group=group)
                    elif kind == "allgather":
                        dist.all_gather_into_tensor(buf, shard, group=group)
                    elif kind == "reducescatter":
                        try:
                            dist.reduce_scatter_tensor(shard, buf, group=group)
                        except (RuntimeError, NotImplementedError, ValueError):
                            dist.all_reduce(buf, group=group)  # gloo: a full-size all-reduce
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
                t_all = torch.tensor([t])
                dist.all_reduce(t_all, op=dist.ReduceOp.MAX, group=group)
                out.append({"kind": kind, "ranks": n, "bytes": float(numel * 4), "seconds": float(t_all)})
                if progress is not None:
                    progress.update(1)
        dist.barrier()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--run-dir", help="the launcher's run directory: each rank records its pid there")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller sizes (tests)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args(argv)
    if args.run_dir:  # the launcher kills a worker left behind by its pid
        pid_path(args.run_dir, int(os.environ["RANK"])).write_text(str(os.getpid()))
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    progress = None
    if rank == 0:
        from tqdm import tqdm

        n_coll = sum(4 if n == 2 else 3 for n in range(2, world + 1)) * len(MESSAGE_SIZES[: 6 if args.quick else None])
        progress = tqdm(total=3 + n_coll, desc="microbenchmarks", file=sys.stderr, leave=False)
    result: dict[str, Any] = {"world_size": world, "threads": torch.get_num_threads(), "dtype": args.dtype,
                              "torch_version": torch.__version__, "device": "cpu"}
    for name, fn in (("gemm", bench_gemm), ("attention", bench_attention), ("memory", bench_memory)):
        result[name] = fn(dtype, args.quick)
        if progress is not None:
            progress.update(1)
    result["collectives"] = bench_collectives(args.quick, progress)
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
