"""A lower bound on a plan's step time that holds for both engines, from its closed-form
description: what lets the search skip event-engine runs of plans that provably cannot win.

The bound counts only work that runs one task after another on a stage's compute stream. In
the event engine (simdist.sim.lowering) every (micro-batch, chunk) action of the schedule is a
task on its stage's compute stream, and its length is at least its ``Work`` at full speed:
the compute (and the recomputed forward) plus the exposed TP and CP communication, the same
``PassTime`` figures the closed form adds up (both engines read one ``StepDescription``).
Anything else a task meets (a parameter gather not yet arrived, a straggler's slower GPU, the
compute slowed beside a collective, a pipeline send) only makes it longer. So, for every stage
``s`` with ``m`` micro-batches:

- the stream is busy at least ``m * w_s``, ``w_s`` the stage's compute, recompute, TP and CP
  seconds of one micro-batch through all its chunks (``fwd``, ``bwd``, ``recompute``);
- it cannot start before the first micro-batch's first chunk went forward through every stage
  ahead of it (``fill_s``: the forward of stage j's first chunk, f_j / v when its chunks are
  alike, for j < s), the data dependency of a pipeline;
- with 1F1B, GPipe and interleaved 1F1B its last task is the last micro-batch's backward of its
  first chunk, after which the stages ahead of it run theirs one after another (``drain_s``:
  b_j / v for j < s, b with the recompute); zero-bubble ends with weight-gradient tasks that
  nothing waits for, so no drain is counted there;
- the optimizer step on the GPU follows the stage's last backward (stage 0's the drain).

  bound = max_s [ fill_s + m * w_s + max(opt_s, drain_s + opt_0) ]

The closed form is at least this too: it charges each stage ``m`` times its full pass time
(steptime.pipeline_time) plus a fill of the stages' whole passes. Fill and drain are counted
only when every stage's chunks are alike (one layer kind, no ``pipeline_layout``, layers
divisible by pp * v): else the bound is the busy stream and the optimizer alone. DualPipe (two
micro-batches' passes fused on one GPU) and asynchronous parameter servers (no step barrier)
get no bound (0: always re-timed). The bound is lowered by 1e-9 of itself, more than the
engines' sums of the same seconds in another order can round apart. tests/test_search_bounds.py checks the bound against both
engines on plans of several spaces.
"""

from __future__ import annotations

from simdist.analytic.passes import PassTime
from simdist.analytic.stage import StepDescription

ROUNDING = 1e-9  # the bound is lowered by this fraction: m * w and the engines' sums round apart


def _stream(p: PassTime) -> float:
    """A pass's seconds on the compute stream that nothing can shorten."""
    return p.compute + p.tp_exposed + p.cp_exposed


def step_lower_bound(d: StepDescription) -> float:
    """A lower bound on the step time of the described plan in either engine (module docstring)."""
    plan = d.plan
    if plan.dualpipe or plan.async_parameter_servers:
        return 0.0
    m, p, v = plan.num_microbatches, plan.pp, plan.virtual_pipeline_stages
    kinds = d.kinds
    work = [_stream(k.fwd) + _stream(k.bwd) + _stream(k.recompute) for k in kinds]
    alike = (len(d.layer_kinds) <= 1 and plan.pipeline_layout is None
             and d.scenario.model.num_layers % (p * v) == 0)
    fwd = [_stream(k.fwd) / v if alike else 0.0 for k in kinds]
    bwd = [(_stream(k.bwd) + _stream(k.recompute)) / v if alike and not plan.split_backward else 0.0
           for k in kinds]
    opt0 = kinds[d.kind_of[0]].optimizer
    best = fill = drain = 0.0
    for s in range(p):
        k = d.kind_of[s]
        best = max(best, fill + m * work[k] + max(kinds[k].optimizer, drain + opt0))
        fill += fwd[k]
        drain += bwd[k]
    return best * (1 - ROUNDING)
