"""Results: the Prediction users see, with its memory per stage and the engine's spans (plain
data; an engine's own result is :class:`simdist.analytic.result.StepResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simdist.analytic.result import BREAKDOWN_KEYS, Span
from simdist.units import GiB

__all__ = ["BREAKDOWN_KEYS", "Prediction", "Span", "StageMemoryReport", "to_gib"]


@dataclass(frozen=True, slots=True)
class StageMemoryReport:
    stage: int
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    other_gib: float
    peak_gib: float
    host_gib: float = 0.0


@dataclass(frozen=True)
class Prediction:
    name: str
    world_size: int
    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    breakdown_s: dict[str, float]
    per_stage: tuple[StageMemoryReport, ...]
    capacity_gib: float
    engine: str = "analytic"
    recompute_flops_per_step: float = 0.0
    assumptions: tuple[str, ...] = ()
    spans: tuple[Span, ...] = field(default=(), repr=False, compare=False)
    profile: str | None = None
    scenario_hash: str = ""
    host_capacity_gib: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. goodput, staleness

    @property
    def peak_gib(self) -> float:
        return max(s.peak_gib for s in self.per_stage)

    @property
    def host_peak_gib(self) -> float:
        return max(s.host_gib for s in self.per_stage)

    @property
    def fits(self) -> bool:
        fits = self.peak_gib <= self.capacity_gib
        if self.host_capacity_gib is not None and self.host_peak_gib > 0:
            fits = fits and self.host_peak_gib <= self.host_capacity_gib
        return fits

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of `simdist predict --json` (the output schema of the scenario-format
        reference), plus extensions."""
        out: dict[str, Any] = {
            "name": self.name,
            "world_size": self.world_size,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_step": self.model_flops_per_step,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "breakdown_s": dict(self.breakdown_s),
            "memory": {
                "peak_gib": self.peak_gib,
                "capacity_gib": self.capacity_gib,
                "fits": self.fits,
                "per_stage": [
                    {"stage": s.stage, "params_gib": s.params_gib, "grads_gib": s.grads_gib,
                     "optimizer_gib": s.optimizer_gib, "activations_gib": s.activations_gib,
                     "other_gib": s.other_gib, "peak_gib": s.peak_gib,
                     **({"host_gib": s.host_gib} if s.host_gib else {})}
                    for s in self.per_stage
                ],
            },
            "engine": self.engine,
            "recompute_flops_per_step": self.recompute_flops_per_step,
            "scenario_hash": self.scenario_hash,
            "profile": self.profile,
            "assumptions": list(self.assumptions),
        }
        if self.host_capacity_gib is not None and self.host_peak_gib > 0:
            out["memory"]["host_peak_gib"] = self.host_peak_gib
            out["memory"]["host_capacity_gib"] = self.host_capacity_gib
        out.update(self.extras)
        return out


def to_gib(n: float) -> float:
    return n / GiB
