"""Sizing and timing candidate plans: the memory model of one stage of each kind, the
closed-form step time, the discrete-event re-timing, and the process pool that shares the work.

The passes run in ``workers`` forked processes (Linux), with results in the same order as
serially, so a search gives the same answer with any number of workers.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from functools import cache
from itertools import chain
from operator import attrgetter
from typing import Any

from simdist.analytic.activations import activation_bytes
from simdist.analytic.cache_residency import fetches_weights
from simdist.analytic.collectives import CommContext, Network, grid
from simdist.analytic.cost import CostModel
from simdist.analytic.data_parallel import DataParallelTraffic
from simdist.analytic.flops import model_flops_per_step
from simdist.analytic.fsdp2 import runs_fsdp2
from simdist.analytic.memory import model_state_bytes, stage_memory
from simdist.analytic.runtime_memory import runtime_memory
from simdist.analytic.stage import ModelPasses, StepDescription, describe, model_passes, stage_sync
from simdist.analytic.steptime import reduce_step
from simdist.analytic.timeshare import time_shared
from simdist.analytic.transients import transient_parts
from simdist.errors import Problem
from simdist.results import Prediction
from simdist.search.bounds import step_lower_bound
from simdist.search.results import PlanResult
from simdist.search.space import Candidate, Constraints, Enumeration, candidate_of
from simdist.spec.cluster import ClusterSpec
from simdist.spec.consistency import own_problems
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan, unchecked_replace
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario, check_consistency
from simdist.spec.stages import parse_layout, stage_layer_ranges
from simdist.units import GiB

# The searched fields that the model states and the runtime buffers never read (the activations
# and their transients do): Evaluator.memory shares those between plans that differ only in them.
ACTIVATION_ONLY = ("micro_batch_size", "recompute", "sequence_parallel")
# the plan fields a search sets (Evaluator.plan); the others are the scenario's in every plan
SEARCHED = ("tp", "pp", "dp", "cp", "virtual_pipeline_stages", "schedule", "zero_stage", "dp_shard", "ep", "etp",
            *ACTIVATION_ONLY)
STATE_FIELDS = tuple(f for f in SEARCHED if f not in ACTIVATION_ONLY)
ACTIVATION_FIELDS = tuple(f for f in SEARCHED if f != "zero_stage")  # what activation_bytes reads
_state_of, _shape_of = attrgetter(*STATE_FIELDS), attrgetter(*ACTIVATION_FIELDS)

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as plans are timed ("analytic", then "des")."""


@cache
def distinct_stages(num_layers: int, pp: int, v: int, layout: str | None = None) -> tuple[int, ...]:
    """The first stage of each kind: stages that hold the same number of layers in each chunk,
    and are alike in holding the embedding (first) or the LM head (last), hold the same states
    and differ only in the micro-batches in flight, which never grow with the stage index
    (simdist.analytic.memory.in_flight), so the first of each kind has the largest peak."""
    ranges = stage_layer_ranges(num_layers, pp, v, layout)
    firsts: dict[tuple[bool, bool, tuple[int, ...]], int] = {}
    for s in range(pp):
        firsts.setdefault((s == 0, s == pp - 1, tuple(len(r) for r in ranges[s])), s)
    return tuple(firsts.values())


def _fixed_memory(m: ModelSpec, plan: ParallelPlan, stage: int, cluster: ClusterSpec
                  ) -> tuple[float, tuple[float, ...], float]:
    """What :func:`stage_memory` adds up of a stage's model states and runtime buffers: the states'
    GPU bytes (params + grads + optimizer, in its order), the runtime's parts (its non-zero ones,
    in order) and the host bytes."""
    st, rt = model_state_bytes(m, plan, stage, cluster), runtime_memory(plan, cluster)
    return (st["params"] + st["grads"] + st["optimizer"], tuple(v for v in rt.parts().values() if v),
            st["host_params"] + st["host_optimizer"])


def peak_memory(model: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None
                ) -> tuple[float, float]:
    """(GPU bytes, host bytes) at the peak over the pipeline stages: the same maximum as
    ``memory_per_stage`` (a test checks it), sizing one stage of each kind only."""
    kinds = distinct_stages(model.num_layers, plan.pp, plan.virtual_pipeline_stages, plan.pipeline_layout)
    stages = [stage_memory(model, plan, s, cluster) for s in kinds]
    return max(s.peak for s in stages), max(s.host for s in stages)


class Evaluator:
    """Times and sizes candidates of one scenario with one cost model and network."""

    def __init__(self, scenario: Scenario, profile: CalibrationProfile | None = None):
        self.scenario, self.profile = scenario, profile
        shared, _ = time_shared(scenario, profile)  # as predict() sees a CPU profile (the world is the scenario's)
        self.model, self.cluster = scenario.model, scenario.cluster
        self.base_plan = scenario.plan
        self.cost = CostModel(self.cluster.gpu, self.base_plan.precision, shared)
        # each plan's GEMMs fetch their weights or find them in the cache by its own working set (a
        # CPU profile's, simdist.analytic.cache_residency), as predict() decides
        self.cached_cost = (CostModel(self.cluster.gpu, self.base_plan.precision, replace(shared, weight_fetch_s=[]))
                            if shared is not None and shared.weight_fetch_s else self.cost)
        self.net = Network.of(self.cluster, shared)
        self.capacity = self.cluster.gpu.memory_bytes
        self._own = own_problems(self.model, self.cluster)
        self._fixed: dict[tuple[object, ...], tuple[float, tuple[float, ...], float]] = {}
        self._passes: dict[tuple[object, ...], ModelPasses] = {}
        self._act: dict[tuple[object, ...], float] = {}
        self._sync: dict[tuple[object, ...], tuple[DataParallelTraffic, float]] = {}
        self.host_capacity = (self.cluster.host.cpu_memory_bytes / self.cluster.gpus_per_node
                              if self.cluster.host is not None else None)

    def plan(self, cand: Candidate) -> ParallelPlan:
        """The scenario's plan with the searched fields of ``cand`` (ZeRO shards over all of dp).
        The fields are not checked one by one again (the enumeration makes only values of the
        right type and range: tests/test_search.py checks a sample against the checked build);
        the cross-field rules are, by :meth:`problems`."""
        layout = self.base_plan.pipeline_layout
        if layout is not None and (cand.schedule in ("dualpipe", "dualpipev")
                                   or cand.pp * cand.v != len(parse_layout(layout))):
            layout = None  # the scenario's layout is for its own pipeline depth: others split evenly
        return unchecked_replace(self.base_plan, tp=cand.tp, pp=cand.pp, dp=cand.dp, cp=cand.cp,
                                 virtual_pipeline_stages=cand.v, schedule=cand.schedule, zero_stage=cand.zero,
                                 sequence_parallel=cand.sp, recompute=cand.recompute,
                                 micro_batch_size=cand.mbs, dp_shard=cand.dp, ep=cand.ep, etp=cand.etp,
                                 pipeline_layout=layout)

    def problems(self, plan: ParallelPlan) -> list[Problem]:
        """check_consistency's problems, the model's and the cluster's own checked once."""
        return check_consistency(self.model, self.cluster, plan, own=self._own)

    def memory(self, plan: ParallelPlan) -> tuple[float, float]:
        """(peak GPU bytes, peak host bytes) over the pipeline stages: the same as
        :func:`peak_memory`, with the model states and runtime buffers of each stage kind shared
        by the plans that differ only in what the activations depend on (:data:`ACTIVATION_ONLY`;
        the other fields of every plan are the scenario's), and the activations by those that
        differ only in the ZeRO stage (:data:`ACTIVATION_FIELDS`; ZeRO-3's FP8 weight gathers
        change what an FP8 forward saves, simdist.analytic.fp8_memory)."""
        m, cluster = self.model, self.cluster
        layout = (*_state_of(plan), plan.pipeline_layout)
        shape = (*_shape_of(plan), plan.shards_params, plan.pipeline_layout)
        peak = host = 0.0
        for s in distinct_stages(m.num_layers, plan.pp, plan.virtual_pipeline_stages, plan.pipeline_layout):
            fixed = self._fixed.get((layout, s))
            if fixed is None:
                if len(self._fixed) >= 65536:
                    self._fixed.clear()
                fixed = self._fixed[(layout, s)] = _fixed_memory(m, plan, s, cluster)
            act = self._act.get((shape, s))
            if act is None:
                if len(self._act) >= 65536:
                    self._act.clear()
                act = self._act[(shape, s)] = activation_bytes(m, plan, s)
            states, runtime, stage_host = fixed
            parts, step_peak = transient_parts(m, plan, s, act)
            # stage_memory's peak, added in its order: the states, the activations, then the
            # transient parts and the runtime's in one sum
            stage_peak = (states + (0.0 if step_peak else act)) + sum(chain((v for _, v in parts), runtime))
            peak, host = max(peak, stage_peak), max(host, stage_host)
        return peak, host

    def fits(self, peak: float, host: float, headroom: float = 0.0) -> bool:
        ok = peak <= self.capacity * (1 - headroom)
        if host > 0 and self.host_capacity is not None:
            ok = ok and host <= self.host_capacity
        return ok

    def analytic_time(self, plan: ParallelPlan) -> float:
        """The closed-form step time (:meth:`describe` reduced)."""
        return reduce_step(self.describe(plan)).step_time

    def describe(self, plan: ParallelPlan) -> StepDescription:
        """The plan's step described for the closed form, with the layer, embedding and LM-head
        passes shared by the plans that differ only in the schedule, the virtual stages and the ZeRO stage
        (:meth:`passes_key`), and each stage's data-parallel traffic and optimizer step by those
        that differ only in the micro-batch's shape (simdist.analytic.stage.stage_sync reads the
        rank grid, the ZeRO stage, recompute's re-gathers and the stage's layers)."""
        sc = replace(self.scenario, plan=plan)
        cost = self.cost_of(sc)
        key = (*self.passes_key(plan), cost is self.cached_cost)
        mp = self._passes.get(key)
        if mp is None:
            if len(self._passes) >= 65536:
                self._passes.clear()
            mp = self._passes[key] = model_passes(sc, cost, self.net)
        sync_key = (plan.zero_stage, *self.sync_reads(plan), plan.virtual_pipeline_stages, *grid(plan))

        def sync_of(ctx: CommContext, stage: int) -> tuple[DataParallelTraffic, float]:
            got = self._sync.get((sync_key, stage))
            if got is None:
                if len(self._sync) >= 65536:
                    self._sync.clear()
                got = self._sync[(sync_key, stage)] = stage_sync(sc, ctx, cost, stage)
            return got

        return describe(sc, cost, self.net, passes_of=mp, sync_of=sync_of)

    def cost_of(self, scenario: Scenario) -> CostModel:
        """The cost model of one candidate: without the weights' fetch where its ranks' working
        sets fit the cache (the fetch prices GEMMs only, not a stage's sync or optimizer step)."""
        if self.cached_cost is self.cost or fetches_weights(scenario, self.profile):
            return self.cost
        return self.cached_cost

    def sync_reads(self, plan: ParallelPlan) -> tuple[object, ...]:
        """What a stage's data-parallel traffic and optimizer step read of the recompute and the
        schedule: whether full recompute gathers ZeRO-3's parameters a third time
        (data_parallel.param_gathers_per_microbatch), and the stage's chunks, which one-chunk and
        interleaved schedules lay out alike (simdist.spec.stages.stage_chunks: DualPipe apart).
        A calibration profile's per-tensor optimizer terms read both in full (profile_layers)."""
        if self.cost.profile is not None:
            return plan.recompute, plan.schedule
        return plan.recompute == "full", plan.schedule if plan.dualpipe else ""

    def lower_bound(self, plan: ParallelPlan) -> float:
        """A lower bound on ``plan``'s step time in either engine (simdist.search.bounds)."""
        return step_lower_bound(self.describe(plan))

    def passes_key(self, plan: ParallelPlan) -> tuple[object, ...]:
        """What the passes read of a plan the search builds (the other fields are the
        scenario's): the layer shapes, the TP/CP/EP groups on the rank grid (and their fabric
        slow-downs), and whether a DualPipe schedule hides the expert all-to-all. A calibration
        profile's per-layer terms follow the software layers, which read the schedule, the
        chunks and the ZeRO stage too (simdist.spec.software_layers.profile_layers): with one, nothing
        is shared."""
        key = (plan.micro_batch_size, plan.sequence_parallel, plan.recompute, plan.dualpipe, *grid(plan))
        if self.cost.profile is not None:
            key += (plan.schedule, plan.virtual_pipeline_stages, plan.zero_stage)
        else:  # FSDP2's copies join the passes of the plans that run it (simdist.analytic.fsdp2)
            key += (runs_fsdp2(plan, None),)
        return key

    def des(self, plan: ParallelPlan) -> Prediction:
        from simdist.predict import predict

        # past the event engine's work limits: an error (des_time notes it), not the closed form again
        return predict(replace(self.scenario, plan=plan), self.profile, engine="des", keep_spans=False,
                       fallback=False)

    def mfu(self, plan: ParallelPlan, step_time: float) -> float:
        flops = model_flops_per_step(self.model, plan)
        return flops / (step_time * self.cluster.world_size * self.cost.peak)



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



# --- the closed-form pass -----------------------------------------------------------------


_CHUNK = 128  # plans per task of the closed-form pass


def evaluate_all(runner: Runner, enum: Enumeration, c: Constraints,
                  progress: Progress | None) -> list[PlanResult]:
    """Memory for every representative, the closed-form step time for those that fit."""
    items = [(cand, g.variants, tuple(sorted(g.equivalent))) for cand, g in enum.groups.items()]
    chunks = [(items[i:i + _CHUNK], c.memory_headroom) for i in range(0, len(items), _CHUNK)]
    out: list[PlanResult] = []
    collecting = gc.isenabled()
    gc.disable()  # as in _evaluate_chunk, for the whole pass: a collection between chunks walks every memo
    try:
        _collect(runner, chunks, enum, out, progress, len(items))
    finally:
        if collecting:
            gc.enable()
    return out


def _collect(runner: Runner, chunks: list[Any], enum: Enumeration, out: list[PlanResult],
             progress: Progress | None, total: int) -> None:
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
            progress("analytic", done, total)


def _evaluate_chunk(ev: Evaluator, task: tuple[list[tuple[Candidate, int, tuple[str, ...]]], float]
                    ) -> list[PlanResult | tuple[Candidate, str]]:
    chunk, headroom = task
    collecting = gc.isenabled()
    gc.disable()  # the pass builds ~10^5 small objects, none in a cycle: no collection is due
    try:
        return [_evaluate(ev, cand, variants, equivalent, headroom) for cand, variants, equivalent in chunk]
    finally:
        if collecting:
            gc.enable()


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


def des_time(ev: Evaluator, plan: ParallelPlan) -> tuple[float | None, str]:
    """The discrete-event step time of ``plan``, or None and why it failed. The cyclic garbage
    collector waits until the run ends (its collections walked every live event again and again:
    a tenth of the 530B space's re-rank); what the run leaves in cycles is collected then."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return ev.des(plan).step_time_s, ""
    except Exception as exc:  # one failing plan must not lose the whole search
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        if collecting:
            gc.enable()


def des_cost(plan: ParallelPlan) -> int:
    """Rough relative cost of simulating ``plan``: the events grow with the pipeline's tasks."""
    return plan.num_microbatches * plan.pp * plan.virtual_pipeline_stages


def baseline(ev: Evaluator, c: Constraints) -> PlanResult:
    """The scenario's own plan, sized and timed by the closed form (the DES re-times it with
    the top plans)."""
    plan = ev.base_plan
    peak, host = ev.memory(plan)
    t = ev.analytic_time(plan)
    return PlanResult(candidate=candidate_of(plan), global_batch_size=plan.global_batch_size,
                      precision=plan.precision, peak_gib=peak / GiB, capacity_gib=ev.capacity / GiB,
                      fits=ev.fits(peak, host), feasible=ev.fits(peak, host, c.memory_headroom),
                      analytic_step_time_s=t, mfu=ev.mfu(plan, t), status="ranked")
