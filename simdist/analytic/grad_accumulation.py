"""Gradient accumulation: each micro-batch after the first adds its gradients to those kept.

PyTorch's autograd hands a parameter's first gradient of a step to ``.grad`` as it is (the
AccumulateGrad node "steals" the fresh tensor); every later micro-batch's gradient is added into
it in place, one elementwise add per parameter tensor (torch/csrc/autograd/functions/
accumulate_grad.h, ``accumulateGrad``: ``variable_grad += new_grad`` outside grad mode). Each add
reads the kept gradient and the new one and writes the sum: 3 x the gradient's bytes, one
kernel per tensor. That is the path of DDP under ``no_sync`` and of a pipeline stage's backward
(torch.distributed.pipelining), and, on the gradient shards, of FSDP2 reducing every
micro-batch; under a pipeline that defers FSDP's reduction to the last micro-batch (FSDP2,
``Framework.fsdp_pipeline_no_sync``) the unsharded gradients accumulate.

Megatron-LM and NeMo fuse the add into the weight-gradient GEMM instead (``gradient_accumulation_
fusion``, on by default in megatron/training/arguments.py; Transformer Engine's
``fuse_wgrad_accumulation``: the GEMM writes with beta = 1 into ``main_grad``): nothing extra.
``plan.grad_accumulation_fusion`` says which, by default the framework's
(simdist.spec.frameworks: fused but under ``pytorch``, ``torchtitan`` and ``deepspeed``; simdist's
own defaults assume fused kernels, as for the elementwise ops). ZeRO-Offload's host accumulates
its partition itself (simdist.analytic.offload). The executor, eager PyTorch, runs it unfused
(executor.checks.as_run).

Measured on the 2-core machine this was written on (2026-11-29): the executor's trace of
``scenarios/local-pp-fit.yaml`` (8 micro-batches) against ``local-pp-1f1b.yaml`` (4, the same
tokens), ``simdist run --trace``: ``aten::add_`` on the last stage's training thread grew from 2.3
to 4.1 ms a step, 164 adds more, 4 micro-batches' worth of its 41 tensors (0.45 ms per
micro-batch over its 2.1M fp32 gradients, 56 GB/s). A single process's backward of the whole
model with gradients kept against without: the ``local`` GPT (69 tensors, 4.2M parameters)
2.3-2.7 ms longer, the ``tiny`` one (69 tensors, 0.23M) 0.08-0.12 ms: the add's dispatch is
about 1.3 us a tensor, nothing beside its bytes, so only the bytes are priced (each tensor's
pass at the memory curve of its size).
"""

from __future__ import annotations

from simdist.analytic.cost import CostModel
from simdist.analytic.cpu_optimizer import stage_tensors
from simdist.analytic.fsdp2 import runs_fsdp2
from simdist.analytic.memory import resident_state_bytes, shard_group
from simdist.analytic.params import params_per_rank
from simdist.spec.frameworks import framework_of, grad_accumulation_fusion
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario

ADD_PASSES = 3.0  # read the kept gradient, read the new one, write the sum


def kept_gradients(plan: ParallelPlan, params_on_rank: float, fsdp2: bool) -> float:
    """Gradient elements a rank keeps between the micro-batches of a step: all of its own, or its
    shard where the gradients are reduce-scattered every micro-batch (ZeRO-2/3), unless a pipeline
    defers the reduction to the last one: FSDP2's and torchtitan's at any ZeRO stage (its stage's
    no-sync backward, as simdist.analytic.memory counts it; the traffic model,
    data_parallel.reduced_once_under_pipeline, defers torchtitan's at ZeRO-3 only)."""
    deferred = plan.pp > 1 and (fsdp2 or framework_of(plan.framework).fsdp_pipeline_no_sync)
    if plan.shards_gradients and not deferred:
        return params_on_rank / shard_group(plan)
    return params_on_rank


def accumulation_time(sc: Scenario, cost: CostModel, stage: int) -> float:
    """Seconds one micro-batch's backward on ``stage`` spends adding its gradients into the kept
    ones, averaged over the step's micro-batches (the first adds nothing): 0 with one micro-batch,
    a fused accumulation or ZeRO-Offload's host-side one."""
    m, plan = sc.model, sc.plan
    n = plan.num_microbatches
    if n <= 1 or grad_accumulation_fusion(plan):
        return 0.0
    if plan.offload.optimizer != "none" and plan.shards_gradients:
        return 0.0
    tensors = max(1, stage_tensors(m, plan, stage))
    kept = kept_gradients(plan, params_per_rank(m, plan, stage), runs_fsdp2(plan, cost.profile))
    nbytes = ADD_PASSES * kept * resident_state_bytes(m, plan).grads
    return (n - 1) / n * tensors * cost.memory_time(nbytes / tensors, kernels=0)
