"""How a plan absorbs its stragglers: the simulated step with slow ranks against a uniform run."""

from __future__ import annotations

import math
from typing import Any

from simdist.analytic.result import StepResult
from simdist.sim.engine.state import Run
from simdist.spec.scenario import Scenario


def straggler_summary(sc: Scenario, slow_run: Run, result: StepResult, uniform: Run,
                      base: StepResult) -> tuple[dict[str, Any], str]:
    """How the plan absorbs its stragglers: the step against a uniform run, and how much of the
    stragglers' extra GPU work (factor - 1 times their work in the uniform run) reached the
    critical path. Synchronous data parallelism waits for the slowest replica at every gradient
    sync (all of it); a pipeline's bubbles absorb part of a slow stage; asynchronous parameter
    servers let the others go on (throughput drops by the straggler's share, its updates get
    staler)."""
    plan = sc.plan
    extra = 0.0
    for slow, same in zip(slow_run.slices, uniform.slices, strict=True):
        if slow.factor > 1.0:
            cycles = same.history[1:] or same.history or [same.tally]
            work = sum(t.work for t in cycles) / len(cycles)
            extra = max(extra, (slow.factor - 1.0) * work)
    t, t0 = result.step_time, base.step_time
    critical = (t - t0) / extra if extra > 0 else 0.0
    if plan.async_parameter_servers:
        mode = "async-ps"
    elif plan.pp > 1:
        mode = "pipeline"
    else:
        mode = "sync-ps" if plan.sync_parameter_servers else "sync-dp"
    who = ", ".join(f"node {-k - 1}" if k < 0 else f"rank {k}" for k in sorted(slow_run.stragglers))
    factor = max(sl.factor for sl in slow_run.slices)
    summary: dict[str, Any] = {
        "mode": mode, "slowest_factor": factor, "who": who, "uniform_step_s": t0, "step_s": t,
        "slowdown": t / t0 if t0 > 0 else math.nan, "extra_work_s": extra,
        "critical_fraction": critical, "absorbed_fraction": 1.0 - critical,
    }
    line = (f"stragglers ({who}, up to x{factor:g}): step {t:.4g} s vs {t0:.4g} s uniform "
            f"({t / t0:.3f}x); {critical:.0%} of their extra GPU work ({extra:.3g} s) on the critical path")
    if mode in ("sync-dp", "sync-ps"):
        line += ": every gradient sync waits for the slowest replica"
        if critical < 0.9:
            line += f"; communication that outlasts backward hides {1 - critical:.0%} of it"
    elif mode == "pipeline" and critical > 0.95:
        line += ": the slow stage sets the pipeline's pace, nothing is absorbed"
    elif mode == "pipeline":
        line += f": the other stages' slack (pipeline bubbles) absorbed {1 - critical:.0%}"
    else:
        s0 = base.extras.get("staleness", {})
        s1 = result.extras.get("staleness", {})
        slow = [sl.replica for sl in slow_run.slices if sl.factor > 1.0]
        per = s1.get("per_worker_mean_steps", {})
        slow_stale = max((per.get(str(r), 0.0) for r in slow), default=0.0)
        summary.update({"throughput_ratio": t0 / t, "uniform_staleness_steps": s0.get("mean_steps"),
                        "staleness_steps": s1.get("mean_steps"), "straggler_staleness_steps": slow_stale})
        line += (f": no barrier, the other workers keep going (throughput {t0 / t:.3f}x of uniform); "
                 f"mean staleness {s0.get('mean_steps', 0):.2f} -> {s1.get('mean_steps', 0):.2f} updates, "
                 f"the slow worker's {slow_stale:.2f}")
    return summary, line
