"""Sync points of one rank in one step, and what each costs when ranks time-share the cores.

With more ranks than cores (simdist.analytic.timeshare), a rank that reaches a collective or a
pipeline send/receive needs its peers to run; a peer that is descheduled at that moment runs
only when the scheduler gives it a core, which happens at the end of the current slice of the
rank holding it. Linux's EEVDF scheduler (kernel 6.6 and later; CFS before it, with its minimum
granularity) gives a task a base slice of 0.75 ms scaled by 1 + log2(CPUs) (kernel/sched/fair.c,
``sysctl_sched_base_slice`` under the default logarithmic tunable scaling), 1.5 ms on 2 cores;
a peer is descheduled with probability 1 - cores/ranks (the ranks that compete for the cores:
in a pipeline, another stage for the share of the step it computes,
simdist.analytic.timeshare.competing_ranks). So each sync point costs about
(1 - cores/ranks) x a wait of the order of a slice, which a calibration profile fits from runs
with more ranks than cores (``coschedule_wait_s``: the wait of a sync point when no peer is
running; 3.1 ms fitted on the 2-core machine this was written on, about two slices, while gloo's
transport threads spun on the cores; 0.17-0.45 ms since they run under the idle policy and the
sync-point waits stretch with the work, simdist.analytic.timeshare).
The waits add up over the step's sync points: each of gloo's collectives (measured on the
shared 2-core machine this was written on: 0.9-1.7 ms of unexplained wait per collective call at
4 ranks on 2 cores, against 0.1-0.3 ms at 2 ranks), and of a point-to-point transfer the
receive (gloo sends a small message without its peer running).

The count follows the op lists the model times: the TP, CP and expert-parallel collectives of
every layer's forward and backward (and recompute) per micro-batch, the pipeline's receives of
each chunk per micro-batch, the dense and expert data-parallel collectives (simdist.analytic.
dp_groups) and a parameter server's push and pull.
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.dp_groups import data_parallel_traffic
from simdist.analytic.ops import Comm, embedding_ops, head_ops
from simdist.analytic.variants import layer_ops, recompute_ops
from simdist.spec.layers import layer_kind
from simdist.spec.stages import stage_layer_ranges


def _comms(ops: tuple) -> int:
    """Sync points of an op list: each collective, and a ring's send/receive twice (it sends to
    one neighbour and receives from the other, each of which must run)."""
    return sum(2 if op.collective == "sendrecv" else 1 for op in ops if isinstance(op, Comm))


def sync_points(sc: Any, stage: int, fsdp2: bool = False) -> int:
    """Collectives and point-to-point receives one rank of ``stage`` takes part in per step
    (``fsdp2``: ZeRO-3 runs as FSDP2, simdist.analytic.fsdp2.runs_fsdp2)."""
    m, plan = sc.model, sc.plan
    chunks = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages)[stage]
    per_mb = 0
    for r in chunks:
        for i in r:
            kind = layer_kind(m, i)
            per_mb += _comms(layer_ops(m, plan, "fwd", kind)) + _comms(layer_ops(m, plan, "bwd", kind))
            if plan.recompute != "none":
                per_mb += _comms(recompute_ops(m, plan, kind))
    if stage == 0:
        per_mb += _comms(embedding_ops(m, plan, "fwd")) + _comms(embedding_ops(m, plan, "bwd"))
    if stage == plan.pp - 1:
        per_mb += _comms(head_ops(m, plan, "fwd")) + _comms(head_ops(m, plan, "bwd"))
    if plan.pp > 1:  # each chunk receives activations forward and gradients backward
        virtual = plan.pp * plan.virtual_pipeline_stages
        for c in range(len(chunks)):
            k = c * plan.pp + stage
            per_mb += (k > 0) + (k < virtual - 1)
    once = 0
    if plan.uses_parameter_servers:
        once += 2  # push the gradients, pull the parameters
    elif plan.dp > 1:
        dp = data_parallel_traffic(m, plan, stage, fsdp2)  # the dense and the expert parameters' calls
        per_mb += sum(c.calls for c in dp.fwd_gathers + dp.bwd_gathers + dp.microbatch_grad_sync)
        once += sum(c.calls for c in dp.step_grad_sync + dp.post_step_gathers)
    return plan.num_microbatches * per_mb + once
