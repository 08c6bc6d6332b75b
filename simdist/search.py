"""Plan search: every valid parallel plan for a model, a cluster and a global batch, ranked by
predicted step time among those that fit in memory.

The search keeps the model, the cluster and the plan's ``global_batch_size`` and ``precision``
(and every plan field it does not search, such as ``flash_attention`` or the overlap switches)
from the scenario, and varies the rest (CONTRACT.md, ``simdist search``):

- ``tp``: divisors of the GPUs per node (a TP group inside one node) up to ``max_tp``; it must
  divide the attention heads, the KV heads and the MLP width.
- ``cp``: 1, 2, 4 ... up to ``max_cp`` (1 by default: context parallelism pays off only for
  long sequences); it must divide the sequence length.
- ``pp``: divisors of the GPUs left over; by default only those that also divide the layers
  (even stages). ``uneven_pp`` admits the rest (simdist splits them with
  ``stage_layer_ranges``), and an explicit ``pp`` list admits any ``pp <= layers``.
- ``dp`` = GPUs / (tp * pp * cp); the global batch must split into ``dp`` equal parts.
- ``micro_batch_size``: 1 .. ``max_micro_batch`` giving a whole number of micro-batches.
- ``schedule``: gpipe, 1f1b, zero-bubble (one chunk per stage) and interleaved-1f1b with
  ``v`` chunks per stage where ``pp * v`` divides the layers and the micro-batches per
  pipeline are a multiple of ``pp`` (Megatron-LM's rule).
- ``zero_stage`` 0-3, ``sequence_parallel`` on/off, ``recompute`` none/selective/full.

Ranking runs in three passes: the analytic memory model (microseconds per plan) drops plans
that do not fit in ``(1 - memory_headroom)`` of GPU memory; the closed-form engine times the
survivors; the discrete-event engine re-times the fastest few (when it is installed) and
orders them. Plans that the model cannot tell apart are grouped before anything is timed, one
representative per group with the number of variants it stands for (see ``canonical``), and a
plan that another fitting plan beats on both step time and memory is "dominated" and left out
of the ranking (kept in ``SearchResult.evaluated_plans``).

Beyond the top K, the DES re-times only plans within ``rerank_window`` of the K-th plan's
closed-form time (``rerank`` at most): one DES run of a deep pipeline with hundreds of
micro-batches costs seconds, as much as timing thousands of plans in closed form. The passes
run in ``workers`` forked processes (Linux), with results in the same order as serially.

Counting: every point of the grid above is either invalid (a rule fails), an equivalent
variant of a representative, or an evaluated representative; ``rejected`` counts the first
two, and the evaluated ones split into does-not-fit, dominated and ranked.

Not searched: ZeRO sharding always spans all of dp (``dp_shard`` = dp: the scenario's HSDP
group is not kept), and offload, gradient compression and the parameter-server modes stay as
the scenario has them (plans they rule out count as invalid, "rejected by the validator").
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal, NamedTuple

from simdist.analytic.flops import model_flops_per_step
from simdist.analytic.memory import stage_memory
from simdist.analytic.params import stage_layer_ranges
from simdist.analytic.steptime import analytic_step
from simdist.cost import CostModel
from simdist.errors import Problem, ScenarioError
from simdist.results import Prediction
from simdist.sim.collectives import Network
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import RECOMPUTE, SCHEDULES, ParallelPlan
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario, check_consistency
from simdist.units import GiB

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as plans are timed ("analytic", then "des")."""

RerankEngine = Literal["auto", "des", "analytic"]
SEARCHED_FIELDS = ("tp", "pp", "dp", "cp", "virtual_pipeline_stages", "schedule", "zero_stage",
                   "sequence_parallel", "recompute", "micro_batch_size")
PLAIN_SCHEDULES = ("1f1b", "gpipe", "zero-bubble")  # one chunk per stage; 1f1b represents pp=1


# --- constraints --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """What the user allows; problems are reported under the command-line flag's name."""

    max_tp: int | None = None  # None: the GPUs per node
    pp: tuple[int, ...] | None = None  # fixed pipeline sizes (uneven splits allowed)
    max_cp: int = 1
    uneven_pp: bool = False
    max_virtual_stages: int = 8
    max_micro_batch: int = 8
    schedules: tuple[str, ...] = SCHEDULES
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE
    memory_headroom: float = 0.0  # fraction of GPU memory kept free
    top: int = 10
    rerank: int | None = None  # most plans re-timed by the DES; None: max(20, top); 0: none
    # beyond the top K, the DES re-times only plans within this fraction of the K-th's time
    rerank_window: float = 0.2
    engine: RerankEngine = "auto"
    keep_dominated: bool = False

    @property
    def rerank_count(self) -> int:
        if self.rerank is None:
            return max(20, self.top)
        return 0 if self.rerank == 0 else max(self.rerank, self.top)

    def problems(self, scenario: Scenario) -> list[Problem]:
        """Every problem with these constraints for ``scenario``, each naming its flag."""
        out: list[Problem] = []
        for flag, value in (("--max-tp", self.max_tp), ("--max-cp", self.max_cp),
                            ("--max-virtual-stages", self.max_virtual_stages),
                            ("--max-micro-batch", self.max_micro_batch), ("--top", self.top)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                out.append(Problem(flag, f"must be a positive whole number, got {value!r}"))
        if self.rerank is not None and (isinstance(self.rerank, bool) or not isinstance(self.rerank, int)
                                        or self.rerank < 0):
            out.append(Problem("--rerank", f"must be a whole number >= 0, got {self.rerank!r}"))
        if not self.rerank_window >= 0:
            out.append(Problem("--rerank-window", f"must be a fraction >= 0, got {self.rerank_window!r}"))
        if not 0 <= self.memory_headroom < 1:
            out.append(Problem("--memory-headroom", f"must be a fraction in [0, 1), got {self.memory_headroom!r}"))
        out += _choice_problems("--schedules", self.schedules, SCHEDULES)
        out += _choice_problems("--zero-stages", self.zero_stages, (0, 1, 2, 3))
        out += _choice_problems("--recompute", self.recompute, RECOMPUTE)
        if self.engine not in ("auto", "des", "analytic"):
            out.append(Problem("--engine", f"{self.engine!r} is not one of auto, des, analytic"))
        out += _pp_problems(self.pp, scenario)
        return out


def _choice_problems(flag: str, values: tuple[Any, ...], allowed: tuple[Any, ...]) -> list[Problem]:
    if not values:
        return [Problem(flag, f"needs at least one of {', '.join(map(str, allowed))}")]
    return [Problem(flag, f"{v!r} is not one of {', '.join(map(str, allowed))}")
            for v in values if v not in allowed]


def _pp_problems(pp: tuple[int, ...] | None, sc: Scenario) -> list[Problem]:
    if pp is None:
        return []
    if not pp:
        return [Problem("--pp", "needs at least one pipeline size")]
    out = []
    world, layers = sc.world_size, sc.model.num_layers
    for p in pp:
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            out.append(Problem("--pp", f"must be positive whole numbers, got {p!r}"))
        elif world % p:
            out.append(Problem("--pp", f"{p} does not divide the cluster's {world} GPUs"))
        elif p > layers:
            out.append(Problem("--pp", f"{p} is more than model.num_layers ({layers})"))
    return out


# --- candidates and the grid --------------------------------------------------------------


class Candidate(NamedTuple):
    """The searched fields of one plan (a NamedTuple: cheap to build, hash and compare)."""

    tp: int
    pp: int
    dp: int
    cp: int
    v: int  # virtual pipeline stages (chunks per stage)
    schedule: str
    zero: int
    sp: bool
    recompute: str
    mbs: int

    def plan_fields(self) -> dict[str, Any]:
        """The fields as a scenario file's ``plan:`` section writes them."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp,
                "virtual_pipeline_stages": self.v, "schedule": self.schedule,
                "zero_stage": self.zero, "sequence_parallel": self.sp,
                "recompute": self.recompute, "micro_batch_size": self.mbs}

    def label(self) -> str:
        """Short form, e.g. ``TP8 PP16 DP8 v2 interleaved-1f1b Z0 full mb1``."""
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        parts += [f"CP{self.cp}"] if self.cp > 1 else []
        parts += [f"v{self.v}"] if self.v > 1 else []
        parts += [self.schedule, f"Z{self.zero}"] + (["SP"] if self.sp else [])
        return " ".join([*parts, self.recompute, f"mb{self.mbs}"])


PLAN_FIELD = dict(zip(Candidate._fields, SEARCHED_FIELDS, strict=True))
"""Candidate field -> the plan field it stands for (``v`` -> ``virtual_pipeline_stages`` ...)."""


def candidate_of(plan: ParallelPlan) -> Candidate:
    return Candidate(plan.tp, plan.pp, plan.dp, plan.cp, plan.virtual_pipeline_stages, plan.schedule,
                     plan.zero_stage, plan.sequence_parallel, plan.recompute, plan.micro_batch_size)


@dataclass
class Group:
    """A representative plan and the grid points it stands for."""

    variants: int = 0
    equivalent: set[str] = field(default_factory=set)  # fields whose value makes no difference


@dataclass
class Enumeration:
    groups: dict[Candidate, Group]
    grid: int  # every grid point: invalid + equivalent + len(groups)
    invalid: Counter[str]  # grid points rejected, by rule

    @property
    def equivalent(self) -> int:
        return sum(g.variants - 1 for g in self.groups.values())


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_grid(cluster: ClusterSpec, c: Constraints) -> list[int]:
    """TP sizes that tile nodes: divisors of the GPUs per node (or whole nodes, when max_tp asks)."""
    gpn, limit = cluster.gpus_per_node, c.max_tp or cluster.gpus_per_node
    return [t for t in divisors(cluster.world_size) if t <= limit and (gpn % t == 0 or t % gpn == 0)]


def cp_grid(world_left: int, c: Constraints) -> list[int]:
    out, cp = [], 1
    while cp <= c.max_cp and world_left % cp == 0:
        out.append(cp)
        cp *= 2
    return out


def pp_grid(model: ModelSpec, world_left: int, c: Constraints) -> list[int]:
    if c.pp is not None:
        return sorted(set(c.pp))
    return [p for p in divisors(world_left)
            if p <= model.num_layers and (c.uneven_pp or model.num_layers % p == 0)]


def pipeline_grid(model: ModelSpec, pp: int, c: Constraints) -> list[tuple[str, int]]:
    """(schedule, chunks per stage) pairs to try for ``pp`` stages."""
    out = [(s, 1) for s in PLAIN_SCHEDULES if s in c.schedules]
    if pp > 1 and "interleaved-1f1b" in c.schedules:
        out += [("interleaved-1f1b", v) for v in range(2, c.max_virtual_stages + 1)
                if model.num_layers % (pp * v) == 0]
    return out


def layout_problem(model: ModelSpec, tp: int, cp: int, pp: int, world_left: int) -> str | None:
    """Why a (tp, cp, pp) layout is invalid, or None; ``world_left`` = GPUs / (tp * cp)."""
    if model.num_attention_heads % tp or model.num_kv_heads % tp:
        return "tp does not divide the attention heads"
    if model.ffn_hidden_size % tp:
        return "tp does not divide ffn_hidden_size"
    if model.seq_length % cp:
        return "cp does not divide seq_length"
    if world_left % pp:
        return "pp does not divide the GPUs left by tp*cp"
    if pp > model.num_layers:
        return "pp is more than the layers"
    return None


def canonical(cand: Candidate, flash_attention: bool, c: Constraints) -> Candidate:
    """The representative of the plans the model cannot tell apart from ``cand``.

    Exact in both the memory model and the closed-form step time (a test checks each rule); the
    discrete-event engine agrees too, except that it times zero-bubble at pp = 1 a little slower
    than 1f1b, the representative:
    - pp = 1: the schedule makes no difference (one stage, no pipeline);
    - tp = 1: sequence parallelism makes no difference (nothing to split);
    - FlashAttention: selective recompute re-runs only the attention core, which fused
      attention never stores, so it equals no recompute;
    - dp = 1: ZeRO stages 0-2 shard nothing (stage 3 still holds gather buffers: it stays apart).
    """
    if cand.pp == 1 and cand.schedule in PLAIN_SCHEDULES:
        cand = cand._replace(schedule=next(s for s in PLAIN_SCHEDULES if s in c.schedules))
    if cand.tp == 1 and cand.sp:
        cand = cand._replace(sp=False)
    if flash_attention and cand.recompute == "selective" and "none" in c.recompute:
        cand = cand._replace(recompute="none")
    if cand.dp == 1 and cand.zero <= 2:
        cand = cand._replace(zero=min(z for z in c.zero_stages if z <= 2))
    return cand


def _layouts(model: ModelSpec, cluster: ClusterSpec, c: Constraints) -> Iterator[tuple[int, int, int, int]]:
    """(tp, cp, pp, world_left) for every layout of the grid."""
    world = cluster.world_size
    for tp in tp_grid(cluster, c):
        for cp in cp_grid(world // tp, c):
            left = world // (tp * cp)
            for pp in pp_grid(model, left, c):
                yield tp, cp, pp, left


def enumerate_plans(model: ModelSpec, cluster: ClusterSpec, global_batch: int, c: Constraints,
                    flash_attention: bool = True) -> Enumeration:
    """Walk the grid (module docstring) and group its valid points by ``canonical``."""
    groups: dict[Candidate, Group] = {}
    invalid: Counter[str] = Counter()
    grid = 0
    knobs = len(c.zero_stages) * 2 * len(c.recompute)
    for tp, cp, pp, left in _layouts(model, cluster, c):
        pipes = pipeline_grid(model, pp, c)
        per_mbs = len(pipes) * knobs
        grid += c.max_micro_batch * per_mbs
        problem = layout_problem(model, tp, cp, pp, left)
        if problem:
            invalid[problem] += c.max_micro_batch * per_mbs
            continue
        dp = left // pp
        for mbs in range(1, c.max_micro_batch + 1):
            if global_batch % (mbs * dp):
                invalid["global batch does not split into micro_batch_size*dp"] += per_mbs
                continue
            m = global_batch // (mbs * dp)
            for schedule, v in pipes:
                if schedule == "interleaved-1f1b" and m % pp:
                    invalid["interleaved-1f1b needs micro-batches a multiple of pp"] += knobs
                    continue
                _add_knobs(groups, Candidate(tp, pp, dp, cp, v, schedule, 0, False, "none", mbs),
                           flash_attention, c)
    return Enumeration(groups, grid, invalid)


def _add_knobs(groups: dict[Candidate, Group], base: Candidate, flash: bool, c: Constraints) -> None:
    for zero in c.zero_stages:
        for sp in (False, True):
            for rc in c.recompute:
                cand = base._replace(zero=zero, sp=sp, recompute=rc)
                rep = canonical(cand, flash, c)
                group = groups.get(rep)
                if group is None:
                    group = groups[rep] = Group()
                group.variants += 1
                if rep != cand:
                    group.equivalent.update(PLAN_FIELD[f] for f, a, b in zip(Candidate._fields, rep, cand,
                                                                             strict=True) if a != b)


# --- evaluation ---------------------------------------------------------------------------


@cache
def distinct_stages(num_layers: int, pp: int, v: int) -> tuple[int, ...]:
    """The first stage of each kind: stages that hold the same number of layers in each chunk,
    and are alike in holding the embedding (first) or the LM head (last), hold the same states
    and differ only in the micro-batches in flight, which never grow with the stage index
    (simdist.analytic.memory.in_flight), so the first of each kind has the largest peak."""
    ranges = stage_layer_ranges(num_layers, pp, v)
    firsts: dict[tuple[bool, bool, tuple[int, ...]], int] = {}
    for s in range(pp):
        firsts.setdefault((s == 0, s == pp - 1, tuple(len(r) for r in ranges[s])), s)
    return tuple(firsts.values())


def peak_memory(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None
                ) -> tuple[float, float]:
    """(GPU bytes, host bytes) at the peak over the pipeline stages: the same maximum as
    ``memory_per_stage`` (a test checks it), sizing one stage of each kind only."""
    kinds = distinct_stages(model.num_layers, plan.pp, plan.virtual_pipeline_stages)
    stages = [stage_memory(model, plan, s, cluster) for s in kinds]
    return max(s.peak for s in stages), max(s.host for s in stages)


class Evaluator:
    """Times and sizes candidates of one scenario with one cost model and network."""

    def __init__(self, scenario: Scenario, profile: CalibrationProfile | None = None):
        self.scenario, self.profile = scenario, profile
        self.model, self.cluster = scenario.model, scenario.cluster
        self.base_plan = scenario.plan
        self.cost = CostModel(self.cluster.gpu, self.base_plan.precision, profile)
        self.net = Network.of(self.cluster, profile)
        self.capacity = self.cluster.gpu.memory_bytes
        self.host_capacity = (self.cluster.host.cpu_memory_bytes / self.cluster.gpus_per_node
                              if self.cluster.host is not None else None)

    def plan(self, cand: Candidate) -> ParallelPlan:
        """The scenario's plan with the searched fields of ``cand`` (ZeRO shards over all of dp)."""
        return replace(self.base_plan, tp=cand.tp, pp=cand.pp, dp=cand.dp, cp=cand.cp,
                       virtual_pipeline_stages=cand.v, schedule=cand.schedule, zero_stage=cand.zero,
                       sequence_parallel=cand.sp, recompute=cand.recompute,
                       micro_batch_size=cand.mbs, dp_shard=cand.dp)

    def problems(self, plan: ParallelPlan) -> list[Problem]:
        return check_consistency(self.model, self.cluster, plan)

    def memory(self, plan: ParallelPlan) -> tuple[float, float]:
        """(peak GPU bytes, peak host bytes) over the pipeline stages."""
        return peak_memory(self.model, plan, self.cluster)

    def fits(self, peak: float, host: float, headroom: float = 0.0) -> bool:
        ok = peak <= self.capacity * (1 - headroom)
        if host > 0 and self.host_capacity is not None:
            ok = ok and host <= self.host_capacity
        return ok

    def analytic_time(self, plan: ParallelPlan) -> float:
        return analytic_step(replace(self.scenario, plan=plan), self.cost, self.net).step_time

    def des(self, plan: ParallelPlan) -> Prediction:
        from simdist.predict import predict

        return predict(replace(self.scenario, plan=plan), self.profile, engine="des", keep_spans=False)

    def mfu(self, plan: ParallelPlan, step_time: float) -> float:
        flops = model_flops_per_step(self.model, plan)
        return flops / (step_time * self.cluster.world_size * self.cost.peak)


# --- results ------------------------------------------------------------------------------

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
        """Flat rows (``pandas.DataFrame(rows)``): the top K, or every evaluated plan."""
        return [p.to_row() for p in (self.plans if which == "top" else self.evaluated_plans)]


# --- running plans in worker processes ---------------------------------------------------

_WORKER_EVALUATOR: Evaluator | None = None


def _init_worker(scenario: Scenario, profile: CalibrationProfile | None) -> None:
    global _WORKER_EVALUATOR
    _WORKER_EVALUATOR = Evaluator(scenario, profile)


def _in_worker(task: tuple[Callable[[Evaluator, Any], Any], Any]) -> Any:
    fn, item = task
    assert _WORKER_EVALUATOR is not None
    return fn(_WORKER_EVALUATOR, item)


def default_workers() -> int:
    """Worker processes: the CPUs this process may use (up to 8) on Linux, where they are forked
    with every cache already warm; 1 (no pool) elsewhere."""
    if sys.platform != "linux":
        return 1
    return max(1, min(8, len(os.sched_getaffinity(0))))


class Runner:
    """Maps ``fn(evaluator, item)`` over items, in forked worker processes when ``workers > 1``.
    Results come back in the order of the items, so a search gives the same answer with any
    number of workers."""

    def __init__(self, scenario: Scenario, profile: CalibrationProfile | None, workers: int | None):
        self.scenario, self.profile = scenario, profile
        self.ev = Evaluator(scenario, profile)
        self.workers = default_workers() if workers is None else max(1, workers)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(self, fn: Callable[[Evaluator, Any], Any], items: list[Any]) -> Iterator[Any]:
        if self.workers <= 1 or len(items) <= 1:
            return (fn(self.ev, item) for item in items)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers, mp_context=multiprocessing.get_context("fork"),
                initializer=_init_worker, initargs=(self.scenario, self.profile))
        return self._pool.map(_in_worker, [(fn, item) for item in items])


# --- the search ---------------------------------------------------------------------------


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
    engine, notes = _rerank_engine(c)
    plan0 = scenario.plan
    enum = enumerate_plans(scenario.model, scenario.cluster, plan0.global_batch_size, c, plan0.flash_attention)
    with Runner(scenario, profile, workers) as runner:
        results = _evaluate_all(runner, enum, c, progress)
        ranked = _rank(results, c)
        baseline = _baseline(runner.ev, c)
        if engine == "des":
            ranked = _rerank(runner, ranked, rerank_count(ranked, c), baseline, progress, notes)
    for i, r in enumerate(ranked, 1):
        r.rank = i
    return _result(scenario, c, enum, results, ranked, baseline, engine, notes,
                   time.perf_counter() - start)


def _check_inputs(sc: Scenario, c: Constraints, profile: CalibrationProfile | None) -> None:
    problems = c.problems(sc)
    if sc.requires_profile and profile is None:
        problems.append(Problem("cluster.preset", "the local cluster's speed comes from a calibration "
                                "profile: run `simdist calibrate` and pass --profile"))
    if problems:
        raise ScenarioError(problems)


_CHUNK = 128  # plans per task of the closed-form pass


def _evaluate_all(runner: Runner, enum: Enumeration, c: Constraints,
                  progress: Progress | None) -> list[PlanResult]:
    """Memory for every representative, the closed-form step time for those that fit."""
    items = [(cand, g.variants, tuple(sorted(g.equivalent))) for cand, g in enum.groups.items()]
    chunks = [(items[i:i + _CHUNK], c.memory_headroom) for i in range(0, len(items), _CHUNK)]
    out: list[PlanResult] = []
    done = 0
    for chunk_results in runner.map(_evaluate_chunk, chunks):
        for r in chunk_results:
            if isinstance(r, PlanResult):
                out.append(r)
            else:  # the grid's rules missed a cross-field check: count it as invalid
                cand, field_name = r
                enum.invalid[f"rejected by the validator ({field_name})"] += enum.groups.pop(cand).variants
        done += len(chunk_results)
        if progress:
            progress("analytic", done, len(items))
    return out


def _evaluate_chunk(ev: Evaluator, task: tuple[list[tuple[Candidate, int, tuple[str, ...]]], float]
                    ) -> list[PlanResult | tuple[Candidate, str]]:
    chunk, headroom = task
    return [_evaluate(ev, cand, variants, equivalent, headroom) for cand, variants, equivalent in chunk]


def _evaluate(ev: Evaluator, cand: Candidate, variants: int, equivalent: tuple[str, ...],
              headroom: float) -> PlanResult | tuple[Candidate, str]:
    plan = ev.plan(cand)
    problems = ev.problems(plan)
    if problems:
        return cand, problems[0].field
    peak, host = ev.memory(plan)
    feasible = ev.fits(peak, host, headroom)
    result = PlanResult(candidate=cand, global_batch_size=plan.global_batch_size, precision=plan.precision,
                        peak_gib=peak / GiB, capacity_gib=ev.capacity / GiB, fits=ev.fits(peak, host),
                        feasible=feasible, variants=variants, equivalent=equivalent)
    if feasible:
        t = ev.analytic_time(plan)
        result.analytic_step_time_s, result.mfu, result.status = t, ev.mfu(plan, t), "ranked"
    return result


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


def _rank(results: list[PlanResult], c: Constraints) -> list[PlanResult]:
    mark_dominated(results)
    keep = ("ranked", "dominated") if c.keep_dominated else ("ranked",)
    ranked = [r for r in results if r.status in keep]
    ranked.sort(key=lambda r: (r.analytic_step_time_s, r.peak_gib))
    return ranked


def des_available() -> tuple[bool, str]:
    """Whether the discrete-event engine can be imported (and why not)."""
    try:
        import simdist.sim.engine  # noqa: F401
    except Exception as exc:  # the engine is optional: fall back to the closed form
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def _rerank_engine(c: Constraints) -> tuple[str, list[str]]:
    if c.engine == "analytic" or c.rerank_count == 0:
        return "analytic", []
    ok, why = des_available()
    if ok:
        return "des", []
    if c.engine == "des":
        raise ScenarioError(Problem("--engine", f"the discrete-event engine is not available ({why})"))
    return "analytic", [f"ranked by the closed-form engine only: the discrete-event engine is not available ({why})"]


def _des_time(ev: Evaluator, plan: ParallelPlan) -> tuple[float | None, str]:
    """The discrete-event step time of ``plan``, or None and why it failed."""
    try:
        return ev.des(plan).step_time_s, ""
    except Exception as exc:  # one failing plan must not lose the whole search
        return None, f"{type(exc).__name__}: {exc}"


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


def _des_cost(plan: ParallelPlan) -> int:
    """Rough relative cost of simulating ``plan``: the events grow with the pipeline's tasks."""
    return plan.num_microbatches * plan.pp * plan.virtual_pipeline_stages


def _rerank(runner: Runner, ranked: list[PlanResult], n: int, baseline: PlanResult,
            progress: Progress | None, notes: list[str]) -> list[PlanResult]:
    """Re-time the ``n`` fastest plans (and the baseline) with the discrete-event engine and
    order those ``n`` by it; the rest keep their closed-form order behind them."""
    head = ranked[:n]
    todo = [(r, runner.ev.plan(r.candidate)) for r in head] + [(baseline, runner.ev.base_plan)]
    todo.sort(key=lambda rp: -_des_cost(rp[1]))  # longest first: the workers finish together
    plans = [plan for _, plan in todo]
    for i, ((r, plan), (t, error)) in enumerate(zip(todo, runner.map(_des_time, plans), strict=True), 1):
        if t is None:
            notes.append(f"{r.candidate.label()}: the discrete-event engine failed ({error}); "
                         "kept its closed-form time")
        else:
            r.des_step_time_s, r.mfu = t, runner.ev.mfu(plan, t)
        if progress:
            progress("des", i, len(todo))
    head.sort(key=lambda r: (r.step_time_s, r.peak_gib))
    return head + ranked[n:]


def _baseline(ev: Evaluator, c: Constraints) -> PlanResult:
    """The scenario's own plan, sized and timed by the closed form (the DES re-times it with
    the top plans)."""
    plan = ev.base_plan
    peak, host = ev.memory(plan)
    t = ev.analytic_time(plan)
    return PlanResult(candidate=candidate_of(plan), global_batch_size=plan.global_batch_size,
                      precision=plan.precision, peak_gib=peak / GiB, capacity_gib=ev.capacity / GiB,
                      fits=ev.fits(peak, host), feasible=ev.fits(peak, host, c.memory_headroom),
                      analytic_step_time_s=t, mfu=ev.mfu(plan, t), status="ranked")


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
