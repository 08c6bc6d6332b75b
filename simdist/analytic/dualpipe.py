"""The closed form of DualPipe and DualPipeV (DeepSeek-V3 sec 3.2.1; deepseek-ai/DualPipe).

The DualPipe README gives the bubble as (PP/2 - 1)(F&B + B - 3W) for DualPipe and
(S/2 - 1)(F&B + B - 3W) for DualPipeV over S = 2*pp stages, with F, B and W one stage's
forward, backward and weight-gradient times and F&B a forward and a backward of two
micro-batches run together (their all-to-alls hidden behind each other's compute). simdist
runs backward whole (no B/W split), so W = 0 here, and F&B = F + B: the pair's compute, with
the all-to-all the pair cannot hide already in each pass's time (simdist.analytic.passes).
Per rank and micro-batch, F + B is the stage time t of the busiest rank (DualPipe: one of its
two stages; DualPipeV: both of its half-size stages), so

  DualPipe:   m * t + (pp/2 - 1)(t + B)
  DualPipeV:  m * t + (pp - 1)(t + B) / 2.
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
        return m * t + max(0, p // 2 - 1) * (t + b)
    return m * t + (p - 1) * (t + b) / 2
