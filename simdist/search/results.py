"""What a search found: one PlanResult per evaluated plan, the SearchResult around them,
dominance (a plan another plan beats on both step time and memory) and the ranking."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from simdist.search.space import Candidate, Constraints
from simdist.spec.scenario import Scenario

Status = Literal["ranked", "does_not_fit", "dominated"]


@dataclass(kw_only=True)
class PlanResult:
    """One evaluated plan (a group representative)."""

    candidate: Candidate
    global_batch_size: int
    precision: str
    peak_gib: float
    capacity_gib: float
    fits: bool  # peak <= capacity (the contract's meaning)
    feasible: bool  # fits with the headroom kept free
    analytic_step_time_s: float | None = None
    des_step_time_s: float | None = None
    mfu: float | None = None
    status: Status = "does_not_fit"
    variants: int = 1
    equivalent: tuple[str, ...] = ()
    rank: int | None = None  # 1 = fastest

    @property
    def step_time_s(self) -> float | None:
        return self.des_step_time_s if self.des_step_time_s is not None else self.analytic_step_time_s

    @property
    def engine(self) -> str | None:
        if self.des_step_time_s is not None:
            return "des"
        return "analytic" if self.analytic_step_time_s is not None else None

    @property
    def plan(self) -> dict[str, Any]:
        return {**self.candidate.plan_fields(), "global_batch_size": self.global_batch_size,
                "precision": self.precision}

    def apply(self, scenario: Scenario) -> Scenario:
        """``scenario`` with this plan (validated again): to predict, trace or save it."""
        return scenario.with_plan(**self.candidate.plan_fields(), dp_shard=self.candidate.dp)

    def to_dict(self) -> dict[str, Any]:
        """One entry of the contract's ``plans`` list, plus extensions."""
        return {"plan": self.plan, "step_time_s": self.step_time_s, "mfu": self.mfu,
                "peak_gib": self.peak_gib, "fits": self.fits, "engine": self.engine,
                "analytic_step_time_s": self.analytic_step_time_s, "variants": self.variants,
                "equivalent_fields": list(self.equivalent), "label": self.candidate.label()}

    def to_row(self) -> dict[str, Any]:
        """A flat row (CSV, DataFrame, dashboard table and scatter)."""
        return {"rank": self.rank, "status": self.status, **self.candidate.plan_fields(),
                "step_time_s": self.step_time_s, "analytic_step_time_s": self.analytic_step_time_s,
                "des_step_time_s": self.des_step_time_s, "engine": self.engine, "mfu": self.mfu,
                "peak_gib": self.peak_gib, "fits": self.fits, "feasible": self.feasible,
                "variants": self.variants, "equivalent_fields": " ".join(self.equivalent),
                "label": self.candidate.label()}


ROW_FIELDS = tuple(PlanResult(candidate=Candidate(1, 1, 1, 1, 1, "1f1b", 0, False, "none", 1),
                              global_batch_size=1, precision="bf16", peak_gib=0.0, capacity_gib=0.0,
                              fits=True, feasible=True).to_row())


@dataclass(kw_only=True)
class SearchResult:
    """Everything a search found: plain data for the CLI, a CSV and the dashboard."""

    name: str
    world_size: int
    global_batch_size: int
    precision: str
    capacity_gib: float
    memory_headroom: float
    grid: int  # grid points considered (valid or not)
    evaluated: int  # representative plans sized by the memory model
    feasible: int  # of those, fitting with the headroom
    seconds: float
    engine: str  # what ordered the top: "des" or "analytic"
    rejected: dict[str, int]
    invalid_by_rule: dict[str, int]
    plans: list[PlanResult]  # the top K, fastest first
    evaluated_plans: list[PlanResult]  # every representative, ranked ones first
    baseline: PlanResult | None = None  # the scenario's own plan, timed the same way
    notes: list[str] = field(default_factory=list)
    counts_by_engine: dict[str, int] = field(default_factory=dict)

    @property
    def plans_per_s(self) -> float:
        return self.evaluated / self.seconds if self.seconds > 0 else float("inf")

    @property
    def best(self) -> PlanResult | None:
        return self.plans[0] if self.plans else None

    def to_dict(self) -> dict[str, Any]:
        """The contract's ``simdist search --json`` object, plus extensions."""
        return {"evaluated": self.evaluated, "feasible": self.feasible, "seconds": self.seconds,
                "plans": [p.to_dict() for p in self.plans],
                "name": self.name, "world_size": self.world_size,
                "global_batch_size": self.global_batch_size, "precision": self.precision,
                "capacity_gib": self.capacity_gib, "memory_headroom": self.memory_headroom,
                "plans_per_s": self.plans_per_s, "grid": self.grid, "engine": self.engine,
                "timed": dict(self.counts_by_engine), "rejected": dict(self.rejected),
                "invalid_by_rule": dict(self.invalid_by_rule),
                "baseline": self.baseline.to_dict() if self.baseline else None,
                "notes": list(self.notes)}

    def to_rows(self, which: Literal["top", "all"] = "all") -> list[dict[str, Any]]:
        """Flat rows (a CSV or a data frame): the top K, or every evaluated plan."""
        return [p.to_row() for p in (self.plans if which == "top" else self.evaluated_plans)]



# --- ranking ------------------------------------------------------------------------------


def mark_dominated(results: list[PlanResult]) -> None:
    """Mark feasible plans that another feasible plan beats on step time and memory (at least
    as good on both, better on one) as ``dominated``."""
    feasible = sorted((r for r in results if r.feasible),
                      key=lambda r: (r.analytic_step_time_s, r.peak_gib))
    best_mem, best_time = float("inf"), float("inf")
    for r in feasible:
        t = r.analytic_step_time_s
        assert t is not None
        if best_mem < r.peak_gib or (best_mem == r.peak_gib and best_time < t):
            r.status = "dominated"
        elif r.peak_gib < best_mem:
            best_mem, best_time = r.peak_gib, t


def rank_plans(results: list[PlanResult], c: Constraints) -> list[PlanResult]:
    mark_dominated(results)
    keep = ("ranked", "dominated") if c.keep_dominated else ("ranked",)
    ranked = [r for r in results if r.status in keep]
    ranked.sort(key=lambda r: (r.analytic_step_time_s, r.peak_gib))
    return ranked


def rerank_count(ranked: list[PlanResult], c: Constraints) -> int:
    """How many of the fastest plans the DES re-times: the top K, then those within
    ``rerank_window`` of the K-th plan's closed-form time, ``c.rerank_count`` at most. Plans
    further behind would need the DES to disagree with the closed form by more than the window
    to reach the top K; re-timing them would cost more than anything else in the search."""
    n = min(c.top, len(ranked))
    if n == 0:
        return 0
    limit = (1 + c.rerank_window) * (ranked[n - 1].analytic_step_time_s or 0.0)
    while n < min(c.rerank_count, len(ranked)) and (ranked[n].analytic_step_time_s or 0.0) <= limit:
        n += 1
    return n


