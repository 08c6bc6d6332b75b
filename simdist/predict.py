"""predict(scenario, profile=None) -> Prediction: the one entry point that the CLI, the
dashboard, the search and calibration all use.

Two guards stand around the engines (issue 20):

- work: the closed form loops over the pipeline stages, so a plan with more than
  :data:`MAX_VIRTUAL_STAGES` (pp x virtual stages) is refused; the event engine's work is
  estimated before anything is simulated (:mod:`simdist.sim.engine.budget`) and, past its
  limits, the closed form answers instead (said in the assumptions) or, with ``fallback=False``
  (a trace needs the engine's timeline), the scenario is refused naming the input that drives it;
- output: a prediction that is not finite and sane (step time > 0, MFU in (0, 1], finite
  memory, breakdown and extras) is an error naming the input behind it
  (:func:`check_prediction`), never an ``Infinity`` in the JSON.
"""

from __future__ import annotations

import math
from dataclasses import fields
from functools import partial
from typing import Any, Literal

from simdist.analytic.allocation_trace import (
    MAX_LAYER_PASSES,
    LazyStageGaps,
    layer_passes,
    replay_is_bounded,
)
from simdist.analytic.cache_residency import fetch_note, resident
from simdist.analytic.collectives import Network, busbw_cap
from simdist.analytic.compression import compression_ratio, keeps_residual
from simdist.analytic.cost import CostModel
from simdist.analytic.explain import step_lines
from simdist.analytic.flops import model_flops_per_step, recompute_flops_per_step
from simdist.analytic.memory import StageMemory
from simdist.analytic.memory_report import memory_assumption
from simdist.analytic.param_server import async_staleness_steps
from simdist.analytic.result import StepResult
from simdist.analytic.stage import StepDescription, describe
from simdist.analytic.timeshare import time_share_note, time_shared
from simdist.analytic.transport_wake import wake_note
from simdist.errors import Problem, ScenarioError
from simdist.results import Prediction, StageMemoryReport, to_gib
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario
from simdist.spec.suspects import suspect
from simdist.spec.unsimulated import not_simulated

Engine = Literal["des", "analytic"]
Fidelity = Literal["symmetric", "full"]
ENGINES = ("des", "analytic")
# pipeline stages x virtual stages that the closed form sizes one by one (memory per stage):
# about 40 us and 3 KB each, so the limit costs under a second; the largest pipelines trained
# have about a hundred stages
MAX_VIRTUAL_STAGES = 16_384


def predict(
    scenario: Scenario,
    profile: CalibrationProfile | None = None,
    engine: Engine = "des",
    fidelity: Fidelity = "symmetric",
    keep_spans: bool = True,
    stragglers: dict[int, float] | None = None,
    fallback: bool = True,
) -> Prediction:
    """Predict one optimizer step of ``scenario``: time, breakdown, memory, MFU.

    With ``engine="des"``, a scenario past the event engine's work limits is answered by the
    closed form (``engine`` in the result says which ran, the assumptions say why), or refused
    with ``fallback=False`` or stragglers (which only the event engine models)."""
    try:
        return _predict(scenario, profile, engine, fidelity, keep_spans, stragglers, fallback)
    except ArithmeticError as exc:  # an input extreme enough to break the arithmetic (or the engine's clock)
        field = suspect(scenario, profile, "any", "any")
        raise ScenarioError(Problem(field, f"makes the prediction impossible to compute "
                                    f"({type(exc).__name__}: {exc}); is it a realistic value?")) from None


def _predict(scenario: Scenario, profile: CalibrationProfile | None, engine: str, fidelity: str,
             keep_spans: bool, stragglers: dict[int, float] | None, fallback: bool) -> Prediction:
    if scenario.requires_profile and profile is None:
        raise ScenarioError(Problem("cluster.preset", "the local cluster's speed comes from a "
                                    "calibration profile: run `simdist calibrate` and pass --profile"))
    if engine not in ENGINES:
        raise ScenarioError(Problem("--engine", f"{engine!r} is not one of {', '.join(ENGINES)}"))
    unsimulated = scenario.kept("not_simulated", lambda sc: tuple(not_simulated(sc)))  # kept per scenario
    blocking = [Problem(n.field, f"cannot be predicted yet: {n.instead}") for n in unsimulated if n.blocking]
    if blocking:
        raise ScenarioError(blocking)
    plan, model, cluster = scenario.plan, scenario.model, scenario.cluster
    chunks = plan.pp * plan.virtual_pipeline_stages
    if chunks > MAX_VIRTUAL_STAGES:
        field = "plan.pp" if plan.pp > plan.virtual_pipeline_stages else "plan.virtual_pipeline_stages"
        raise ScenarioError(Problem(field, f"{plan.pp:,} stages x {plan.virtual_pipeline_stages:,} virtual "
                                    f"stages = {chunks:,} model chunks; simdist sizes at most "
                                    f"{MAX_VIRTUAL_STAGES:,} (see the input limits)"))
    # a CPU's GEMMs fetch their weights where its cache cannot hold them; ranks beyond its cores share them
    shared, slowed = time_shared(scenario, resident(scenario, profile))
    cost = CostModel(cluster.gpu, plan.precision, shared)
    described = describe(scenario, cost, Network.of(cluster, shared))
    assumptions = _assumptions(scenario, profile) + step_lines(described)
    fetched = fetch_note(scenario, profile)
    if fetched:
        assumptions.append(fetched)
    if slowed != 1.0 and profile is not None:
        assumptions.append(time_share_note(scenario, profile, slowed))
    if described.send is not None and described.send.wake_tick_s > 0:
        assumptions.append(wake_note(described.send.wake_tick_s))
    assumptions += [f"not simulated yet: {n.field} ({n.instead})" for n in unsimulated]

    result: StepResult
    if engine == "des":  # the event engine is imported only for it
        from simdist.sim.engine.budget import estimate_work
        from simdist.sim.engine.grouping import simulated_fidelity

        work = estimate_work(described, simulated_fidelity(described, fidelity, keep_spans, bool(stragglers)),
                             keep_spans, bool(stragglers))
        if not work.within_limits:
            if stragglers or not fallback:  # only the engine models stragglers (and draws a trace)
                instead = "" if stragglers else "; the closed form (`simdist predict --engine analytic`) answers it"
                raise ScenarioError(Problem(work.driver, f"too large for the event engine: {work.message()}{instead}"))
            engine = "analytic"
            assumptions.append(f"closed form used instead of the event engine ({work.driver} too large: "
                               f"{work.message()})")
    if engine == "analytic":
        from simdist.analytic.steptime import reduce_step  # here: the event engine does not need it

        result = reduce_step(described)
    else:
        from simdist.sim.engine import simulate

        result = simulate(described, fidelity=fidelity, keep_spans=keep_spans, stragglers=stragglers or {})
    step_time = result.step_time
    assumptions += result.assumptions

    flops = model_flops_per_step(model, plan)
    world = cluster.world_size
    peak = cost.peak
    stages = _memory_reports(scenario, described.memory)
    assumptions.append(memory_assumption(scenario, described.memory))
    host_capacity = None
    if cluster.host is not None:
        host_capacity = to_gib(cluster.host.cpu_memory_bytes) / cluster.gpus_per_node
    extras = _system_extras(described, stages, host_capacity, assumptions)
    for key, value in result.extras.items():  # what the engine measured (staleness, bottleneck link) wins
        if isinstance(value, dict) and isinstance(extras.get(key), dict):
            extras[key] = {**extras[key], **value}
        else:
            extras[key] = value
    tokens_per_s = plan.global_batch_size * model.seq_length / step_time
    if scenario.reliability is not None and math.isfinite(step_time) and step_time > 0:  # else refused below
        from simdist.reliability import goodput

        g = goodput(scenario, step_time, tokens_per_s)
        extras["goodput"] = g.to_dict()
    pred = Prediction(
        name=scenario.name,
        world_size=world,
        step_time_s=step_time,
        tokens_per_s=tokens_per_s,
        model_flops_per_step=flops,
        model_tflops_per_gpu=flops / step_time / world / 1e12,
        mfu=flops / (step_time * world * peak),
        bubble_fraction=result.bubble_fraction,
        breakdown_s=result.breakdown,
        per_stage=stages,
        capacity_gib=to_gib(cluster.gpu.memory_bytes),
        engine=engine,
        recompute_flops_per_step=recompute_flops_per_step(model, plan),
        assumptions=tuple(assumptions),
        spans=result.spans,
        profile=profile.device if profile else None,
        scenario_hash=scenario.hash(),
        host_capacity_gib=host_capacity,
        extras=extras,
    )
    check_prediction(pred, scenario, profile)
    return pred


def _memory_reports(sc: Scenario, memory: tuple[StageMemory, ...]) -> tuple[StageMemoryReport, ...]:
    """Each stage's memory for the report; the caching allocator's gap is replayed on first use."""
    gaps = LazyStageGaps(sc.model, sc.plan, sc.cluster)
    return tuple(
        StageMemoryReport(
            stage=s.stage, params_gib=to_gib(s.params), grads_gib=to_gib(s.grads),
            optimizer_gib=to_gib(s.optimizer), activations_gib=to_gib(s.activations),
            other_gib=to_gib(s.other), peak_gib=to_gib(s.peak), host_gib=to_gib(s.host),
            other_parts_gib=tuple((name, to_gib(v)) for name, v in s.other_parts),
            allocator_gap_gib=partial(gaps.gib, s.stage),
        )
        for s in memory
    )


def _system_extras(d: StepDescription, stages: tuple[StageMemoryReport, ...], host_capacity: float | None,
                   assumptions: list[str]) -> dict[str, Any]:
    """Offload and parameter-server figures for the JSON (Prediction.extras), and a plain
    sentence in the assumptions when the offloaded states overflow the host memory."""
    sc = d.scenario
    plan, cluster, model = sc.plan, sc.cluster, sc.model
    out: dict[str, Any] = {}
    host_peak = max(s.host_gib for s in stages)
    if plan.offload.any:
        tr = d.stages[0].offload
        nvme = max(s.nvme for s in d.memory)
        info: dict[str, Any] = {
            "optimizer": plan.offload.optimizer, "params": plan.offload.params,
            "host_gib_per_gpu": host_peak, "host_capacity_gib_per_gpu": host_capacity,
            "host_fits": host_capacity is None or host_peak <= host_capacity,
            "nvme_gib_per_node": to_gib(nvme) * min(cluster.gpus_per_node, cluster.world_size),
            "pcie_gib_per_step_per_gpu": to_gib(
                plan.num_microbatches * (tr.pcie_down_per_microbatch + tr.pcie_up_per_microbatch)
                + tr.pcie_down_per_step + tr.pcie_up_per_step),
            "cpu_optimizer_params_per_node": tr.cpu_params_node,
        }
        if cluster.host is None:
            assumptions.append("offload: the cluster has no host spec (cluster.host), so PCIe, NVMe and "
                               "the CPU optimizer are not timed")
        out["offload"] = info
    last_ps = d.stages[-1].ps
    if last_ps is not None:
        tr_ps = last_ps.traffic
        out["parameter_servers"] = {
            "servers": tr_ps.servers, "workers": tr_ps.workers,
            "gib_per_server_per_step": to_gib(tr_ps.per_server_bytes),
            "busiest_nic_gib_per_step": to_gib(tr_ps.node_nic_bytes),
            "mode": "async" if plan.async_parameter_servers else "sync",
        }
        if plan.async_parameter_servers:
            out["staleness_steps"] = async_staleness_steps(plan)
    if plan.grad_compression.enabled:
        out["grad_compression_ratio"] = compression_ratio(model, plan, 0)
    if host_capacity is not None and host_peak > host_capacity:
        assumptions.append(f"DOES NOT FIT in host memory: {host_peak:.0f} GiB of offloaded or server states "
                           f"per GPU exceed the {host_capacity:.0f} GiB host share per GPU "
                           f"({to_gib(cluster.host.cpu_memory_bytes):.0f} GiB per node / "  # type: ignore[union-attr]
                           f"{cluster.gpus_per_node} GPUs)")
    return out


def _assumptions(sc: Scenario, profile: CalibrationProfile | None) -> list[str]:
    plan, gpu = sc.plan, sc.cluster.gpu
    out = []
    if profile:
        out.append(f"efficiencies from calibration profile ({profile.device}, fitted from "
                   f"{len(profile.fitted_from)} measurements)")
        if profile.dp_step_wait_s and plan.dp > 1 and plan.zero_stage < 2 and not plan.uses_parameter_servers:
            out.append(f"a fixed {profile.dp_step_wait_s * 1e3:.2g} ms wait once a step at the gradient sync "
                       "(calibration profile: the ranks' per-step jitter)")
    else:
        eff = gpu.efficiency
        out.append(f"efficiency table: catalog defaults for {gpu.name} (large-GEMM {eff['gemm']:.0%}"
                   f" of peak, attention {eff['attention']:.0%}, HBM {eff['memory']:.0%}); "
                   "GEMM shape and message size lower them")
    out.append("attention: " + ("fused FlashAttention (causal)" if plan.flash_attention
                                else "explicit softmax attention (s^2 activations)"))
    if not plan.mixed_precision:
        out.append("fp32 training runs matmuls at the FP32 (non-tensor-core) peak")
    if plan.tp > sc.cluster.gpus_per_node:
        out.append(f"tp={plan.tp} spans nodes: TP collectives cross InfiniBand")
    if plan.sequence_parallel and plan.tp == 1:
        out.append("sequence_parallel has no effect with tp=1")
    if not replay_is_bounded(sc.model, plan):
        out.append(f"memory: the caching allocator's reserved gap is not replayed ({layer_passes(sc.model, plan):,} "
                   f"layer passes, more than {MAX_LAYER_PASSES:,}); reserved_gib equals peak_gib")
    out += _system_assumptions(sc, bool(profile and profile.select_rates))
    return out


def _system_assumptions(sc: Scenario, measured_select: bool = False) -> list[str]:
    """One line per mechanism beyond 3D parallelism the plan uses, saying how it is modelled
    (``measured_select``: the profile measured the device's top-k selection rate)."""
    plan, cluster = sc.plan, sc.cluster
    out = []
    if plan.hybrid_sharding and plan.shards_optimizer:
        where = "inside one node" if plan.dp_shard * plan.model_parallel_size <= cluster.gpus_per_node \
            else f"across {plan.dp_shard * plan.model_parallel_size // cluster.gpus_per_node} nodes"
        out.append(f"hybrid sharding: model states sharded over groups of {plan.dp_shard} DP ranks ({where}), "
                   f"replicated across {plan.dp // plan.dp_shard}; gradients reduce-scattered in the group, "
                   "then all-reduced across replicas")
    if cap := busbw_cap(plan):
        out.append(f"DeepSpeed ZeRO-3 (zero3_fetch: {plan.zero3_fetch}): data-parallel collectives at most "
                   f"{cap / 1e9:.0f} GB/s of bus bandwidth per GPU (per-submodule fetch bound by copies "
                   "and host waits, DeepSpeed #1174), whatever the links carry")
        if plan.zero3_fetch == "module_sync":
            out.append("DeepSpeed <= 0.4.0 ZeRO-3 fetch: the device synchronised at every submodule's fetch, "
                       "one submodule's weight in flight: each submodule takes max(its compute, the next gather)")
    if plan.zero_quantized_weights:
        out.append("ZeRO++ qwZ: parameter all-gathers in int8 with a block scale")
    if plan.offload.any:
        out.append(f"offload: optimizer on {plan.offload.optimizer}, parameters on {plan.offload.params}; "
                   "PCIe transfers overlap backward (gradients) and prefetch (parameters), the CPU step "
                   "and the parameter upload are pipelined and exposed")
    if plan.sync_parameter_servers:
        out.append("synchronous parameter servers on the training nodes: push/pull through the NICs, "
                   "servers apply the optimizer on the CPU; no intra-node pre-aggregation")
    elif plan.async_parameter_servers:
        out.append(f"asynchronous parameter servers: no barrier; mean staleness {max(0, plan.dp - 1)} updates")
    if plan.grad_compression.enabled and (plan.dp > 1 or plan.uses_parameter_servers):
        gc = plan.grad_compression
        detail = {"topk": f" (ratio {gc.ratio}, values + int32 indices all-gathered)",
                  "powersgd": f" (rank {gc.rank}, 1-D tensors uncompressed)"}.get(gc.method, "")
        out.append(f"gradient compression: {gc.method}{detail}"
                   + (", error feedback buffers on the GPU" if keeps_residual(plan) else "")
                   + "; compression kernels timed as HBM-bound work"
                   + ("; the top-k selection at the profile's measured rate per element"
                      if measured_select and gc.method == "topk" else ""))
    return out


# --- the output checks --------------------------------------------------------------------

_PARTS = {  # breakdown part -> the kind of inputs that time it
    "compute": "compute", "recompute": "compute", "optimizer": "compute", "compression": "compute",
    "tp_comm": "links", "pp_comm": "links", "dp_comm": "links", "cp_comm": "links", "ep_comm": "links",
    "bubble": "any", "offload": "host",
}


def check_prediction(pred: Prediction, sc: Scenario, profile: CalibrationProfile | None = None) -> None:
    """Raise ScenarioError naming the input behind the first absurd figure of ``pred``: a step
    time that is not finite and positive, an MFU outside (0, 1], a breakdown part, a memory
    figure or an extra that is not finite (or negative). The input is looked for among those
    that time the breakdown's largest (or broken) part (:mod:`simdist.spec.suspects`)."""
    step, mfu, parts = pred.step_time_s, pred.mfu, pred.breakdown_s
    broken = next((k for k, v in parts.items() if not _finite(v, nonneg=True)), None)
    largest = broken or max(parts, key=lambda k: parts[k] if math.isfinite(parts[k]) else math.inf, default="")
    kind = _PARTS.get(largest, "any")
    what, way = "", "slow"
    if not math.isfinite(step) or step <= 0:
        what, way = f"a step time of {step!r} s", "slow" if step > 0 else "any"
    elif broken is not None:
        what, way = f"breakdown {broken} = {parts[broken]!r} s", "any"
    elif not math.isfinite(mfu) or not 0 < mfu <= 1 + 1e-9:
        # above 1: faster than the GPUs' peak (an efficiency above 1); 0: a step too slow to count
        what = f"an MFU of {mfu:.3g} (model FLOPs / (step time x GPUs x peak))"
        kind, way = ("compute", "fast") if mfu > 1 else (kind, "slow")
    elif not all(_finite(getattr(s, f.name), nonneg=True) for s in pred.per_stage for f in fields(s)):
        what, kind, way = "a memory figure that is not a finite size", "any", "any"
    elif not math.isfinite(pred.tokens_per_s) or not _finite(pred.extras):
        path = _bad_path(pred.extras) or "tokens_per_s"
        what, kind, way = f"{path} is not a finite number", "reliability" if path.startswith("goodput") else "any", "any"
    if not what:
        return
    field = suspect(sc, profile, kind, way)
    raise ScenarioError(Problem(field, f"leads to an absurd prediction: {what}; is it a realistic value?"))


def _finite(x: Any, nonneg: bool = False) -> bool:
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return True
    if isinstance(x, int | float):
        return math.isfinite(x) and (not nonneg or x >= -1e-12)
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list | tuple):
        return all(_finite(v) for v in x)
    return True


def _bad_path(x: Any, where: str = "") -> str | None:
    """The dotted place of the first non-finite number in ``x``."""
    if isinstance(x, dict):
        for k, v in x.items():
            got = _bad_path(v, f"{where}.{k}" if where else str(k))
            if got:
                return got
    elif isinstance(x, list | tuple):
        for i, v in enumerate(x):
            got = _bad_path(v, f"{where}.{i}")
            if got:
                return got
    elif not _finite(x):
        return where or "value"
    return None
