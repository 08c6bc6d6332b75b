"""DDP's reducer on a CPU's training thread: what the backward that synchronises the gradients
does beyond the others.

PyTorch DDP's C++ reducer runs on the thread that runs autograd, which on a CPU is the training
thread: in the backward that synchronises (a step's last micro-batch; the others run under
``no_sync``, whose hooks return at once) a hook per parameter marks its gradient ready and copies
it into its bucket, and the reduced buckets are copied back into the gradients at the end
(``gradient_as_bucket_view`` False, DDP's default; torch/csrc/distributed/c10d/reducer.cpp,
``mark_variable_ready_dense``, ``finalize_bucket_dense``). The executor's microbenchmark times it
per tensor and per byte (executor.bench_reducer; profile v14): on the 2-core machine it was
written on, about 5 us a tensor and 0.17 ms a MiB, 0.5 ms a step for the tiny GPT's 69 tensors,
which the plain plans' fit spread over their ops before (a micro-batch's ops priced 3.25 ms where
runs of 1 to 6 micro-batches measured 2.2 ms each and 1.2 ms once a step, 2026-11-30).
On a GPU the hooks' host work hides behind the kernels and the copies are HBM passes: nothing is
priced (a GPU profile has no such rate).
"""

from __future__ import annotations

from simdist.analytic.cost import CostModel
from simdist.analytic.cpu_optimizer import stage_tensors
from simdist.analytic.memory import resident_state_bytes
from simdist.analytic.params import params_per_rank
from simdist.spec.scenario import Scenario
from simdist.spec.software_layers import runs_ddp_reducer


def reducer_time(sc: Scenario, cost: CostModel, stage: int) -> float:
    """Seconds a micro-batch's backward on ``stage`` spends in DDP's reducer, averaged over the
    step's micro-batches (the last pays it all): the profile's cost per gradient tensor and per
    gradient byte on this rank; 0 for a plan the reducer does not run or a profile without it."""
    p, plan = cost.profile, sc.plan
    if p is None or not (p.ddp_reducer_tensor_s or p.ddp_reducer_byte_s) or not runs_ddp_reducer(plan):
        return 0.0
    nbytes = params_per_rank(sc.model, plan, stage) * resident_state_bytes(sc.model, plan).grads
    once = stage_tensors(sc.model, plan, stage) * p.ddp_reducer_tensor_s + nbytes * p.ddp_reducer_byte_s
    return once / max(1, plan.num_microbatches)
