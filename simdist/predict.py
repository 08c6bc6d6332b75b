"""predict(scenario, profile=None) -> Prediction: the one entry point that the CLI, the
dashboard, the search and calibration all use."""

from __future__ import annotations

from typing import Literal

from simdist.analytic.flops import model_flops_per_step, recompute_flops_per_step
from simdist.analytic.memory import memory_per_stage
from simdist.analytic.steptime import StepResult, analytic_step
from simdist.calibrate.profile import CalibrationProfile
from simdist.cost import CostModel
from simdist.errors import Problem, ScenarioError
from simdist.results import Prediction, Span, StageMemoryReport, to_gib
from simdist.sim.collectives import Network
from simdist.spec.scenario import Scenario

Engine = Literal["des", "analytic"]
Fidelity = Literal["symmetric", "full"]
ENGINES = ("des", "analytic")


def predict(
    scenario: Scenario,
    profile: CalibrationProfile | None = None,
    engine: Engine = "des",
    fidelity: Fidelity = "symmetric",
    keep_spans: bool = True,
    stragglers: dict[int, float] | None = None,
) -> Prediction:
    """Predict one optimizer step of ``scenario``: time, breakdown, memory, MFU."""
    if scenario.requires_profile and profile is None:
        raise ScenarioError(Problem("cluster.preset", "the local cluster's speed comes from a "
                                    "calibration profile: run `simdist calibrate` and pass --profile"))
    if engine not in ENGINES:
        raise ScenarioError(Problem("--engine", f"{engine!r} is not one of {', '.join(ENGINES)}"))
    plan, model, cluster = scenario.plan, scenario.model, scenario.cluster
    cost = CostModel(cluster.gpu, plan.precision, profile)
    net = Network.of(cluster, profile)
    assumptions = _assumptions(scenario, profile)

    spans: tuple[Span, ...] = ()
    if engine == "analytic":
        step: StepResult = analytic_step(scenario, cost, net)
        step_time, breakdown, bubble = step.step_time, step.breakdown, step.bubble_fraction
    else:
        from simdist.sim.engine import simulate  # simpy is imported only for this engine

        result = simulate(scenario, cost, net, fidelity=fidelity, keep_spans=keep_spans,
                          stragglers=stragglers or {})
        step_time, breakdown, bubble, spans = result.step_time, result.breakdown, result.bubble_fraction, result.spans
        assumptions += result.assumptions

    flops = model_flops_per_step(model, plan)
    world = cluster.world_size
    peak = cost.peak
    stages = tuple(
        StageMemoryReport(
            stage=s.stage, params_gib=to_gib(s.params), grads_gib=to_gib(s.grads),
            optimizer_gib=to_gib(s.optimizer), activations_gib=to_gib(s.activations),
            other_gib=to_gib(s.other), peak_gib=to_gib(s.peak), host_gib=to_gib(s.host),
        )
        for s in memory_per_stage(model, plan)
    )
    host_capacity = None
    if cluster.host is not None:
        host_capacity = to_gib(cluster.host.cpu_memory_bytes) / cluster.gpus_per_node
    return Prediction(
        name=scenario.name,
        world_size=world,
        step_time_s=step_time,
        tokens_per_s=plan.global_batch_size * model.seq_length / step_time,
        model_flops_per_step=flops,
        model_tflops_per_gpu=flops / step_time / world / 1e12,
        mfu=flops / (step_time * world * peak),
        bubble_fraction=bubble,
        breakdown_s=breakdown,
        per_stage=stages,
        capacity_gib=to_gib(cluster.gpu.memory_bytes),
        engine=engine,
        recompute_flops_per_step=recompute_flops_per_step(model, plan),
        assumptions=tuple(assumptions),
        spans=spans,
        profile=profile.device if profile else None,
        scenario_hash=scenario.hash(),
        host_capacity_gib=host_capacity,
    )


def _assumptions(sc: Scenario, profile: CalibrationProfile | None) -> list[str]:
    plan, gpu = sc.plan, sc.cluster.gpu
    out = []
    if profile:
        out.append(f"efficiencies from calibration profile ({profile.device}, fitted from "
                   f"{len(profile.fitted_from)} measurements)")
    else:
        eff = gpu.efficiency
        out.append(f"efficiency table: catalog defaults for {gpu.name} (large-GEMM {eff['gemm']:.0%}"
                   f" of peak, attention {eff['attention']:.0%}, HBM {eff['memory']:.0%}); "
                   "GEMM shape and message size lower them")
    out.append("attention: " + ("fused FlashAttention (causal)" if plan.flash_attention
                                else "explicit softmax attention (s^2 activations)"))
    if plan.precision == "fp32":
        out.append("fp32 training runs matmuls at the FP32 (non-tensor-core) peak")
    if plan.tp > sc.cluster.gpus_per_node:
        out.append(f"tp={plan.tp} spans nodes: TP collectives cross InfiniBand")
    if plan.sequence_parallel and plan.tp == 1:
        out.append("sequence_parallel has no effect with tp=1")
    return out
