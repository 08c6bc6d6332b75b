"""The torchrun worker: ``python -m executor.worker --scenario FILE --run-dir DIR ...``.

Every rank builds the full model from the seed, keeps and parallelises its part, runs
``warmup`` + ``steps`` timed steps and one more instrumented step (collective census, saved-
activation and gathered-parameter peaks, model-state bytes), then sends what it saw to rank 0
(``gather_object``), which writes ``result.json`` in the run directory atomically. The launcher
(:mod:`executor.launch`) turns that into the measurement file.

Process life follows /work/shared/TORCH-CPU.md: the process group gets a small timeout (its
sub-groups too, see :func:`executor.parallelize.build_mesh`), and every worker ends with
flush + ``destroy_process_group`` + ``os._exit`` (a plain interpreter exit sometimes aborts
after destroy_process_group on gloo, and torchrun then reports the job failed).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.faults import (
    Fault,
    classify_error,
    failure_path,
    heartbeat_path,
    parse_fault,
    pid_path,
    result_path,
    write_json_atomic,
)
from executor.measure import CollectiveCensus, StepProbe
from executor.parallelize import build_mesh, build_parallel_model
from executor.train import DEFAULT_SEED, train_step
from simdist.spec.plan import rank_coord
from simdist.spec.scenario import Scenario, load_scenario

GIB = 2**30


class Worker:
    """One rank's run; ``phase`` and ``step`` say where it is for heartbeats and failure reports."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.run_dir = Path(args.run_dir)
        self.fault: Fault | None = parse_fault(args.fault) if args.fault else None
        self.step = -1
        self.phase = "start"
        pid_path(self.run_dir, self.rank).write_text(str(os.getpid()))
        self.beat("start")

    def beat(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        if step is not None:
            self.step = step
        write_json_atomic(heartbeat_path(self.run_dir, self.rank),
                          {"rank": self.rank, "step": self.step, "phase": phase, "time": time.time()})

    def log(self, msg: str) -> None:
        print(f"[rank {self.rank}] {msg}", file=sys.stderr, flush=True)

    # --- setup ----------------------------------------------------------------------------

    def device_and_backend(self) -> tuple[torch.device, str]:
        want = self.args.device
        if want == "cuda" or (want == "auto" and torch.cuda.is_available()
                              and torch.cuda.device_count() > self.local_rank):
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank), "nccl"
        return torch.device("cpu"), "gloo"

    def run(self) -> None:
        scenario = load_scenario(self.args.scenario)
        plan, m = scenario.plan, scenario.model
        device, backend = self.device_and_backend()
        timeout = timedelta(seconds=self.args.pg_timeout)
        self.beat("init_process_group")
        if device.type == "cuda":
            dist.init_process_group(backend, timeout=timeout, device_id=device)
        else:
            dist.init_process_group(backend, timeout=timeout)
        self.beat("build")
        mesh = build_mesh(plan, device.type, backend, timeout)
        pm = build_parallel_model(m, plan, self.rank, mesh, device, self.args.seed)
        probe = StepProbe(pm, cuda=device.type == "cuda")
        warmup, steps = self.args.warmup, self.args.steps
        losses: list[float | None] = []
        step_walls: list[float] = []
        phases: list[dict[str, float | None]] = []
        census = CollectiveCensus()
        total = warmup + steps + 1
        for step in range(total):
            measured = warmup <= step < warmup + steps
            instrumented = step == total - 1
            self.beat("step", step)
            self.maybe_inject_fault(step)
            if measured:
                self.barrier(device)  # every rank starts a measured step together
            with probe.step(instrument=instrumented):
                if instrumented:
                    with census:
                        loss = train_step(pm, m, plan, step, self.args.seed, device, probe)
                else:
                    loss = train_step(pm, m, plan, step, self.args.seed, device, probe)
            if measured:
                losses.append(loss)
                step_walls.append(probe.times.wall)
                phases.append(probe.phases())
            self.progress(step, warmup, steps, loss, probe.times.wall)
        self.beat("report")
        saved = probe.saved.peak if probe.saved else 0
        gathered = probe.gathered.peak if probe.gathered else 0
        mine = {
            "rank": self.rank,
            "coord": list(rank_coord(self.rank, plan)),
            "losses": losses if pm.holds_loss else None,
            "step_walls": step_walls,
            "phases": phases,
            "model_state": {**(probe.model_state or {}), "params_gathered": gathered},
            "activation_bytes": saved,
            "collectives": census.result(),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "data_parallel": pm.data_parallel,
        }
        gathered_all: list[Any] = [None] * self.world if self.rank == 0 else []
        dist.gather_object(mine, gathered_all if self.rank == 0 else None, dst=0)
        if self.rank == 0:
            result = assemble(scenario, gathered_all, device, backend, self.args)
            write_json_atomic(result_path(self.run_dir), result)
        self.beat("done")

    def barrier(self, device: torch.device) -> None:
        if device.type == "cuda":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()

    def maybe_inject_fault(self, step: int) -> None:
        f = self.fault
        if f is None or f.rank != self.rank or f.step != step:
            return
        if f.kind == "crash":
            raise RuntimeError(f"injected crash (--fault {f})")
        self.beat("hang")
        self.log(f"hanging at step {step} (--fault {f})")
        while True:
            time.sleep(3600)

    def progress(self, step: int, warmup: int, steps: int, loss: float | None, wall: float) -> None:
        if self.rank != self.world - 1:  # the last rank always holds a loss (last stage)
            return
        if step < warmup:
            label = f"warm-up {step + 1}/{warmup}"
        elif step < warmup + steps:
            label = f"step {step - warmup + 1}/{steps}"
        else:
            label = "instrumented step"
        shown = "-" if loss is None else f"{loss:.4f}"
        self.log(f"{label}  loss {shown}  {wall:.3f} s")

    def report_failure(self, exc: BaseException) -> None:
        message = f"{exc}".strip().splitlines()[0][:500] if str(exc).strip() else ""
        write_json_atomic(failure_path(self.run_dir, self.rank), {
            "rank": self.rank, "step": self.step, "phase": self.phase,
            "error": type(exc).__name__, "message": message, "kind": classify_error(str(exc)),
        })


# --- rank 0: the measurement ----------------------------------------------------------------


def _median_index(values: list[float]) -> int:
    """Index of the median (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def assemble(scenario: Scenario, ranks: list[dict[str, Any]], device: torch.device, backend: str,
             args: argparse.Namespace) -> dict[str, Any]:
    """The contract's measurement (plus extras) from every rank's report."""
    plan = scenario.plan
    ranks = sorted(ranks, key=lambda r: r["rank"])
    steps = args.steps
    # a step lasts until its slowest rank finishes (all start together after a barrier)
    step_times = [max(r["step_walls"][i] for r in ranks) for i in range(steps)]
    # one loss per data-parallel replica: the last stage's tp-rank 0 (tp ranks hold the same)
    replicas = [r for r in ranks if r["losses"] is not None and r["coord"][3] == 0]
    losses = [sum(r["losses"][i] for r in replicas) / len(replicas) for i in range(steps)]
    mid = _median_index(step_times)
    phases: dict[str, float | None] = {}
    for key in ("forward", "backward", "optimizer", "comm", "other"):
        vals = [r["phases"][mid][key] for r in ranks]
        phases[key] = None if any(v is None for v in vals) else sum(vals) / len(vals)
    per_rank = []
    for r in ranks:
        ms = r["model_state"]
        state = ms.get("total", 0)
        if r["cuda_peak_bytes"] is not None:
            peak = r["cuda_peak_bytes"]
        else:  # CPU: states + gathered parameters + saved activations at their peak
            peak = state + ms.get("params_gathered", 0) + r["activation_bytes"]
        per_rank.append({"rank": r["rank"], "model_state_gib": state / GIB,
                         "activations_gib": r["activation_bytes"] / GIB, "peak_gib": peak / GIB})
    collectives: dict[str, dict[str, int]] = {}
    for r in ranks:
        for kind, c in r["collectives"].items():
            entry = collectives.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += c["count"]
            entry["bytes"] += c["bytes"]
    return {
        "name": scenario.name,
        "scenario_hash": scenario.hash(),
        "world_size": len(ranks),
        "device": device.type,
        "backend": backend,
        "torch_version": torch.__version__.split("+")[0],
        "steps": steps,
        "step_time_s": statistics.median(step_times),
        "step_times_s": step_times,
        "losses": losses,
        "phases_s": phases,
        "memory": {"peak_gib": max(p["peak_gib"] for p in per_rank), "per_rank": per_rank},
        # extras
        "warmup_steps": args.warmup,
        "seed": args.seed,
        "plan": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp,
                 "virtual_pipeline_stages": plan.virtual_pipeline_stages, "schedule": plan.schedule,
                 "zero_stage": plan.zero_stage, "sequence_parallel": plan.sequence_parallel,
                 "recompute": plan.recompute, "precision": plan.precision,
                 "micro_batch_size": plan.micro_batch_size, "global_batch_size": plan.global_batch_size,
                 "num_microbatches": plan.num_microbatches, "data_parallel": ranks[0]["data_parallel"]},
        "model_state_bytes": [{"rank": r["rank"], **r["model_state"]} for r in ranks],
        "activation_bytes": [r["activation_bytes"] for r in ranks],
        "collectives": collectives,
        "collectives_per_rank": [{"rank": r["rank"], **r["collectives"]} for r in ranks],
        "phases_per_rank_s": [{"rank": r["rank"], **r["phases"][mid]} for r in ranks],
        "max_rss_gib_per_rank": [r["max_rss_bytes"] / GIB for r in ranks],
        "environment": environment(device),
    }


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_num_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


# --- entry ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m executor.worker", description=__doc__)
    p.add_argument("--scenario", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--pg-timeout", type=float, default=30.0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--fault", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    worker = Worker(args)
    code = 0
    try:
        worker.run()
    except BaseException as exc:  # report, then leave: torchrun stops the other ranks
        code = 1
        worker.report_failure(exc)
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized() and code == 0:
        dist.destroy_process_group()
    os._exit(code)


if __name__ == "__main__":
    main()
