"""One optimizer step for every plan kind, and the one-process reference run.

The loss of a step is the mean next-token cross entropy over the whole global batch. Every
micro-batch holds the same number of tokens, so the mean of the micro-batch means over all
data-parallel replicas equals it; gradients are those of that mean:

- without a pipeline, each micro-batch's loss is divided by the number of micro-batches before
  its backward, and the data-parallel wrapper averages over dp;
- with a pipeline, the schedule runs the micro-batches and ``scale_grads=True`` divides the
  accumulated gradients by their number (torch.distributed.pipelining.schedules).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import nn

from executor.context import shard
from executor.data import replica_batch
from executor.knobs import attention_kernels
from executor.model import build_model, lm_loss
from executor.parallelize import ParallelModel, make_optimizer, set_gradient_sync
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan, RankCoord

DEFAULT_SEED = 1234


class Probe:
    """Hooks a measurement can give a step: phase timers and a saved-tensor counter. The base
    class measures nothing."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def activations(self) -> Iterator[None]:
        yield

    def after_optimizer(self, pm: ParallelModel) -> None:
        """Called after the optimizer step, while the gradients are still there."""


def autocast(plan: ParallelPlan, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast on the step's device (CPU included); fp32 runs as written.

    The weight-cast cache is off: autocast keeps the bf16 copy of each weight for the whole
    region (here all micro-batches of a step), keyed by the parameter, and FSDP2 swaps its
    unsharded parameters under it; with the cache on, FSDP2 (zero_stage 2 and 3) in bf16 drifted
    2.3e-3 (relative loss, step 3) from the one-process run while DDP matched exactly; with it
    off both match exactly (torch 2.13, gloo, measured).
    """
    if plan.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def _no_sync(chunk: nn.Module, enabled: bool) -> contextlib.AbstractContextManager[None]:
    if enabled and hasattr(chunk, "no_sync"):
        return chunk.no_sync()  # DistributedDataParallel
    return contextlib.nullcontext()


def train_step(pm: ParallelModel, m: ModelSpec, plan: ParallelPlan, step: int, seed: int,
               device: torch.device, probe: Probe | None = None) -> float | None:
    """Run optimizer step ``step``; return this replica's mean loss where this rank computes it."""
    probe = probe or Probe()
    inputs, targets = replica_batch(seed, step, plan.global_batch_size, plan.dp, pm.coord.dp,
                                    m.seq_length, m.vocab_size)
    inputs, targets = shard(plan, pm.coord.cp, inputs, targets)  # context parallelism's part
    inputs, targets = inputs.to(device), targets.to(device)
    with autocast(plan, device), attention_kernels(plan), probe.activations():
        if pm.schedule is not None:
            loss = _pipeline_step(pm, inputs, targets, probe)
        else:
            loss = _accumulation_step(pm, plan, inputs, targets, probe)
    with probe.phase("optimizer"):
        pm.optimizer.step()
    probe.after_optimizer(pm)
    pm.optimizer.zero_grad(set_to_none=True)
    return loss


def _pipeline_step(pm: ParallelModel, inputs: torch.Tensor, targets: torch.Tensor, probe: Probe
                   ) -> float | None:
    losses: list[torch.Tensor] = []
    args = (inputs,) if pm.holds_input else ()
    kwargs = {"target": targets, "losses": losses} if pm.holds_loss else {}
    assert pm.schedule is not None
    with probe.phase("pipeline"):
        pm.schedule.step(*args, return_outputs=False, **kwargs)
    if not pm.holds_loss:
        return None
    return float(torch.stack([x.detach().float() for x in losses]).mean())


def loss_context(plan: ParallelPlan):
    """Under tensor parallelism without a pipeline the logits stay sharded over the vocabulary
    and the cross entropy runs vocab-parallel (Megatron-LM's vocab_parallel_cross_entropy,
    Shoeybi et al. 2019 sec 3; DTensor's loss_parallel), forward and backward."""
    if plan.tp > 1 and plan.pp == 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def _accumulation_step(pm: ParallelModel, plan: ParallelPlan, inputs: torch.Tensor,
                       targets: torch.Tensor, probe: Probe) -> float:
    (model,) = pm.chunks
    n = inputs.shape[0] // plan.micro_batch_size
    total = 0.0
    for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n), strict=True)):
        last = i == n - 1
        # FSDP2's fully_shard (ZeRO-2/3) reduce-scatters every micro-batch's gradients: sharded
        # gradients are what those stages mean (Rajbhandari et al. SC'20 sec 5.2) and what
        # simdist.analytic.data_parallel prices; DDP (and FSDP2's replicate) sync the last only
        set_gradient_sync(pm, last or plan.shards_gradients)
        with _no_sync(model, not last), loss_context(plan):
            with probe.phase("forward"):
                loss = lm_loss(model(x), y)
            with probe.phase("backward"):
                (loss / n).backward()
        total += float(loss.detach())
    return total / n


# --- one-process reference --------------------------------------------------------------------


def reference_plan(plan: ParallelPlan) -> ParallelPlan:
    """The same training (global batch, micro-batch size, precision, optimizer) on one process."""
    return replace(plan, tp=1, pp=1, dp=1, cp=1, dp_shard=1, virtual_pipeline_stages=1,
                   schedule="1f1b", zero_stage=0, sequence_parallel=False, recompute="none")


def reference_losses(m: ModelSpec, plan: ParallelPlan, steps: int, warmup: int = 0,
                     seed: int = DEFAULT_SEED) -> list[float]:
    """Losses of steps warmup .. warmup+steps-1 of a one-process run (no torch.distributed)."""
    ref = reference_plan(plan)
    device = torch.device("cpu")
    model = build_model(m, seed)
    pm = ParallelModel(coord=RankCoord(0, 0, 0, 0), chunks=[model],
                       optimizer=make_optimizer(list(model.parameters()), ref, None),
                       schedule=None, data_parallel="none", holds_input=True, holds_loss=True)
    out: list[float] = []
    for step in range(warmup + steps):
        loss = train_step(pm, m, ref, step, seed, device)
        if step >= warmup:
            assert loss is not None
            out.append(loss)
    return out
