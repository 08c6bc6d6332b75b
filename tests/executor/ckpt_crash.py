"""One-process script for test_executor_v11: a crash during a checkpoint save keeps the previous one.

``python ckpt_crash.py DIR``: trains a small model with LAMB on a 1-rank gloo group, saves a
checkpoint at step 2, trains on, then crashes inside the save of step 4 (after DCP has written its
files, before the rename: the latest moment a crash can hit). Prints one JSON line with what the
directory holds and whether resuming restores the step-2 weights and optimizer state.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from executor.checkpoint import Checkpointer, TrainState
from executor.faults import latest_checkpoint, remove_partial_checkpoints
from executor.optim import Lamb


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss = model(torch.randn(8, 6, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def main() -> None:
    root = Path(sys.argv[1])
    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    opt = Lamb(model.parameters(), lr=0.05)
    ckpt = Checkpointer(root / "ckpt", every=2, rank=0)
    train(model, opt, 2)
    ckpt.save(2, TrainState(0, model, opt), {"records": {"1": {"loss": 1.0}}})
    saved = [p.detach().clone() for p in model.parameters()]
    saved_m = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    train(model, opt, 2)

    original = dcp.save

    def crashing(*args: object, **kwargs: object) -> None:
        original(*args, **kwargs)  # type: ignore[arg-type]
        raise RuntimeError("crash while saving")

    dcp.save = crashing  # type: ignore[assignment]
    crashed = False
    try:
        ckpt.save(4, TrainState(0, model, opt), {"records": {}})
    except RuntimeError:
        crashed = True
    dcp.save = original  # type: ignore[assignment]
    found = latest_checkpoint(root / "ckpt")
    before_cleanup = sorted(p.name for p in (root / "ckpt").iterdir())
    removed = [p.name for p in remove_partial_checkpoints(root / "ckpt")]

    torch.manual_seed(1)  # a fresh model and optimizer, as after a restart
    fresh = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    fresh_opt = Lamb(fresh.parameters(), lr=0.05)
    resumed = Checkpointer(root / "ckpt", every=2, rank=0).resume(TrainState(0, fresh, fresh_opt))
    print(json.dumps({
        "crashed": crashed,
        "latest": found[0] if found else None,
        "entries": before_cleanup,
        "removed": removed,
        "resumed_step": resumed[0] if resumed else None,
        "records": resumed[1]["records"] if resumed else None,
        "weights_equal": all(torch.equal(a, b) for a, b in zip(saved, fresh.parameters(), strict=True)),
        "state_equal": all(torch.equal(a, fresh_opt.state[p]["exp_avg"])
                           for a, p in zip(saved_m, fresh.parameters(), strict=True)),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
