"""What one tensor-parallel layer costs the training thread, as the executor lays it out on DTensors.

Run with two ranks (each on a core of its own, gloo):

    torchrun --nproc-per-node 2 benchmarks/dtensor_layer.py tiny-2d-tp-dp tiny-2d-tp-dp:sp tiny-llama-tp

For each bundled scenario named (``:sp`` turns sequence parallelism on, ``:mbN`` sets the
micro-batch size to N: ``local-tp-fit:sp:mb4``), the executor's model with
1 and with 3 layers is split by ``executor.parallelize.apply_tensor_parallel`` and trained on one
micro-batch of the scenario's shape, each rank's training thread pinned to a core; the difference
of the training thread's CPU time (``time.thread_time``, forward and backward, the least of three
rounds) over 2 is one layer's cost per micro-batch, its ops on DTensors and on local tensors
together. With ``--profile PROFILE`` (a calibration profile of this host) it also prints the layer's
ops at the profile's prices and what the rest costs per DTensor op the executor runs
(simdist.analytic.profile_terms.dtensor_ops, which cites it).
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
ROUNDS = 3


def scenario(name: str, sequence_parallel: bool | None, micro_batch_size: int | None):
    """The bundled scenario and its plan with the flags applied."""
    from simdist.spec.scenario import load_scenario

    sc = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    plan = sc.plan if sequence_parallel is None else dataclasses.replace(sc.plan, sequence_parallel=sequence_parallel)
    plan = plan if micro_batch_size is None else dataclasses.replace(plan, micro_batch_size=micro_batch_size)
    return sc, plan


def layer_cost_s(name: str, sequence_parallel: bool | None, mesh, micro_batch_size: int | None = None) -> float:
    from executor.model import build_model
    from executor.parallelize import apply_tensor_parallel

    sc, plan = scenario(name, sequence_parallel, micro_batch_size)
    cpu = {}
    for layers in (1, 3):
        model = build_model(dataclasses.replace(sc.model, num_layers=layers), seed=0, recompute=plan.recompute)
        apply_tensor_parallel(model, mesh, plan.sequence_parallel)
        tokens = torch.randint(0, sc.model.vocab_size, (plan.micro_batch_size, sc.model.seq_length))

        for _ in range(3):
            step(model, tokens)
        rounds = []
        for _ in range(ROUNDS):
            t0 = time.thread_time()
            for _ in range(STEPS):
                step(model, tokens)
            rounds.append((time.thread_time() - t0) / STEPS)
        cpu[layers] = min(rounds)
    return (cpu[3] - cpu[1]) / 2


def priced(name: str, sequence_parallel: bool | None, micro_batch_size: int | None, profile: str) -> tuple[float, int]:
    """One layer's compute ops (forward and backward) at ``profile``'s prices without DTensor's
    term, and how many DTensor ops the executor runs for them."""
    from simdist.analytic.cost import CostModel
    from simdist.analytic.ops import Compute, layer_ops
    from simdist.analytic.profile_terms import dtensor_ops
    from simdist.spec.profile import load_profile

    sc, plan = scenario(name, sequence_parallel, micro_batch_size)
    cost = CostModel(sc.cluster.gpu, plan.precision, load_profile(profile))
    ops = [op for phase in ("fwd", "bwd") for op in layer_ops(sc.model, plan, phase) if isinstance(op, Compute)]
    return sum(cost.time(op) for op in ops), sum(dtensor_ops(op, sc.model, plan) for op in ops)


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

    from executor.hostload import pin_training_thread

    args = sys.argv[1:]
    profile = None
    if "--profile" in args:
        i = args.index("--profile")
        if i + 1 == len(args):
            raise SystemExit("--profile needs a calibration profile's path")
        profile = args.pop(i + 1)
        args.pop(i)
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    pin_training_thread()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for arg in args or ["tiny-2d-tp-dp", "tiny-2d-tp-dp:sp", "tiny-llama-tp"]:
        name, sequence_parallel, micro_batch_size = parse(arg)
        cost = layer_cost_s(name, sequence_parallel, mesh, micro_batch_size)
        if dist.get_rank() != 0:
            continue
        line = f"{arg}: {cost * 1e3:.2f} ms of training-thread CPU per layer and micro-batch"
        if profile:
            ops_s, n = priced(name, sequence_parallel, micro_batch_size, profile)
            line += f"; its ops priced {ops_s * 1e3:.2f} ms, the rest {(cost - ops_s) / n * 1e6:.0f} us per DTensor op ({n})"
        print(line, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
