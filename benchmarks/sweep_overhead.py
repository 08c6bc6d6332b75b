"""What scheduling costs a sweep: the same points run serially in this process, on local
processes and (where installed) on a local Ray instance, and the share of the workers' time
that was not point work.

    python benchmarks/sweep_overhead.py [--points N] [--workers W] [--mode predict|search]

Prints, per backend: the wall time, the chunk size the rule chose (simdist.sweep.backends),
and ``overhead = 1 - serial work / (workers x wall)`` (scheduling, pickling, starting the pool
and idling at the end; on a machine shared with other work it also counts their CPU time, so
it is an upper bound; the scheduling share from the measured cost of an empty task is the
figure the 5% bound is about). Ray is started on the loopback address without its dashboard; its
start-up is not counted. It also times empty Ray tasks: the per-task cost the rule assumes
(RAY_TASK_OVERHEAD_S).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import yaml

from simdist.sweep import SweepStore, load_sweep, run_sweep
from simdist.sweep.backends import RAY_TASK_OVERHEAD_S
from simdist.sweep.points import Job, evaluate_point

BASE = {"name": "bench", "model": {"preset": "llama3-8b"}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "plan": {"tp": 1, "pp": 1, "zero_stage": 1, "global_batch_size": 1024, "micro_batch_size": 1}}
SEARCH = {"max_micro_batch": 2, "zero_stages": [1], "recompute": ["selective"], "schedules": ["1f1b"]}


def sweep_file(folder: Path, points: int, mode: str) -> Path:
    nodes = [1, 2, 4, 8, 16, 32, 64, 128]
    bandwidths = [f"{b} Gb/s" for b in range(50, 50 * (points // len(nodes) + 1) + 1, 50)]
    (folder / "base.yaml").write_text(yaml.safe_dump(BASE))
    doc = {"name": "bench", "base": "base.yaml", "mode": mode,
           "axes": [{"field": "cluster.inter_node.bandwidth", "values": bandwidths[: max(1, points // len(nodes))]},
                    {"field": "cluster.num_nodes", "values": nodes}]}
    if mode == "search":
        doc["search"] = SEARCH
    (folder / "sweep.yaml").write_text(yaml.safe_dump(doc))
    return folder / "sweep.yaml"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=400)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mode", default="predict", choices=("predict", "search"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = load_sweep(sweep_file(folder, args.points, args.mode))
        job, pts = Job.of(spec), list(spec.points())
        t0 = time.perf_counter()
        for p in pts:
            evaluate_point(job, p)
        serial = time.perf_counter() - t0
        print(f"{len(pts)} points ({args.mode}), serial in this process: {serial:.2f} s "
              f"({serial / len(pts) * 1e3:.1f} ms a point)")
        out = run_sweep(spec, SweepStore(folder / "local.db"), workers=args.workers)
        report("local processes", out, serial, args.workers)
        try:
            import ray
        except ImportError:
            print("ray: not installed (pip install 'simdist[cluster]')")
            return
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        ray.init(num_cpus=args.workers, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
        try:
            empty = ray.remote(num_cpus=1)(lambda: None)
            ray.get([empty.remote() for _ in range(20)])  # warm the workers
            t0 = time.perf_counter()
            ray.get([empty.remote() for _ in range(200)])
            per_task = (time.perf_counter() - t0) / 200 * args.workers
            print(f"ray: an empty task costs {per_task * 1e3:.2f} ms of a worker (the rule assumes "
                  f"{RAY_TASK_OVERHEAD_S * 1e3:.0f} ms)")
            out = run_sweep(spec, SweepStore(folder / "ray.db"), backend="ray")
            report("ray (local, loopback)", out, serial, out.workers)
            print(f"ray: scheduling share from the measured task cost: {per_task:.4f} s / ({out.chunk_size} "
                  f"points x {serial / len(pts):.4f} s) = {per_task / (out.chunk_size * serial / len(pts)):.2%}")
        finally:
            ray.shutdown()


def report(name: str, out, serial: float, workers: int) -> None:
    overhead = 1 - serial / (workers * out.seconds)
    print(f"{name}: {out.seconds:.2f} s on {workers} workers, chunks of {out.chunk_size}; "
          f"overhead {overhead:.1%} of the workers' time")


if __name__ == "__main__":
    main()
