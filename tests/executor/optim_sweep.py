"""torchrun script for test_executor_v11: every optimizer on every plan kind, in one process group.

``torchrun --nproc-per-node 4 optim_sweep.py OUT.json OPTIMIZERS STEPS``: for each plan in PLANS
(4 ranks each) it builds the DeviceMesh once and, for each optimizer, the parallel model with
executor.parallelize, runs STEPS steps with executor.train.train_step and records the global
loss of each step. One torchrun start for 8 plans x 4 optimizers instead of 32.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from executor.parallelize import build_mesh, build_parallel_model
from executor.train import DEFAULT_SEED, train_step
from simdist.spec.scenario import scenario_from_dict

CPU = torch.device("cpu")
PLANS: dict[str, dict[str, object]] = {
    "ddp": {"zero_stage": 0},
    "zero1": {"zero_stage": 1},
    "fsdp": {"zero_stage": 3},
    "hsdp": {"zero_stage": 2, "dp_shard": 2},
    "tp-ddp": {"tp": 2, "zero_stage": 0},
    "tp-fsdp": {"tp": 2, "zero_stage": 3},
    "pp-ddp": {"pp": 2, "zero_stage": 0},
    "pp-tp": {"pp": 2, "tp": 2},
}


def scenario(plan: dict[str, object], optimizer: str) -> object:
    return scenario_from_dict({
        "name": "sweep", "model": {"preset": "tiny"},
        "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 4},
        "plan": {"global_batch_size": 8, "micro_batch_size": 1, "precision": "fp32",
                 "optimizer": optimizer, **plan},
    })


def main() -> None:
    out, optimizers, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    timeout = timedelta(seconds=60)
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    results: dict[str, list[float]] = {}
    for name, plan in PLANS.items():
        mesh = None
        for opt in optimizers:
            sc = scenario(plan, opt)
            mesh = mesh or build_mesh(sc.plan, "cpu", "gloo", timeout)  # type: ignore[attr-defined]
            pm = build_parallel_model(sc.model, sc.plan, rank, mesh, CPU, DEFAULT_SEED)  # type: ignore[attr-defined]
            losses = [train_step(pm, sc.model, sc.plan, s, DEFAULT_SEED, CPU)  # type: ignore[attr-defined]
                      for s in range(steps)]
            mine = losses if pm.holds_loss and pm.coord.tp == 0 else None
            everyone: list[object] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            replicas = [r for r in everyone if r is not None]
            results[f"{name}/{opt}"] = [sum(r[i] for r in replicas) / len(replicas) for i in range(steps)]  # type: ignore[index]
    if rank == 0:
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(results, fh)
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
