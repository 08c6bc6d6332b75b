"""The search space: what the user allows (Constraints), the grid of plans it spans, and the
grouping of plans the model cannot tell apart (``canonical``) into one representative each.

The grid, for a model, a cluster and a global batch:

- ``tp``: divisors of the GPUs per node (a TP group inside one node) up to ``max_tp``; it must
  divide the attention heads, the KV heads and the MLP width.
- ``cp``: 1, 2, 4 ... up to ``max_cp`` (by default 8 for sequences of 16K tokens or more, else
  1: context parallelism pays off only for long sequences); it must divide the sequence length.
- ``pp``: divisors of the GPUs left over; by default only those that also divide the layers
  (even stages). ``uneven_pp`` admits the rest (simdist splits them with
  ``stage_layer_ranges``), and an explicit ``pp`` list admits any ``pp <= layers``.
- ``dp`` = GPUs / (tp * pp * cp); the global batch must split into ``dp`` equal parts.
- ``micro_batch_size``: 1 .. ``max_micro_batch`` giving a whole number of micro-batches.
- ``schedule``: gpipe, 1f1b, zero-bubble (one chunk per stage) and interleaved-1f1b with
  ``v`` chunks per stage where ``pp * v`` divides the layers and the micro-batches per
  pipeline are a multiple of ``pp`` (Megatron-LM's rule).
- ``zero_stage`` 0-3, ``sequence_parallel`` on/off, ``recompute`` none/selective/full.
- with experts: ``ep`` over the divisors of tp*cp*dp that divide the experts (up to ``max_ep``),
  ``etp`` up to ``max_etp`` (1 by default) with etp*ep dividing tp*cp*dp (Megatron-Core's MoE
  parallel folding), and the ``dualpipe`` / ``dualpipev`` schedules (at least 2*pp micro-batches;
  DualPipe an even pp and micro-batch count).

Counting: every point of the grid is either invalid (a rule fails; counted by rule), an
equivalent variant of a representative, or a representative (``Enumeration``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from simdist.errors import Problem
from simdist.frozen import frozen
from simdist.predict import MAX_VIRTUAL_STAGES
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import RECOMPUTE, SCHEDULES, ParallelPlan
from simdist.spec.scenario import Scenario

RerankEngine = Literal["auto", "des", "analytic"]
SEARCHED_FIELDS = ("tp", "pp", "dp", "cp", "virtual_pipeline_stages", "schedule", "zero_stage",
                   "sequence_parallel", "recompute", "micro_batch_size", "ep", "etp")
LONG_SEQUENCE = 16384  # tokens from which the default search tries context parallelism
PLAIN_SCHEDULES = ("1f1b", "gpipe", "zero-bubble")  # one chunk per stage; 1f1b represents pp=1


# --- constraints --------------------------------------------------------------------------


@frozen(kw_only=True)
class Constraints:
    """What the user allows; problems are reported under the command-line flag's name."""

    max_tp: int | None = None  # None: the GPUs per node
    pp: tuple[int, ...] | None = None  # fixed pipeline sizes (uneven splits allowed)
    max_cp: int | None = None  # None: 8 for sequences of LONG_SEQUENCE tokens or more, else 1
    max_ep: int | None = None  # None: every expert-parallel size (models with experts)
    max_etp: int = 1
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
    # the top places the DES orders for certain (1: the winner); a plan whose lower bound on the
    # step time (simdist.search.bounds) exceeds the DES time of the rerank_exact-th is not re-timed
    rerank_exact: int = 1
    engine: RerankEngine = "auto"  # auto: the discrete-event engine re-ranks the top (as des)
    keep_dominated: bool = False

    @property
    def rerank_count(self) -> int:
        if self.rerank is None:
            return max(20, self.top)
        return 0 if self.rerank == 0 else max(self.rerank, self.top)

    def problems(self, scenario: Scenario) -> list[Problem]:
        """Every problem with these constraints for ``scenario``, each naming its flag."""
        out: list[Problem] = []
        for flag, value in (("--max-tp", self.max_tp), ("--max-cp", self.max_cp), ("--max-ep", self.max_ep),
                            ("--max-etp", self.max_etp),
                            ("--max-virtual-stages", self.max_virtual_stages),
                            ("--max-micro-batch", self.max_micro_batch), ("--top", self.top),
                            ("--rerank-exact", self.rerank_exact)):
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
        out += _size_problems(self, scenario)
        return out


MAX_MICRO_BATCH = 4096  # the grid walks 1 .. max_micro_batch
MAX_SEARCH_GPUS = 2**40  # the grid lists divisors of the GPU count (sqrt(n) trials each)


def _size_problems(c: Constraints, sc: Scenario) -> list[Problem]:
    """The bounds that keep the grid and each plan's closed form finite (issue 20)."""
    out = []
    if isinstance(c.max_virtual_stages, int) and c.max_virtual_stages > MAX_VIRTUAL_STAGES:
        out.append(Problem("--max-virtual-stages", f"at most {MAX_VIRTUAL_STAGES:,}"))
    if any(isinstance(p, int) and p > MAX_VIRTUAL_STAGES for p in c.pp or ()):
        out.append(Problem("--pp", f"at most {MAX_VIRTUAL_STAGES:,} pipeline stages"))
    if isinstance(c.max_micro_batch, int) and c.max_micro_batch > MAX_MICRO_BATCH:
        out.append(Problem("--max-micro-batch", f"at most {MAX_MICRO_BATCH:,}"))
    if sc.world_size > MAX_SEARCH_GPUS:
        out.append(Problem("cluster.num_nodes", f"{sc.world_size:,} GPUs: the search handles at most "
                           f"{MAX_SEARCH_GPUS:,}"))
    chunks = sc.plan.pp * sc.plan.virtual_pipeline_stages
    if chunks > MAX_VIRTUAL_STAGES:
        out.append(Problem("plan.pp", f"pp x virtual stages = {chunks:,}; at most {MAX_VIRTUAL_STAGES:,}"))
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
    ep: int = 1  # expert parallelism (models with experts)
    etp: int = 1

    def plan_fields(self) -> dict[str, Any]:
        """The fields as a scenario file's ``plan:`` section writes them."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp,
                "virtual_pipeline_stages": self.v, "schedule": self.schedule,
                "zero_stage": self.zero, "sequence_parallel": self.sp,
                "recompute": self.recompute, "micro_batch_size": self.mbs, "ep": self.ep, "etp": self.etp}

    def label(self) -> str:
        """Short form, e.g. ``TP8 PP16 DP8 v2 interleaved-1f1b Z0 full mb1``."""
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        parts += [f"CP{self.cp}"] if self.cp > 1 else []
        parts += [f"EP{self.ep}"] if self.ep > 1 else []
        parts += [f"ETP{self.etp}"] if self.etp > 1 else []
        parts += [f"v{self.v}"] if self.v > 1 else []
        parts += [self.schedule, f"Z{self.zero}"] + (["SP"] if self.sp else [])
        return " ".join([*parts, self.recompute, f"mb{self.mbs}"])


PLAN_FIELD = dict(zip(Candidate._fields, SEARCHED_FIELDS, strict=True))
"""Candidate field -> the plan field it stands for (``v`` -> ``virtual_pipeline_stages`` ...)."""


def candidate_of(plan: ParallelPlan) -> Candidate:
    return Candidate(plan.tp, plan.pp, plan.dp, plan.cp, plan.virtual_pipeline_stages, plan.schedule,
                     plan.zero_stage, plan.sequence_parallel, plan.recompute, plan.micro_batch_size,
                     plan.ep, plan.etp)


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


def cp_grid(world_left: int, c: Constraints, seq_length: int = 0) -> list[int]:
    limit = c.max_cp if c.max_cp is not None else (8 if seq_length >= LONG_SEQUENCE else 1)
    out, cp = [], 1
    while cp <= limit and world_left % cp == 0:
        out.append(cp)
        cp *= 2
    return out


def pp_grid(model: ModelSpec, world_left: int, c: Constraints) -> list[int]:
    if c.pp is not None:
        return sorted(p for p in set(c.pp) if p <= MAX_VIRTUAL_STAGES)
    return [p for p in divisors(world_left) if p <= min(model.num_layers, MAX_VIRTUAL_STAGES)
            and (c.uneven_pp or model.num_layers % p == 0)]


def pipeline_grid(model: ModelSpec, pp: int, c: Constraints) -> list[tuple[str, int]]:
    """(schedule, chunks per stage) pairs to try for ``pp`` stages."""
    out = [(s, 1) for s in PLAIN_SCHEDULES if s in c.schedules]
    if pp > 1 and "interleaved-1f1b" in c.schedules:
            out += [("interleaved-1f1b", v) for v in range(2, min(c.max_virtual_stages, MAX_VIRTUAL_STAGES // pp) + 1)
                if model.num_layers % (pp * v) == 0]
    if pp > 1 and model.is_moe:  # DeepSeek-V3's schedules hide the expert all-to-all
        out += [(s, 1) for s in ("dualpipe", "dualpipev") if s in c.schedules]
    return out


def expert_grid(model: ModelSpec, ranks: int, c: Constraints) -> list[tuple[int, int]]:
    """(ep, etp) pairs for a stage of ``ranks`` = tp*cp*dp GPUs: ep divides the experts, etp the
    expert FFN, etp*ep the ranks (MoE parallel folding); (1, 1) for a dense model."""
    if not model.is_moe:
        return [(1, 1)]
    eps = [e for e in divisors(ranks) if model.num_experts % e == 0 and (c.max_ep is None or e <= c.max_ep)]
    etps = [t for t in divisors(ranks) if t <= c.max_etp and model.moe_ffn_hidden_size % t == 0]
    return [(e, t) for e in eps for t in etps if ranks % (e * t) == 0]


def schedule_problem(schedule: str, pp: int, m: int, layers: int) -> str | None:
    """Why a pipeline schedule cannot run ``m`` micro-batches on ``pp`` stages, or None."""
    if schedule == "interleaved-1f1b" and m % pp:
        return "interleaved-1f1b needs micro-batches a multiple of pp"
    if schedule in ("dualpipe", "dualpipev") and m < 2 * pp:
        return "dualpipe needs at least 2*pp micro-batches"
    if schedule == "dualpipe" and (pp % 2 or m % 2):
        return "dualpipe needs an even pp and an even number of micro-batches"
    if schedule == "dualpipev" and 2 * pp > layers:
        return "dualpipev needs 2*pp <= the layers"
    return None


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


def canonical(cand: Candidate, flash_attention: bool, c: Constraints, experts: bool = False) -> Candidate:
    """The representative of the plans the model cannot tell apart from ``cand``.

    Exact in both the memory model and the closed-form step time (a test checks each rule); the
    discrete-event engine agrees too, except that it times zero-bubble at pp = 1 a little slower
    than 1f1b, the representative:
    - pp = 1: the schedule makes no difference (one stage, no pipeline);
    - tp = 1: sequence parallelism makes no difference (nothing to split);
    - FlashAttention: selective recompute re-runs only the attention core, which fused
      attention never stores, so it equals no recompute;
    - dp = cp = 1 (and, with ``experts``, an expert data-parallel group of one: tp = ep * etp):
      ZeRO stages 0-2 shard nothing (stage 3 still holds gather buffers: it stays apart). ZeRO
      shards the dense states over dp * cp and the experts' over tp * cp * dp / (ep * etp)
      (simdist.analytic.variant_memory), so a plan with dp = 1 but cp > 1 or an expert group of
      several ranks does shard.
    """
    if cand.pp == 1 and cand.schedule in PLAIN_SCHEDULES:
        cand = cand._replace(schedule=next(s for s in PLAIN_SCHEDULES if s in c.schedules))
    if cand.tp == 1 and cand.sp:
        cand = cand._replace(sp=False)
    if flash_attention and cand.recompute == "selective" and "none" in c.recompute:
        cand = cand._replace(recompute="none")
    if cand.dp * cand.cp == 1 and cand.zero <= 2 and (not experts or cand.tp == cand.ep * cand.etp):
        cand = cand._replace(zero=min(z for z in c.zero_stages if z <= 2))
    return cand


def _layouts(model: ModelSpec, cluster: ClusterSpec, c: Constraints) -> Iterator[tuple[int, int, int, int]]:
    """(tp, cp, pp, world_left) for every layout of the grid."""
    world = cluster.world_size
    for tp in tp_grid(cluster, c):
        for cp in cp_grid(world // tp, c, model.seq_length):
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
    # selective recompute also re-runs MLA's up projections and the experts' activation (v1.2)
    flash_attention = flash_attention and not (model.is_moe or model.attention == "mla")
    for tp, cp, pp, left in _layouts(model, cluster, c):
        pipes = pipeline_grid(model, pp, c)
        dp = left // pp
        experts = expert_grid(model, tp * cp * dp, c)
        per_mbs = len(pipes) * knobs * len(experts)
        grid += c.max_micro_batch * per_mbs
        problem = layout_problem(model, tp, cp, pp, left)
        if problem:
            invalid[problem] += c.max_micro_batch * per_mbs
            continue
        for mbs in range(1, c.max_micro_batch + 1):
            if global_batch % (mbs * dp):
                invalid["global batch does not split into micro_batch_size*dp"] += per_mbs
                continue
            m = global_batch // (mbs * dp)
            for schedule, v in pipes:
                why = schedule_problem(schedule, pp, m, model.num_layers)
                if why:
                    invalid[why] += knobs * len(experts)
                    continue
                for ep, etp in experts:
                    _add_knobs(groups, Candidate(tp, pp, dp, cp, v, schedule, 0, False, "none", mbs, ep, etp),
                               flash_attention, c, model.is_moe)
    return Enumeration(groups, grid, invalid)


def _add_knobs(groups: dict[Candidate, Group], base: Candidate, flash: bool, c: Constraints,
               experts: bool) -> None:
    for zero in c.zero_stages:
        for sp in (False, True):
            for rc in c.recompute:
                cand = base._replace(zero=zero, sp=sp, recompute=rc)
                rep = canonical(cand, flash, c, experts)
                group = groups.get(rep)
                if group is None:
                    group = groups[rep] = Group()
                group.variants += 1
                if rep != cand:
                    group.equivalent.update(PLAN_FIELD[f] for f, a, b in zip(Candidate._fields, rep, cand,
                                                                             strict=True) if a != b)

