"""The catalog's fitted constants, fitted: per GPU generation, the large-GEMM and fused-attention
fractions of peak (``efficiency.gemm`` and ``efficiency.attention`` in simdist/catalog/gpus.yaml)
that make the closed form match the published training runs best.

One pair per generation over every public run on it (dozens of runs, several frameworks, model
sizes and sequence lengths), never per run. The objective is the mean |log(predicted /
measured)| step time, searched coarse to fine: a coarse grid over the plausible range, then a
compass search whose step halves until it is below :data:`TOLERANCE`. A closed-form prediction
takes well under a millisecond, so a whole fit takes seconds and cross-validation
(:mod:`simdist.validate.crossval`) can refit once per left-out source group.

A generation without any row to fit on (a GPU whose only runs were left out) takes the pooled
constants: the mean of the fitted generations' constants. That is what a user of a GPU simdist
has no runs for should get, so it is what cross-validation scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field, replace

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.stage import describe
from simdist.analytic.steptime import reduce_step
from simdist.frozen import frozen
from simdist.spec.scenario import Scenario
from simdist.validate.training import Case

FITTED = ("gemm", "attention", "fp8_gemm")
BOUNDS = {"gemm": (0.30, 0.95), "attention": (0.10, 0.95), "fp8_gemm": (0.20, 0.95)}
COARSE = 5  # points per constant in the coarse grid
WARM_STEP = 0.02  # first step of a search started from a previous fit
TOLERANCE = 0.004  # the compass search stops when its step is below this (fraction of peak)

Efficiency = Mapping[str, float]


def with_efficiency(sc: Scenario, eff: Efficiency) -> Scenario:
    """``sc`` on its GPU with the fitted constants ``eff`` in place of the catalog's. FP8 GEMMs
    keep the catalog's ratio of FP8 to 16-bit GEMM efficiency unless ``eff`` fits its own."""
    gpu = sc.cluster.gpu
    old = gpu.efficiency
    new = {**old, **eff}
    if "fp8_gemm" in old and "gemm" in eff and "fp8_gemm" not in eff:
        new["fp8_gemm"] = min(1.0, eff["gemm"] * old["fp8_gemm"] / old["gemm"])
    return replace(sc, cluster=replace(sc.cluster, gpu=replace(gpu, efficiency=new)))


def step_time(sc: Scenario) -> float:
    """The closed form's step time (what `simdist validate` reports), without the rest of a
    Prediction."""
    cost = CostModel(sc.cluster.gpu, sc.plan.precision)
    return reduce_step(describe(sc, cost, Network.of(sc.cluster))).step_time


def case_time(case: Case, eff: Efficiency | None = None) -> float:
    """A row's predicted step: the fastest of its kept choices of unstated fields (as the
    authors tuned their runs), on the efficiencies ``eff`` (None: the catalog's)."""
    options = [o for o, _ in case.options] or [case.scenario]
    if eff is None:
        return min(step_time(o) for o in options)
    return min(step_time(with_efficiency(o, eff)) for o in options)


def log_errors(cases: Iterable[Case], eff: Efficiency | None) -> list[float]:
    return [math.log(case_time(c, eff) / c.measured_step_s) for c in cases]


def objective(cases: Sequence[Case], eff: Efficiency) -> float:
    """Mean |log(predicted / measured)| per source group, averaged over the groups: symmetric in
    over- and under-prediction, and each publication counts once. Rows of one table share their
    framework, cluster and authors' tuning, so they are not independent evidence: weighting rows
    equally would let the largest table (216 MosaicML rows) set every generation's constants."""
    errs = log_errors(cases, eff)
    by_group: dict[str, list[float]] = {}
    for c, e in zip(cases, errs, strict=True):
        by_group.setdefault(c.group, []).append(abs(e))
    return sum(sum(v) / len(v) for v in by_group.values()) / len(by_group)


@frozen
class FitResult:
    """Fitted constants per GPU generation, the pooled pair for a generation without rows, and
    the objective each reached (rows, mean |log error|)."""

    per_generation: dict[str, dict[str, float]]
    pooled: dict[str, float]
    scores: dict[str, tuple[int, float]] = field(default_factory=dict)

    def for_generation(self, gen: str) -> dict[str, float]:
        return self.per_generation.get(gen, self.pooled)


def _clip(name: str, x: float) -> float:
    lo, hi = BOUNDS[name]
    return min(hi, max(lo, x))


def fit_constants(cases: Sequence[Case], start: Efficiency | None = None) -> tuple[dict[str, float], float]:
    """The constants that minimise :func:`objective` over ``cases``: a coarse grid of the GEMM
    and attention efficiencies (skipped when ``start`` is given, e.g. the fit on more rows),
    then a compass search. The FP8 GEMM efficiency is fitted only on rows that train in FP8
    (others do not depend on it), starting from the catalog's FP8 / 16-bit ratio."""
    memo: dict[tuple[float, ...], float] = {}
    fp8 = any(c.scenario.plan.precision == "fp8" for c in cases)
    dims = FITTED if fp8 else FITTED[:2]

    def score(point: dict[str, float]) -> float:
        key = tuple(round(point[k], 6) for k in dims)
        if key not in memo:
            memo[key] = objective(cases, point)
        return memo[key]

    def with_fp8(point: dict[str, float]) -> dict[str, float]:
        if not fp8 or "fp8_gemm" in point:
            return point
        eff = cases[0].scenario.cluster.gpu.efficiency
        return {**point, "fp8_gemm": _clip("fp8_gemm", point["gemm"] * eff.get("fp8_gemm", eff["gemm"]) / eff["gemm"])}

    if start is None:
        grids = {k: [lo + (hi - lo) * i / (COARSE - 1) for i in range(COARSE)]
                 for k, (lo, hi) in BOUNDS.items()}
        points = [with_fp8({"gemm": g, "attention": a}) for g in grids["gemm"] for a in grids["attention"]]
        best = min(points, key=score)
        step = max((hi - lo) / (COARSE - 1) for lo, hi in BOUNDS.values()) / 2
    else:
        best = with_fp8({k: _clip(k, start[k]) for k in dims if k in start})
        step = WARM_STEP
    while step >= TOLERANCE:
        moved = False
        for k in dims:
            for sign in (1, -1):
                trial = {**best, k: _clip(k, best[k] + sign * step)}
                if score(trial) < score(best) - 1e-12:
                    best, moved = trial, True
        if not moved:
            step /= 2
    return {k: round(v, 4) for k, v in best.items() if k in dims}, score(best)


def fit(cases: Sequence[Case], start: FitResult | None = None, only: Iterable[str] | None = None) -> FitResult:
    """Fit every GPU generation among ``cases`` on its own rows; the pooled constants are their
    mean. ``start``: a previous fit to start each search from, whose generations not in
    ``only`` are copied as they are (their rows did not change)."""
    by_gen: dict[str, list[Case]] = {}
    for c in cases:
        if c.fitted:  # rows with terms the model does not price yet are scored, not fitted on
            by_gen.setdefault(c.gpu_generation, []).append(c)
    refit = set(by_gen) if only is None else set(only) & set(by_gen)
    per: dict[str, dict[str, float]] = {}
    scores: dict[str, tuple[int, float]] = {}
    for gen, rows in sorted(by_gen.items()):
        if start is not None and gen not in refit and gen in start.per_generation:
            per[gen], scores[gen] = start.per_generation[gen], start.scores.get(gen, (len(rows), math.nan))
            continue
        eff, s = fit_constants(rows, start.per_generation.get(gen) if start else None)
        per[gen], scores[gen] = eff, (len(rows), s)
    pooled = {k: round(sum(e[k] for e in per.values()) / len(per), 4) for k in FITTED[:2]} if per else {}
    return FitResult(per, pooled, scores)
