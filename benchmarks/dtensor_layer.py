"""What one tensor-parallel layer costs the training thread, as the executor lays it out on DTensors.

Run with two ranks (each on a core of its own, gloo):

    torchrun --nproc-per-node 2 benchmarks/dtensor_layer.py tiny-2d-tp-dp tiny-2d-tp-dp:sp tiny-llama-tp

For each bundled scenario named (``:sp`` turns sequence parallelism on, ``:mbN`` sets the
micro-batch size to N: ``local-tp-fit:sp:mb4``), the executor's model with
1 and with 3 layers is split by ``executor.parallelize.apply_tensor_parallel`` and trained on one
micro-batch of the scenario's shape; the difference of the training thread's CPU time
(``time.thread_time``, forward and backward) over 2 is one layer's cost per micro-batch, its ops
on DTensors and on local tensors together. simdist.analytic.passes.runs_on_dtensors cites it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STEPS = 10


def layer_cost_s(name: str, sequence_parallel: bool | None, mesh, micro_batch_size: int | None = None) -> float:
    from executor.model import build_model
    from executor.parallelize import apply_tensor_parallel
    from simdist.spec.scenario import load_scenario

    sc = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    plan = sc.plan if sequence_parallel is None else dataclasses.replace(sc.plan, sequence_parallel=sequence_parallel)
    plan = plan if micro_batch_size is None else dataclasses.replace(plan, micro_batch_size=micro_batch_size)
    cpu = {}
    for layers in (1, 3):
        model = build_model(dataclasses.replace(sc.model, num_layers=layers), seed=0, recompute=plan.recompute)
        apply_tensor_parallel(model, mesh, plan.sequence_parallel)
        tokens = torch.randint(0, sc.model.vocab_size, (plan.micro_batch_size, sc.model.seq_length))

        for _ in range(3):
            step(model, tokens)
        t0 = time.thread_time()
        for _ in range(STEPS):
            step(model, tokens)
        cpu[layers] = (time.thread_time() - t0) / STEPS
    return (cpu[3] - cpu[1]) / 2


def step(model: torch.nn.Module, tokens: torch.Tensor) -> None:
    out = model(tokens)
    out = out.full_tensor() if isinstance(out, DTensor) else out
    out.float().pow(2).mean().backward()


def parse(arg: str) -> tuple[str, bool | None, int | None]:
    """NAME[:sp][:mbN] -> (scenario name, sequence parallelism or None for the scenario's,
    micro-batch size or None for the scenario's)."""
    name, *flags = arg.split(":")
    sequence_parallel, micro_batch_size = None, None
    for flag in flags:
        if flag == "sp":
            sequence_parallel = True
        elif flag.startswith("mb") and flag[2:].isdigit() and int(flag[2:]) > 0:
            micro_batch_size = int(flag[2:])
        else:
            raise SystemExit(f"{arg}: unknown flag {flag!r} (expected NAME[:sp][:mbN], e.g. local-tp-fit:sp:mb4)")
    return name, sequence_parallel, micro_batch_size


def main() -> int:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for arg in sys.argv[1:] or ["tiny-2d-tp-dp", "tiny-2d-tp-dp:sp", "tiny-llama-tp"]:
        name, sequence_parallel, micro_batch_size = parse(arg)
        cost = layer_cost_s(name, sequence_parallel, mesh, micro_batch_size)
        if dist.get_rank() == 0:
            print(f"{arg}: {cost * 1e3:.2f} ms of training-thread CPU per layer and micro-batch", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
