"""The closed form of DualPipe and DualPipeV (DeepSeek-V3 sec 3.2.1; deepseek-ai/DualPipe).

The DualPipe README gives the bubble as (PP/2 - 1)(F&B + B - 3W) for DualPipe and
(S/2 - 1)(F&B + B - 3W) for DualPipeV over S = 2*pp stages, with F, B and W one stage's
forward, backward and weight-gradient times and F&B a forward and a backward of two
micro-batches run together. simdist runs backward whole (no B/W split: W = 0) and a pair's
compute back to back (its all-to-alls hide behind each other's compute, simdist.analytic.passes),
with the phases of simdist.sim.dualpipe. List-scheduling those phases with unit times (pp from
2 to 16, backward 1 to 3 times forward) leaves, per rank, a bubble of 2B for each of the
pp/2 - 1 steps of DualPipe's warm-up and B for each of DualPipeV's pp - 1, B being one rank's
backward per micro-batch: the forwards of the steady phase fill the rest. So, with t the busiest
rank's time per micro-batch,

  DualPipe:   m * t + (pp/2 - 1) * 2B
  DualPipeV:  m * t + (pp - 1) * B.
"""

from __future__ import annotations

from simdist.spec.plan import ParallelPlan


def dualpipe_time(plan: ParallelPlan, times: list[float], backwards: list[float]) -> float:
    """One step's pipeline time (before the optimizer) for per-stage micro-batch times ``times``
    and backward times ``backwards``."""
    m, p = plan.num_microbatches, plan.pp
    i = max(range(p), key=lambda s: times[s])
    t, b = times[i], backwards[i]
    if plan.schedule == "dualpipe":
        return m * t + max(0, p // 2 - 1) * 2 * b
    return m * t + (p - 1) * b
