"""Checkpoints with torch.distributed.checkpoint (DCP), written atomically, and resume.

``--checkpoint-every C`` saves after every C-th step (steps counted from 0, warm-up included)
into ``--checkpoint-dir D`` as ``D/step-<next step, 8 digits>``:

- what: the model and optimizer (``get_state_dict`` with ``flatten_optimizer_state_dict``, so
  every optimizer entry has its own key and pipeline stages do not collide), sharded where the
  plan shards (FSDP2/HSDP and tensor-parallel parameters and states are DTensors, each rank
  writes its shards; replicated tensors are written once); tensor-parallel shards that DDP holds
  as plain tensors are wrapped back into DTensors for the save (:class:`TrainState`); a
  parameter server's slices and optimizer under a per-server key; each rank's torch RNG state
  under a per-rank key; and, per rank, a ``progress-<rank>.json`` with the next step (the data
  sampler's position: batches are a function of the step, :mod:`executor.data`) and what the
  finished steps measured, so that the final measurement holds every step once;
- how (atomic): every rank writes into ``D/.tmp-step-<n>``; after ``dcp.save`` has returned on
  every rank (its metadata is written last, by rank 0, before the others return), rank 0
  renames the directory to ``D/step-<n>`` (``os.rename`` is atomic on one file system) and
  removes the older checkpoints. A crash at any point before the rename leaves only a
  ``.tmp-*`` directory, which resume ignores and the next save (or the launcher) removes, so the
  previous checkpoint stays usable.

``resume`` loads the newest ``step-*`` (DCP load in place, then ``set_state_dict``), restores
the RNG and returns the next step and the progress records. DCP save/load of FSDP2 with AdamW
resumes bitwise (measured with torch 2.13 on CPU); the tests check the losses.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from executor.faults import (
    CHECKPOINT_PREFIX,
    CHECKPOINT_TMP_PREFIX,
    checkpoint_name,
    latest_checkpoint,
)


class TrainState:
    """What a rank checkpoints: a model (a module or a list of pipeline chunks) and its optimizer,
    or a parameter server's shard and optimizer, or nothing (a parameter-server worker).

    With ``param_names`` (DDP x tensor parallelism) the state dict is built here, not by
    ``get_state_dict``: after a forward, torch's TP x DDP bridge leaves the rebuilt DTensors as
    plain module attributes, so the module no longer lists the parameters the optimizer holds,
    and ``get_state_dict`` cannot map them (KeyError). Each parameter and optimizer state is then
    saved under its name, tensor-parallel shards wrapped as DTensors (sharing storage, so that DCP
    loads in place)."""

    def __init__(self, rank: int, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 key: str = "model", local_shards: dict[int, tuple[Any, tuple[Any, ...]]] | None = None,
                 param_names: dict[int, str] | None = None):
        self.rank, self.model, self.optimizer, self.key = rank, model, optimizer, key
        self.local_shards = local_shards or {}
        self.param_names = param_names or {}

    def state_dict(self) -> dict[str, Any]:
        """The state dict to save or to load into (in place)."""
        sd: dict[str, Any] = {"rng": {f"rank{self.rank}": torch.get_rng_state()}}
        if self.model is None or self.optimizer is None:
            return sd
        if self.param_names:
            sd[self.key] = self._named_state_dict()
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            msd, osd = get_state_dict(self.model, self.optimizer,
                                      options=StateDictOptions(flatten_optimizer_state_dict=True))
            sd[self.key] = {"model": msd, "optim": osd}
        return sd

    def _named_state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import _init_optim_state
        from torch.distributed.tensor import DTensor

        assert self.optimizer is not None
        _init_optim_state(self.optimizer)  # the states must exist to be loaded into

        def view(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            spec = self.local_shards.get(id(p))
            t = t.detach()
            if spec is None or t.dim() == 0:
                return t
            return DTensor.from_local(t, spec[0], spec[1], run_check=False)

        out: dict[str, Any] = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                name = self.param_names[id(p)]
                out[f"model.{name}"] = view(p, p)
                for k, v in self.optimizer.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor):
                        out[f"optim.state.{name}.{k}"] = view(p, v)
        return out

    def load_into(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        torch.set_rng_state(sd["rng"][f"rank{self.rank}"])
        if self.model is not None and self.optimizer is not None and not self.param_names:
            part = sd[self.key]
            set_state_dict(self.model, self.optimizer, model_state_dict=part["model"],
                           optim_state_dict=part["optim"],
                           options=StateDictOptions(flatten_optimizer_state_dict=True))
        # with param_names, DCP has loaded into the parameters and states themselves


class Checkpointer:
    """Saves every ``every`` steps into ``directory`` and resumes from it (module docstring)."""

    def __init__(self, directory: str | Path, every: int, rank: int):
        self.directory = Path(directory)
        self.every = every
        self.rank = rank
        self.saves = 0
        self.save_s = 0.0

    def due(self, next_step: int, total: int) -> bool:
        return self.every > 0 and next_step % self.every == 0 and next_step < total

    def _progress_path(self, checkpoint: Path) -> Path:
        return checkpoint / f"progress-{self.rank}.json"

    def save(self, next_step: int, state: TrainState, progress: dict[str, Any]) -> None:
        import time

        t0 = time.perf_counter()
        tmp = self.directory / f"{CHECKPOINT_TMP_PREFIX}{next_step:08d}"
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        sd = state.state_dict()
        with open(self._progress_path(tmp), "w", encoding="utf-8") as fh:
            json.dump({"next_step": next_step, **progress}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        dcp.save(sd, checkpoint_id=str(tmp))
        dist.barrier()  # every rank's files are written
        if self.rank == 0:
            final = self.directory / checkpoint_name(next_step)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            _fsync_dir(self.directory)
            for entry in self.directory.iterdir():
                if entry.name.startswith(CHECKPOINT_PREFIX) and entry != final:
                    shutil.rmtree(entry, ignore_errors=True)
        dist.barrier()
        self.saves += 1
        self.save_s += time.perf_counter() - t0

    def resume(self, state: TrainState) -> tuple[int, dict[str, Any]] | None:
        """Load the newest checkpoint into ``state``; (next step, this rank's progress) or None.
        Every rank must see the same checkpoint: rank 0 picks it and tells the others."""
        found = latest_checkpoint(self.directory) if self.rank == 0 else None
        pick: list[Any] = [str(found[1]) if found else None]
        dist.broadcast_object_list(pick, src=0)
        if pick[0] is None:
            return None
        path = Path(pick[0])
        sd = state.state_dict()
        dcp.load(sd, checkpoint_id=str(path))
        state.load_into(sd)
        progress = json.loads(self._progress_path(path).read_text(encoding="utf-8"))
        return int(progress.pop("next_step")), progress


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
