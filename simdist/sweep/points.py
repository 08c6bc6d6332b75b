"""One sweep point: the base scenario with the point's overrides, predicted (mode ``predict``)
or searched for its best plan (mode ``search``, through :func:`simdist.search.search` in this
process), as one flat row of :data:`RESULT_COLUMNS`.

A point the scenario loader rejects (a plan that does not divide the point's GPUs) is a row
with status ``invalid`` and the first problem; the sweep goes on. Rows hold plain JSON values
(None for missing), so a row stored, shipped to a Ray worker and back, or read from the run
store is the same row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simdist.errors import ScenarioError
from simdist.frozen import frozen
from simdist.predict import predict
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.sweep.spec import SweepSpec, apply_overrides

PLAN_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "virtual_pipeline_stages", "schedule", "zero_stage",
                "sequence_parallel", "recompute", "micro_batch_size")
RESULT_COLUMNS = ("status", "problem", "gpus", "gpu", "step_time_s", "mfu", "tokens_per_s", "peak_gib",
                  "fits", "engine", "gpu_hours", "cost", "goodput", "plan", *PLAN_COLUMNS,
                  "plans_evaluated", "plans_feasible")
# status: ok (fits), does_not_fit (predict: the plan needs more memory than the GPU has),
# no_plan (search: no plan fits), invalid (the point is not a valid scenario, see problem),
# error (the simulator failed on a valid scenario: a bug to report; the sweep goes on)
STATUSES = ("ok", "does_not_fit", "no_plan", "invalid", "error")


@frozen
class Job:
    """What every point of a sweep shares: shipped once to each worker (or Ray's object store)."""

    base: dict[str, Any]
    base_dir: str
    mode: str
    engine: str
    search: dict[str, Any] | None
    cost_per_gpu_hour: float | dict[str, float] | None

    @classmethod
    def of(cls, spec: SweepSpec) -> Job:
        return cls(spec.base, spec.base_dir, spec.mode, spec.engine, spec.search, spec.cost_per_gpu_hour)


def evaluate_chunk(job: Job, chunk: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    """``(index, row)`` for each ``(index, overrides)`` of ``chunk``: a worker's (or a Ray task's) unit."""
    return [(i, evaluate_point(job, overrides)) for i, overrides in chunk]


def evaluate_point(job: Job, overrides: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(RESULT_COLUMNS)
    row["problem"] = ""
    try:
        scenario = scenario_from_dict(apply_overrides(job.base, overrides), base_dir=job.base_dir)
        row.update(gpus=scenario.world_size, gpu=scenario.cluster.gpu.name)
        if job.mode == "search":
            _search(job, scenario, row)
        else:
            _predict(job, scenario, row)
    except ScenarioError as exc:
        row.update(status="invalid", problem=str(exc.problems[0]))
        return row
    except (ArithmeticError, LookupError, RuntimeError, TypeError, ValueError) as exc:
        row.update(status="error", problem=f"the simulator failed: {type(exc).__name__}: {exc}"[:500])
        return row
    if row["step_time_s"] is not None:
        row["gpu_hours"] = row["gpus"] * row["step_time_s"] / 3600.0
        price = _price(job.cost_per_gpu_hour, row["gpu"])
        row["cost"] = None if price is None else row["gpu_hours"] * price
    return row


def _predict(job: Job, scenario: Scenario, row: dict[str, Any]) -> None:
    p = predict(scenario, engine=job.engine, keep_spans=False)  # type: ignore[arg-type]
    row.update(status="ok" if p.fits else "does_not_fit", step_time_s=p.step_time_s, mfu=p.mfu,
               tokens_per_s=p.tokens_per_s, peak_gib=p.peak_gib, fits=bool(p.fits), engine=p.engine,
               goodput=p.extras.get("goodput", {}).get("expected_goodput"))
    _plan(scenario.plan, row)


def _search(job: Job, scenario: Scenario, row: dict[str, Any]) -> None:
    from simdist.search import Constraints, search

    constraints = Constraints(**{"engine": job.engine, **(job.search or {})})
    result = search(scenario, constraints, workers=1)  # the sweep spreads points, not plans
    row.update(plans_evaluated=result.evaluated, plans_feasible=result.feasible)
    best = result.best
    if best is None:
        row.update(status="no_plan", problem="no plan fits in the GPU's memory")
        return
    chosen = best.apply(scenario)
    tokens_per_s = chosen.plan.global_batch_size * scenario.model.seq_length / best.step_time_s
    row.update(status="ok", step_time_s=best.step_time_s, mfu=best.mfu, peak_gib=best.peak_gib,
               fits=bool(best.fits), engine=best.engine, tokens_per_s=tokens_per_s)
    if scenario.reliability is not None:
        from simdist.reliability import goodput

        row["goodput"] = goodput(chosen, best.step_time_s, tokens_per_s).expected_goodput
    _plan(chosen.plan, row)


def _plan(plan: ParallelPlan, row: dict[str, Any]) -> None:
    for name in PLAN_COLUMNS:
        row[name] = getattr(plan, name)
    sp = " SP" if plan.sequence_parallel else ""
    v = f" v{plan.virtual_pipeline_stages}" if plan.virtual_pipeline_stages > 1 else ""
    cp = f" CP{plan.cp}" if plan.cp > 1 else ""
    ep = f" EP{plan.ep}" if plan.ep > 1 else ""
    row["plan"] = (f"TP{plan.tp} PP{plan.pp} DP{plan.dp}{cp}{ep}{v} {plan.schedule} Z{plan.zero_stage}{sp} "
                   f"{plan.recompute} mb{plan.micro_batch_size}")


def _price(cost: float | dict[str, float] | None, gpu: str) -> float | None:
    if cost is None or isinstance(cost, float):
        return cost
    return cost.get(gpu)
