"""The breakdown of a simulated step, whose parts sum to the step time exactly.

Up to the pipeline flush (the last compute action of any slice): the busiest slice's compute,
recompute, compression kernels, exposed TP/CP, pipeline sends and the exposed part of waits for
a transfer in flight, waits for ZeRO-3 parameters (dp) and for parameter uploads and gradient
copies (offload), and the rest of its idle time as bubble. After the flush: what the critical
(last finishing) slice waited for, by kind: the optimizer (GPU, host CPU or the servers'
update), offload copies, compression kernels, and everything else (gradient sync, pushes and
pulls, parameter all-gathers) as data-parallel communication. In the asynchronous
parameter-server mode the same parts are the mean over the measured cycles, scaled to the step
time.
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.result import Span, StepResult, breakdown_keys
from simdist.sim import kernel
from simdist.sim.engine.assumptions import engine_assumptions
from simdist.sim.engine.servers import Servers
from simdist.sim.engine.state import Run, Tally
from simdist.spec.plan import ParallelPlan

PRE_FLUSH = ("compute", "recompute", "compression", "tp", "pp", "dp", "offload", "cp", "ep")
BREAKDOWN_NAME = {"tp": "tp_comm", "pp": "pp_comm", "dp": "dp_comm", "cp": "cp_comm", "ep": "ep_comm"}


def events_scheduled(env: kernel.Environment) -> int:
    """Events the environment has scheduled so far (the kernel numbers them with ``_eid``)."""
    counter = getattr(env, "_eid", None)
    return next(counter) if counter is not None else 0


def _parts(t: Tally, plan: ParallelPlan) -> dict[str, float]:
    """The tally by breakdown key; a plan without cp (ep) counts its cp (ep) waits as TP's."""
    out = {BREAKDOWN_NAME.get(k, k): getattr(t, k) for k in PRE_FLUSH}
    for key, used in (("cp_comm", plan.cp > 1), ("ep_comm", plan.ep > 1)):
        if not used:
            out["tp_comm"] += out.pop(key)
    return out


def _keys(run: Run) -> tuple[str, ...]:
    plan = run.plan
    return breakdown_keys(plan.offload.any, plan.grad_compression.enabled, plan.ep > 1, plan.cp > 1)


def step_result(run: Run) -> StepResult:
    """One synchronous step: the last slice's end, the busiest slice's parts before the flush,
    the critical slice's after it."""
    slices = run.slices
    tallies = [sl.tally for sl in slices]
    step = max(t.end for t in tallies)
    flush = max(t.flush_end for t in tallies)
    busiest = max(range(len(slices)), key=lambda i: tallies[i].busy)
    parts = _parts(tallies[busiest], run.plan)
    parts["bubble"] = max(0.0, flush - sum(parts.values()))
    crit = next(t for t in tallies if t.end == step)
    after = 0.0
    for start, end, category in crit.post:
        d = max(0.0, min(end, step) - max(start, flush))
        if d > 0 and category != "dp_comm":
            parts[category] = parts.get(category, 0.0) + d
            after += d
    parts["dp_comm"] += max(0.0, step - flush - after)  # syncs, pushes, pulls, gathers
    return finish(run, step, parts, slices[busiest].stage, {})


def async_result(run: Run, servers: Servers) -> StepResult:
    """Steady state of the asynchronous mode: the time between the dp-th and the last counted
    update over the steps they make up; the parts are the busiest stage's mean cycle, scaled to
    that step time."""
    step = servers.steady_step()
    by_stage: dict[int, list[Tally]] = {}
    for sl in run.slices:
        by_stage.setdefault(sl.stage, []).extend(sl.history[1:] or sl.history)
    stage = max(by_stage, key=lambda s: sum(t.busy for t in by_stage[s]) / max(1, len(by_stage[s])))
    cycles = by_stage[stage]
    mean: dict[str, float] = dict.fromkeys(_keys(run), 0.0)
    length = 0.0
    for t in cycles:
        for k, v in _parts(t, run.plan).items():
            mean[k] = mean.get(k, 0.0) + v / len(cycles)
        for start, end, category in t.post:
            mean[category] = mean.get(category, 0.0) + (end - start) / len(cycles)
        length += (t.end - t.start) / len(cycles)
    mean["bubble"] = max(0.0, length - sum(v for k, v in mean.items() if k != "bubble"))
    scale = step / length if length > 0 else 1.0
    parts = {k: v * scale for k, v in mean.items()}
    return finish(run, step, parts, stage, servers.staleness())


def finish(run: Run, step: float, parts: dict[str, float], stage: int, extras: dict[str, Any]) -> StepResult:
    breakdown = {k: parts.get(k, 0.0) for k in _keys(run)}
    extras.update(run.network.usage(max(run.env.now, step)))
    spans = tuple(Span(*s) for s in sorted(run.spans, key=lambda s: (s[0], s[3], s[1])))
    return StepResult(
        step_time=step,
        breakdown=breakdown,
        bubble_fraction=breakdown["bubble"] / step if step > 0 and run.plan.pp > 1 else 0.0,
        busiest_stage=stage,
        spans=spans,
        assumptions=tuple(engine_assumptions(run)),
        events=events_scheduled(run.env),
        extras=extras,
    )
