"""``search()``: the three passes over the search space.

Ranking runs in three passes: the analytic memory model (microseconds per plan) drops plans
that do not fit in ``(1 - memory_headroom)`` of GPU memory; the closed-form engine times the
survivors; the discrete-event engine re-times the fastest few and orders them. Beyond the top
K, the DES considers only plans within ``rerank_window`` of the K-th plan's closed-form time
(``rerank`` at most): one DES run of a deep pipeline with hundreds of micro-batches costs
seconds, as much as timing thousands of plans in closed form. Of those, it re-times only the
plans that can still reach the top ``rerank_exact`` places (by default the winner): a lower
bound on the step time that holds in both engines (simdist.search.bounds) rules the others out.
"""

from __future__ import annotations

import time
from bisect import insort
from collections import Counter

from simdist.errors import Problem, ScenarioError
from simdist.search.evaluate import Progress, Runner, baseline, des_cost, des_time, evaluate_all
from simdist.search.results import PlanResult, SearchResult, rank_plans, rerank_count
from simdist.search.space import Constraints, Enumeration, enumerate_plans
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario
from simdist.units import GiB


def search(scenario: Scenario, constraints: Constraints | None = None, progress: Progress | None = None,
           profile: CalibrationProfile | None = None, workers: int | None = None) -> SearchResult:
    """Find the fastest plans for ``scenario``'s model, cluster, global batch and precision.

    ``progress(stage, done, total)`` is called as plans are timed; ``workers`` processes share
    the work (default: ``default_workers()``; 1 runs everything in this process). Raises
    ScenarioError, each problem naming its flag, for bad constraints.
    """
    c = constraints or Constraints()
    _check_inputs(scenario, c, profile)
    start = time.perf_counter()
    engine, notes = _rerank_engine(c), []
    plan0 = scenario.plan
    enum = enumerate_plans(scenario.model, scenario.cluster, plan0.global_batch_size, c, plan0.flash_attention)
    with Runner(scenario, profile, workers) as runner:
        results = evaluate_all(runner, enum, c, progress)
        ranked = rank_plans(results, c)
        base = baseline(runner.ev, c)
        if engine == "des":
            ranked = _rerank(runner, ranked, rerank_count(ranked, c), c.rerank_exact, base, progress, notes)
    for i, r in enumerate(ranked, 1):
        r.rank = i
    return _result(scenario, c, enum, results, ranked, base, engine, notes,
                   time.perf_counter() - start)


def _check_inputs(sc: Scenario, c: Constraints, profile: CalibrationProfile | None) -> None:
    problems = c.problems(sc)
    if sc.requires_profile and profile is None:
        problems.append(Problem("cluster.preset", "the local cluster's speed comes from a calibration "
                                "profile: run `simdist calibrate` and pass --profile"))
    if problems:
        raise ScenarioError(problems)


def _rerank_engine(c: Constraints) -> str:
    """The engine that orders the top plans: the closed form alone when asked for (or when
    nothing is re-ranked), else the discrete-event engine ("auto" and "des")."""
    return "analytic" if c.engine == "analytic" or c.rerank_count == 0 else "des"


def _rerank(runner: Runner, ranked: list[PlanResult], n: int, exact: int, baseline: PlanResult,
            progress: Progress | None, notes: list[str]) -> list[PlanResult]:
    """Re-time the ``n`` fastest plans (and the baseline) with the discrete-event engine, by
    branch and bound: in the order of a lower bound on their step time in either engine
    (simdist.search.bounds), skipping a plan once both its bound and its closed-form time exceed
    the ``exact``-th best time found so far (the event engine's, or the closed form's for a plan
    it failed on): the plan cannot reach the top ``exact`` places, and keeps its closed-form time.
    The ``n`` are then ordered by their times (the event engine's where it ran), so the top
    ``exact`` places are those that re-timing all ``n`` gives; behind them, plans the event engine
    did not re-time stand at their closed-form times. With ``workers`` processes, up to that many
    plans are re-timed at once (the skipped ones can then differ; the top places cannot)."""
    head = ranked[:n]
    plans = {id(r): runner.ev.plan(r.candidate) for r in head}
    bound = {id(r): runner.ev.lower_bound(plans[id(r)]) for r in head}
    queue = sorted(head, key=lambda r: (bound[id(r)], r.analytic_step_time_s))
    todo: list[tuple[PlanResult, ParallelPlan]] = [(baseline, runner.ev.base_plan)]
    best: list[float] = []  # event-engine times so far, fastest first
    done, total = 0, len(head) + 1
    while True:
        if len(best) >= exact:  # beyond the exact-th time by both engines: cannot reach those places
            limit = best[exact - 1]
            queue = [r for r in queue if bound[id(r)] <= limit or (r.analytic_step_time_s or 0.0) <= limit]
        while queue and len(todo) < runner.workers:
            r = queue.pop(0)
            todo.append((r, plans[id(r)]))
        if not todo:
            break
        todo.sort(key=lambda rp: -des_cost(rp[1]))  # longest first: the workers finish together
        for (r, plan), (t, error) in zip(todo, runner.map(des_time, [plan for _, plan in todo]), strict=True):
            if t is None:
                notes.append(f"{r.candidate.label()}: the discrete-event engine failed ({error}); "
                             "kept its closed-form time")
                t = r.analytic_step_time_s  # a failed plan counts at its closed-form time (as before)
            else:
                r.des_step_time_s, r.mfu = t, runner.ev.mfu(plan, t)
            if r is not baseline and t is not None:
                insort(best, t)
            done += 1
            if progress:
                progress("des", done, total)
        todo = []
    if progress and done < total:
        progress("des", total, total)
    head.sort(key=lambda r: (r.step_time_s, r.peak_gib))
    return head + ranked[n:]


def _result(sc: Scenario, c: Constraints, enum: Enumeration, results: list[PlanResult],
            ranked: list[PlanResult], baseline: PlanResult, engine: str, notes: list[str],
            seconds: float) -> SearchResult:
    status = Counter(r.status for r in results)
    rest = [r for r in results if r.rank is None]
    rest.sort(key=lambda r: (r.status != "dominated", r.step_time_s or float("inf"), r.peak_gib))
    return SearchResult(
        name=sc.name, world_size=sc.world_size, global_batch_size=sc.plan.global_batch_size,
        precision=sc.plan.precision, capacity_gib=sc.cluster.gpu.memory_bytes / GiB,
        memory_headroom=c.memory_headroom, grid=enum.grid, evaluated=len(results),
        feasible=sum(r.feasible for r in results), seconds=seconds, engine=engine,
        rejected={"invalid": sum(enum.invalid.values()), "equivalent": enum.equivalent,
                  "does_not_fit": status["does_not_fit"],
                  "dominated": 0 if c.keep_dominated else status["dominated"]},
        invalid_by_rule=dict(enum.invalid.most_common()),
        plans=ranked[:c.top], evaluated_plans=ranked + rest, baseline=baseline, notes=notes,
        counts_by_engine={"analytic": sum(r.analytic_step_time_s is not None for r in results),
                          "des": sum(r.des_step_time_s is not None for r in results)},
    )
